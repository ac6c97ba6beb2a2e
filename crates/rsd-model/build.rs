//! Links libtorch for rsd-model's tests (see rsd-build), and compiles
//! `csrc/merged_attention.cpp`, the attention primitive's autograd function (`src/attention.rs`),
//! with `csrc/phase_clock.cpp`, the timed phases of a step (`src/phases.rs`), and the allocator
//! counters of `src/alloc.rs` (`csrc/cpu_alloc.cpp`, `csrc/device_alloc.cpp`).
fn main() {
    let lib = rsd_build::link_libtorch();
    println!("cargo:rerun-if-changed=csrc/phase_clock.h");
    rsd_build::torch_cpp(&lib, &["csrc/merged_attention.cpp", "csrc/phase_clock.cpp"])
        .compile("rsd_attention_shim");
    rsd_build::torch_cpp(&lib, &["csrc/cpu_alloc.cpp"]).compile("rsd_cpu_alloc");
    rsd_build::torch_cpp(&lib, &["csrc/device_alloc.cpp"]).compile("rsd_device_alloc");
}

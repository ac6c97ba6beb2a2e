//! Links libtorch for rsd-model's tests (see rsd-build), and compiles
//! `csrc/merged_attention.cpp`, the attention primitive's autograd function (`src/attention.rs`),
//! and the allocator counters of `src/alloc.rs` (`csrc/cpu_alloc.cpp`, `csrc/device_alloc.cpp`).
fn main() {
    let lib = rsd_build::link_libtorch();
    rsd_build::torch_cpp(&lib, &["csrc/merged_attention.cpp"]).compile("rsd_attention_shim");
    rsd_build::torch_cpp(&lib, &["csrc/cpu_alloc.cpp"]).compile("rsd_cpu_alloc");
    rsd_build::torch_cpp(&lib, &["csrc/device_alloc.cpp"]).compile("rsd_device_alloc");
}

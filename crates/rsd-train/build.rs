//! Links libtorch for rsd-train's binary, tests and benches (see rsd-build), and compiles its C++
//! shims: `csrc/free_grad.cpp`, which undefines a parameter's gradient (`src/sharded.rs`), and
//! `csrc/fused_adamw.cpp`, libtorch's fused AdamW kernel over lists of tensors (`src/optim.rs`).
fn main() {
    let lib = rsd_build::link_libtorch();
    rsd_build::torch_cpp(&lib, &["csrc/free_grad.cpp", "csrc/fused_adamw.cpp"])
        .compile("rsd_train_shim");
}

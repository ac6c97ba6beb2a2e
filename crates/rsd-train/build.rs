//! Links libtorch for rsd-train's binary, tests and benches (see rsd-build), and compiles
//! `csrc/free_grad.cpp`, which undefines a parameter's gradient (`src/sharded.rs`).
fn main() {
    let lib = rsd_build::link_libtorch();
    rsd_build::torch_cpp(&lib, &["csrc/free_grad.cpp"]).compile("rsd_train_shim");
}

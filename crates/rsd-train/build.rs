//! Link settings every rsd-train binary, test and bench needs (same as rsd-model's build.rs).
//!
//! torch-sys finds libtorch (here: the PyPI wheel in the project venv) and tells us where its
//! libraries are through `DEP_TCH_LIBTORCH_LIB`. Two things are still missing for a binary that
//! runs anywhere:
//! 1. an rpath to that directory, or the loader cannot find `libtorch_cpu.so` at run time;
//! 2. `libtorch_cuda.so` as a NEEDED entry. Nothing in our code references a symbol from it, so with
//!    the default `--as-needed` the linker drops it and CUDA silently reports no device. We link it
//!    explicitly between `--no-as-needed` / `--as-needed`.
//!
//! `rustc-link-arg` applies only to this package's targets; crates that build their own binaries on
//! top of rsd-model (rsd-train, rsd-eval) need the same few lines (see docs/MODEL.md).
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB") else {
        println!("cargo:warning=DEP_TCH_LIBTORCH_LIB not set; binaries get no rpath to libtorch");
        return;
    };
    let lib = PathBuf::from(lib);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // Exported for the readelf test, which checks the NEEDED list only when the library exists.
    println!("cargo:rustc-env=RSD_LIBTORCH_LIB={}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-L{}", lib.display());
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}

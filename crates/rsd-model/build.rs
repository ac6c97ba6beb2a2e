//! Link settings every rsd-model binary, test and bench needs.
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
//!
//! It also compiles `csrc/merged_attention.cpp` (the attention primitive's autograd function, see
//! `src/attention.rs`) against the same libtorch headers, with the C++ standard and ABI libtorch
//! was built with (C++20; `_GLIBCXX_USE_CXX11_ABI` from `LIBTORCH_CXX11_ABI`, default 1 as in
//! torch-sys and every PyPI wheel since torch 2.7).
use std::path::{Path, PathBuf};

fn compile_shim(lib: &Path) {
    println!("cargo:rerun-if-changed=csrc/merged_attention.cpp");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    let include = lib.join("..").join("include");
    cc::Build::new()
        .cpp(true)
        .file("csrc/merged_attention.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .std("c++20")
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .opt_level(2)
        .warnings(false)
        .compile("rsd_attention_shim");
}

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB") else {
        panic!(
            "DEP_TCH_LIBTORCH_LIB is not set: torch-sys did not find libtorch. Run scripts/setup.sh \
             and `source .rsd-env` (LIBTORCH_USE_PYTORCH=1 with the project venv on PATH)."
        );
    };
    let lib = PathBuf::from(lib);
    compile_shim(&lib);
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

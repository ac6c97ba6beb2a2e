//! What every build script of a crate that links libtorch (rsd-model, rsd-train, rsd-dist,
//! rsd-eval) does, written once.
//!
//! torch-sys finds libtorch (here: the PyPI wheel in the project venv) and tells the build scripts
//! of crates that depend on it directly where its libraries are, through `DEP_TCH_LIBTORCH_LIB`.
//! Two things are still missing for a binary that runs anywhere:
//! 1. an rpath to that directory, or the dynamic loader cannot find `libtorch_cpu.so` at run time;
//! 2. `libtorch_cuda.so` as a NEEDED entry. Nothing in our code references a symbol from it, so
//!    with the default `--as-needed` the linker drops it and CUDA silently reports no device. We
//!    link it explicitly between `--no-as-needed` / `--as-needed`.
//!
//! `rustc-link-arg` applies only to the package whose build script prints it, so each such crate
//! calls [`link_libtorch`] from its own `build.rs` (and depends on `torch-sys` directly, which is
//! what makes cargo pass it `DEP_TCH_LIBTORCH_LIB`).

use std::path::{Path, PathBuf};

/// Emits the link arguments above for this package's binaries, tests and benches, and returns the
/// libtorch library directory. Stops the build with instructions when torch-sys found no libtorch:
/// a binary without the rpath would build and then fail at start-up, far from the cause.
pub fn link_libtorch() -> PathBuf {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB") else {
        panic!(
            "DEP_TCH_LIBTORCH_LIB is not set: torch-sys did not find libtorch (or this crate does \
             not depend on torch-sys directly). Run scripts/setup.sh and `source .rsd-env` \
             (LIBTORCH_USE_PYTORCH=1 with the project venv's python on PATH)."
        );
    };
    let lib = PathBuf::from(lib);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // Exported for the readelf tests, which check the NEEDED list only when the library exists.
    println!("cargo:rustc-env=RSD_LIBTORCH_LIB={}", lib.display());
    if has_cuda(&lib) {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-L{}", lib.display());
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
    lib
}

/// Whether this libtorch is a CUDA build (the PyPI wheel is, and still runs on CPU).
pub fn has_cuda(lib: &Path) -> bool {
    lib.join("libtorch_cuda.so").exists()
}

/// A `cc` build for C++ sources that use libtorch's C++ API: its headers, the C++ standard and the
/// ABI libtorch was built with (C++20; `_GLIBCXX_USE_CXX11_ABI` from `LIBTORCH_CXX11_ABI`, default
/// 1 as in torch-sys and every PyPI wheel since torch 2.7). Add files, defines and includes, then
/// `compile`. Each listed source is registered for `rerun-if-changed`.
pub fn torch_cpp(lib: &Path, sources: &[&str]) -> cc::Build {
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    let include = lib.join("..").join("include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .std("c++20")
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .opt_level(2)
        // libtorch's headers are heavy templates: debug info for them costs minutes of compile
        // time per shim and is never read (the Rust side keeps its own).
        .debug(false)
        .warnings(false);
    for source in sources {
        println!("cargo:rerun-if-changed={source}");
        build.file(source);
    }
    build
}

//! Links libtorch (see rsd-build) and compiles the c10d shim: `csrc/dist.cpp` (stores, Gloo,
//! collectives, autograd functions) and, with the `nccl` feature, `csrc/nccl.cpp`.
//!
//! The torch wheel ships c10d's headers but not gloo's, which ProcessGroupGloo.hpp includes; they
//! come from Debian's `libgloo-dev` (headers only: the symbols are in libtorch_cpu, so never link
//! `-lgloo`). `RSD_GLOO_INCLUDE` overrides where they are looked for. The NCCL build needs the
//! CUDA runtime, NCCL, crt and cccl headers of the wheel's `nvidia` packages (`RSD_CUDA_INCLUDE`,
//! a `:`-separated list, overrides them).
use std::path::{Path, PathBuf};

fn main() {
    let lib = rsd_build::link_libtorch();
    println!("cargo:rerun-if-changed=csrc/shim.h");
    println!("cargo:rerun-if-env-changed=RSD_GLOO_INCLUDE");
    let gloo = std::env::var_os("RSD_GLOO_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/include"));
    if !gloo.join("gloo/config.h").exists() {
        panic!(
            "gloo headers not found under {}: install Debian's libgloo-dev (scripts/setup.sh does) \
             or set RSD_GLOO_INCLUDE to the directory holding gloo/",
            gloo.display()
        );
    }
    let mut sources = vec!["csrc/dist.cpp"];
    let nccl = std::env::var_os("CARGO_FEATURE_NCCL").is_some();
    if nccl {
        sources.push("csrc/nccl.cpp");
    }
    let mut build = rsd_build::torch_cpp(&lib, &sources);
    build.define("USE_C10D_GLOO", None).include(&gloo);
    if nccl {
        build
            .define("USE_C10D_NCCL", None)
            .flag_if_supported("-Wno-interference-size");
        for dir in cuda_includes(&lib) {
            build.include(dir);
        }
        // ProcessGroupNCCL lives in libtorch_cuda (linked by rsd-build), set_device in c10_cuda.
        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    build.compile("rsd_dist_shim");
}

/// The wheel's CUDA header directories: `site-packages/nvidia/{cu13,nccl}/include` and cccl's.
fn cuda_includes(lib: &Path) -> Vec<PathBuf> {
    println!("cargo:rerun-if-env-changed=RSD_CUDA_INCLUDE");
    if let Some(dirs) = std::env::var_os("RSD_CUDA_INCLUDE") {
        return std::env::split_paths(&dirs).collect();
    }
    let nvidia = lib.join("../../nvidia");
    let dirs = vec![
        nvidia.join("cu13/include"),
        nvidia.join("cu13/include/cccl"),
        nvidia.join("nccl/include"),
    ];
    if !dirs[0].join("crt/host_config.h").exists() || !dirs[1].exists() {
        panic!(
            "the nccl feature needs the CUDA crt and cccl headers in {}: \
             pip install -c <(echo torch==2.13.0) 'nvidia-cuda-crt==13.0.*' 'nvidia-cuda-cccl==13.0.*' \
             into the project venv, or set RSD_CUDA_INCLUDE",
            dirs[0].display()
        );
    }
    dirs
}

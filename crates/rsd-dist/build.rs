//! Links libtorch (see rsd-build) and compiles the c10d shim: `csrc/dist.cpp` (stores, Gloo,
//! collectives, autograd functions) and, with the `nccl` feature, `csrc/nccl.cpp`.
//!
//! The torch wheel ships c10d's headers but not gloo's, which ProcessGroupGloo.hpp includes; they
//! come from Debian's `libgloo-dev` (headers only: the symbols are in libtorch_cpu, so never link
//! `-lgloo`). `RSD_GLOO_INCLUDE` overrides where they are looked for. The NCCL build needs the
//! CUDA runtime, NCCL, crt and cccl headers of the wheel's `nvidia` packages (`RSD_CUDA_INCLUDE`,
//! a `:`-separated list, overrides them).
//!
//! ProcessGroupNCCL's options embed NCCL's `ncclConfig_t`, whose size changes between NCCL
//! releases, and parts of that class are compiled into this crate from the headers. Headers of
//! another NCCL than the one torch was built with give a layout torch does not share (seen: a
//! crash in ProcessGroupNCCL's destructor), so the build refuses an `nccl.h` whose version is not
//! the `nvidia-nccl` release torch's wheel pins; `csrc/nccl.cpp` checks the same at run time
//! against the NCCL torch reports.
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
        let includes = cuda_includes(&lib);
        check_nccl_headers(&lib, &includes);
        for dir in includes {
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

/// Stops the build when the `nccl.h` found in `includes` is not the NCCL release torch's wheel
/// pins (`Requires-Dist: nvidia-nccl-…==X.Y.Z` in its METADATA). Says nothing where either is
/// unknown (a libtorch not installed from a wheel): the run-time check still applies.
fn check_nccl_headers(lib: &Path, includes: &[PathBuf]) {
    let Some(header) = includes
        .iter()
        .map(|d| d.join("nccl.h"))
        .find(|h| h.exists())
    else {
        return;
    };
    println!("cargo:rerun-if-changed={}", header.display());
    let text = std::fs::read_to_string(&header).unwrap_or_default();
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l
                .trim()
                .strip_prefix("#define ")?
                .trim()
                .strip_prefix(name)?;
            rest.trim().parse::<u32>().ok()
        })
    };
    let (Some(major), Some(minor), Some(patch)) = (
        field("NCCL_MAJOR"),
        field("NCCL_MINOR"),
        field("NCCL_PATCH"),
    ) else {
        return;
    };
    let headers = format!("{major}.{minor}.{patch}");
    let Some(pinned) = torch_nccl_pin(lib) else {
        return;
    };
    if pinned != headers {
        panic!(
            "{} is NCCL {headers}, torch was built with NCCL {pinned} (its wheel pins \
             nvidia-nccl=={pinned}): ProcessGroupNCCL's layout would differ between rsd and torch. \
             Install the matching headers (pip install 'nvidia-nccl-cu13=={pinned}' into the venv \
             torch is in) or point RSD_CUDA_INCLUDE at them.",
            header.display()
        );
    }
}

/// The `nvidia-nccl-*` version torch's wheel requires, from the METADATA of the `torch-*.dist-info`
/// beside the `torch` package that holds `lib`.
fn torch_nccl_pin(lib: &Path) -> Option<String> {
    let site = lib.parent()?.parent()?;
    let dist = std::fs::read_dir(site).ok()?.flatten().find(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with("torch-") && name.ends_with(".dist-info")
    })?;
    let meta = dist.path().join("METADATA");
    println!("cargo:rerun-if-changed={}", meta.display());
    let text = std::fs::read_to_string(meta).ok()?;
    text.lines().find_map(|l| {
        let req = l.strip_prefix("Requires-Dist: nvidia-nccl-")?;
        let version = req.split("==").nth(1)?;
        Some(version.split([';', ' ']).next()?.trim().to_string())
    })
}

//! The NVIDIA driver against the CUDA runtime of the torch build, checked before the first step.
//!
//! A driver older than the CUDA runtime torch was built with (PyPI's default torch 2.13 wheel is
//! built for CUDA 13) shows up as a CUDA error deep inside the first step. CUDA's rules
//! (NVIDIA's "CUDA Compatibility" guide):
//!
//! - a driver runs every CUDA runtime of its own major version or older (backward compatibility);
//! - a runtime of the same major version but a newer minor one also runs, with a limited feature
//!   set (minor-version compatibility, since CUDA 11): a call that needs the newer driver fails
//!   with `cudaErrorCallRequiresNewerDriver`, and PTX the newer toolkit produced cannot be
//!   JIT-compiled by the older driver (`cudaErrorUnsupportedPtxVersion`), which matters for a
//!   GPU the build carries no machine code for;
//! - a runtime of a newer major version does not run at all, unless the data-centre
//!   forward-compatibility package (`cuda-compat`) supplies a newer `libcuda`, and then that
//!   library reports the newer version itself.
//!
//! So [`check`] reads what `libcuda.so.1` reports (`cuDriverGetVersion`) and what the loaded
//! CUDA runtime reports (`cudaRuntimeGetVersion`), and [`compare`] refuses an older major
//! version and warns about an older minor one.
use std::ffi::{c_int, c_void, CStr};
use std::path::{Path, PathBuf};

use tch::Device;

use crate::{Error, Result};

/// The torch builds of torch 2.13 on download.pytorch.org (`/whl/<tag>`) and the CUDA runtime
/// each carries, newest first. PyPI's default wheel is the CUDA 13 one.
const TORCH_BUILDS: [(&str, CudaVersion); 3] = [
    ("cu130", CudaVersion::new(13, 0)),
    ("cu128", CudaVersion::new(12, 8)),
    ("cu126", CudaVersion::new(12, 6)),
];

/// Where docs/GPU.md explains the choice.
const SEE: &str = "docs/GPU.md, \"The NVIDIA driver and the torch build\"";

/// A CUDA version as the driver and runtime APIs report it (`12020` is 12.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    /// 12 in 12.2.
    pub major: u32,
    /// 2 in 12.2.
    pub minor: u32,
}

impl CudaVersion {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        CudaVersion { major, minor }
    }

    /// The API's integer, `1000 · major + 10 · minor` (`12020` → 12.2); `None` unless positive.
    pub fn from_api(v: c_int) -> Option<Self> {
        let v = u32::try_from(v).ok().filter(|&v| v > 0)?;
        Some(CudaVersion::new(v / 1000, (v % 1000) / 10))
    }
}

impl std::fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The command that installs torch 2.13 for CUDA `tag` (`cu126`) into the project's venv.
fn setup_command(tag: &str) -> String {
    format!("RSD_TORCH_INDEX_URL=https://download.pytorch.org/whl/{tag} scripts/setup.sh")
}

/// The oldest Linux driver branch of a CUDA major version (CUDA's release notes).
fn min_driver(major: u32) -> Option<u32> {
    match major {
        11 => Some(450),
        12 => Some(525),
        13 => Some(580),
        _ => None,
    }
}

/// "upgrade the NVIDIA driver (CUDA 13 needs driver 580 or newer)": for a major version the
/// driver lacks.
fn upgrade(runtime: CudaVersion) -> String {
    match min_driver(runtime.major) {
        Some(branch) => format!(
            "upgrade the NVIDIA driver (CUDA {} needs driver {branch} or newer)",
            runtime.major
        ),
        None => format!("upgrade the NVIDIA driver to one for CUDA {runtime}"),
    }
}

/// The newest torch build whose CUDA runtime this driver runs in full (same major, minor not
/// newer); else, for a driver of a major version some build has, that major's oldest build,
/// which it runs through minor-version compatibility.
fn build_for(driver: CudaVersion) -> Option<(&'static str, CudaVersion)> {
    TORCH_BUILDS
        .iter()
        .find(|(_, v)| v.major == driver.major && v.minor <= driver.minor)
        .or_else(|| {
            TORCH_BUILDS
                .iter()
                .rev()
                .find(|(_, v)| v.major == driver.major)
        })
        .copied()
}

/// Whether a driver reporting CUDA `driver` can run a CUDA `runtime`: an error naming both and
/// the fix when the driver's major version is older; a warning (`Some`) when only its minor
/// version is (minor-version compatibility runs it, with the limits in the module's
/// documentation); `None` when the driver is as new or newer.
pub fn compare(driver: CudaVersion, runtime: CudaVersion) -> Result<Option<String>> {
    if driver >= runtime {
        return Ok(None);
    }
    let both = format!(
        "the NVIDIA driver supports CUDA up to {driver}, and this torch build uses the CUDA \
         {runtime} runtime"
    );
    if driver.major < runtime.major {
        let fix = match build_for(driver) {
            Some((tag, v)) => format!(
                "Install the torch build for CUDA {v}{} (`{}`, then rebuild rsd; {SEE}), or {}",
                if v > driver {
                    ", which this driver runs through CUDA's minor-version compatibility"
                } else {
                    ""
                },
                setup_command(tag),
                upgrade(runtime)
            ),
            None => format!(
                "No torch 2.13 build runs on CUDA {driver}, so {}; see {SEE}",
                upgrade(runtime)
            ),
        };
        return Err(Error::Driver(format!(
            "{both}: a driver does not run a newer major version of CUDA, so the first step \
             would fail with a CUDA error. {fix}."
        )));
    }
    // Only a build this driver runs in full is worth switching to; the driver already meets its
    // major version's minimum, so the other fix is a driver for the runtime's minor version.
    let newer = format!("upgrade the NVIDIA driver to one for CUDA {runtime} or newer");
    let fix = match build_for(driver).filter(|&(_, v)| v <= driver && v < runtime) {
        Some((tag, v)) => format!(
            "install the torch build for CUDA {v} (`{}`, then rebuild rsd; {SEE}) or {newer}",
            setup_command(tag),
        ),
        None => newer,
    };
    Ok(Some(format!(
        "{both}: it runs through CUDA's minor-version compatibility, but a CUDA call that needs a \
         newer driver fails (cudaErrorCallRequiresNewerDriver), and so does a kernel this driver \
         would have to JIT-compile from the newer toolkit's PTX (cudaErrorUnsupportedPtxVersion). \
         If a step fails with either, {fix}."
    )))
}

/// Checks the NVIDIA driver against the torch build's CUDA runtime before a run on `device`:
/// `Ok(None)` for the CPU (no library is touched) or a driver as new as the runtime, a warning to
/// print for an older minor version, and [`Error::Driver`] when no driver is found or its major
/// version is older ([`compare`]). Where the runtime's version cannot be read (a torch without
/// a shared CUDA runtime), a warning says that the check was skipped.
pub fn check(device: Device) -> Result<Option<String>> {
    if !device.is_cuda() {
        return Ok(None);
    }
    let driver = driver_version()?;
    match runtime_version() {
        Ok(runtime) => compare(driver, runtime),
        Err(why) => Ok(Some(format!(
            "the NVIDIA driver supports CUDA up to {driver}; the CUDA runtime of this torch build \
             was not checked against it: {why}"
        ))),
    }
}

/// The CUDA version the NVIDIA driver supports, from `cuDriverGetVersion` in `libcuda.so.1`.
pub fn driver_version() -> Result<CudaVersion> {
    let lib = open(c"libcuda.so.1").map_err(|e| {
        Error::Driver(format!(
            "no NVIDIA driver found (libcuda.so.1 could not be loaded: {e})"
        ))
    })?;
    let get = symbol(lib, c"cuDriverGetVersion").ok_or_else(|| {
        Error::Driver(format!(
            "libcuda.so.1 has no cuDriverGetVersion ({}): not an NVIDIA driver's library",
            dl_error()
        ))
    })?;
    // libcuda stays loaded: libtorch loads it again for the run, and unloading the driver's
    // library in between buys nothing.
    call_version(get, "cuDriverGetVersion")
}

/// The CUDA runtime version this process's torch uses, from `cudaRuntimeGetVersion`: found among
/// the loaded libraries (libtorch_cuda links libcudart), else in the libcudart that the torch
/// installation ships. The error says where it looked.
pub fn runtime_version() -> std::result::Result<CudaVersion, String> {
    if let Some(get) = symbol(libc::RTLD_DEFAULT, RUNTIME_GET_VERSION) {
        return call_version(get, "cudaRuntimeGetVersion").map_err(|e| e.to_string());
    }
    shipped_runtime_version()
}

const RUNTIME_GET_VERSION: &CStr = c"cudaRuntimeGetVersion";

/// The version of the libcudart the loaded libtorch's installation ships ([`cudart_dirs`]).
fn shipped_runtime_version() -> std::result::Result<CudaVersion, String> {
    let Some(torch_lib) = torch_lib_dir() else {
        return Err("libcudart is not loaded and no libtorch is either (a CPU-only build?)".into());
    };
    let dirs = cudart_dirs(&torch_lib);
    for path in dirs.iter().flat_map(|d| cudart_files(d)) {
        let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        if let Some(get) = open(&c)
            .ok()
            .and_then(|lib| symbol(lib, RUNTIME_GET_VERSION))
        {
            return call_version(get, "cudaRuntimeGetVersion").map_err(|e| e.to_string());
        }
    }
    Err(format!(
        "no libcudart is loaded, nor found in {} (a CPU-only torch build?)",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// `cuDriverGetVersion` and `cudaRuntimeGetVersion`: `int f(int *version)`, 0 on success.
type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;

fn call_version(get: GetVersion, name: &str) -> Result<CudaVersion> {
    let mut v: c_int = 0;
    // SAFETY: both functions write one int through the pointer, which is valid for the call.
    let rc = unsafe { get(&mut v) };
    if rc != 0 {
        return Err(Error::Driver(format!("{name} failed with error code {rc}")));
    }
    CudaVersion::from_api(v)
        .ok_or_else(|| Error::Driver(format!("{name} reported an unusable version: {v}")))
}

/// `dlopen(name, RTLD_NOW | RTLD_LOCAL)`; the error is `dlerror`'s text.
fn open(name: &CStr) -> std::result::Result<*mut c_void, String> {
    // SAFETY: `name` is a valid C string for the call. Loading runs the library's initialisers,
    // which is what loading the NVIDIA libraries is for.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        Err(dl_error())
    } else {
        Ok(handle)
    }
}

/// The function `name` of `handle` (or of every loaded library, `RTLD_DEFAULT`), if it has one.
fn symbol(handle: *mut c_void, name: &CStr) -> Option<GetVersion> {
    // SAFETY: `handle` came from dlopen (or is RTLD_DEFAULT) and `name` is a valid C string.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: the two symbols looked up here are functions of the `GetVersion` signature in
    // every CUDA release (`CUresult cuDriverGetVersion(int*)`, `cudaError_t
    // cudaRuntimeGetVersion(int*)`; both results are C enums, int-sized).
    Some(unsafe { std::mem::transmute::<*mut c_void, GetVersion>(p) })
}

/// The last dl* error of this thread.
fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local, NUL-terminated string or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: see above; copied before any other dl* call can overwrite it.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The directory of the libtorch this process loaded, from `/proc/self/maps`.
fn torch_lib_dir() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(Path::new)
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libtorch_cpu.so") || n.starts_with("libc10.so"))
        })
        .and_then(|p| p.parent())
        .map(Path::to_path_buf)
}

/// Where a torch installation keeps its libcudart: a wheel in site-packages' `nvidia/cu13/lib`
/// (CUDA 13 wheels) or `nvidia/cuda_runtime/lib` (CUDA 12 wheels), beside `torch/lib`; a libtorch
/// archive in its own `lib` (`libcudart-<hash>.so.12`).
fn cudart_dirs(torch_lib: &Path) -> Vec<PathBuf> {
    let nvidia = torch_lib.join("../../nvidia");
    vec![
        nvidia.join("cu13/lib"),
        nvidia.join("cuda_runtime/lib"),
        torch_lib.to_path_buf(),
    ]
}

/// The shared libcudart files in `dir` (`libcudart.so.13`, `libcudart-1a2b3c.so.12`; never the
/// static archive), in name order.
fn cudart_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libcudart") && n.contains(".so"))
        })
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32) -> CudaVersion {
        CudaVersion::new(major, minor)
    }

    #[test]
    fn versions_are_read_and_written_as_cuda_does() {
        assert_eq!(CudaVersion::from_api(12020), Some(v(12, 2)));
        assert_eq!(CudaVersion::from_api(13000), Some(v(13, 0)));
        assert_eq!(CudaVersion::from_api(12080), Some(v(12, 8)));
        assert_eq!(CudaVersion::from_api(11080), Some(v(11, 8)));
        assert_eq!(CudaVersion::from_api(0), None);
        assert_eq!(CudaVersion::from_api(-1), None);
        assert_eq!(v(12, 2).to_string(), "12.2");
        assert_eq!(CudaVersion::from_api(13010).unwrap().to_string(), "13.1");
        assert!(v(12, 10) > v(12, 9) && v(13, 0) > v(12, 9));
    }

    #[test]
    fn a_driver_as_new_as_the_runtime_or_newer_is_fine() {
        assert_eq!(compare(v(13, 0), v(13, 0)).unwrap(), None);
        assert_eq!(compare(v(13, 2), v(13, 0)).unwrap(), None);
        assert_eq!(compare(v(13, 0), v(12, 6)).unwrap(), None);
    }

    #[test]
    fn an_older_major_version_is_an_error_naming_both_and_the_build_to_install() {
        let err = compare(v(12, 4), v(13, 0)).unwrap_err();
        assert!(matches!(err, Error::Driver(_)), "{err}");
        let err = err.to_string();
        for want in [
            "CUDA up to 12.4",
            "CUDA 13.0 runtime",
            // 12.4 has no build of its own: cu126 runs through minor-version compatibility.
            "RSD_TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 scripts/setup.sh",
            "rebuild rsd",
            "docs/GPU.md",
            "driver 580 or newer",
        ] {
            assert!(err.contains(want), "{want:?} not in {err}");
        }
        let err = compare(v(12, 9), v(13, 0)).unwrap_err().to_string();
        assert!(err.contains("whl/cu128"), "{err}");
        let err = compare(v(12, 6), v(13, 0)).unwrap_err().to_string();
        assert!(err.contains("whl/cu126"), "{err}");
        // No torch 2.13 build for CUDA 11: only the driver can change.
        let err = compare(v(11, 8), v(12, 6)).unwrap_err().to_string();
        assert!(
            err.contains("No torch 2.13 build runs on CUDA 11.8")
                && err.contains("driver 525 or newer")
                && !err.contains("RSD_TORCH_INDEX_URL"),
            "{err}"
        );
    }

    #[test]
    fn an_older_minor_version_is_a_warning() {
        let warning = compare(v(12, 6), v(12, 8)).unwrap().unwrap();
        for want in [
            "CUDA up to 12.6",
            "CUDA 12.8 runtime",
            "minor-version compatibility",
            "cudaErrorUnsupportedPtxVersion",
            "whl/cu126",
        ] {
            assert!(warning.contains(want), "{want:?} not in {warning}");
        }
        // 12.2 runs every CUDA 12 build only through minor-version compatibility: no build to
        // switch to, the driver is the fix.
        let warning = compare(v(12, 2), v(12, 6)).unwrap().unwrap();
        assert!(
            !warning.contains("RSD_TORCH_INDEX_URL")
                && warning.contains("upgrade the NVIDIA driver to one for CUDA 12.6 or newer"),
            "{warning}"
        );
    }

    #[test]
    fn the_cpu_touches_no_library() {
        assert_eq!(check(Device::Cpu).unwrap(), None);
    }

    #[test]
    fn without_a_driver_a_cuda_device_is_a_clear_error() {
        if open(c"libcuda.so.1").is_ok() {
            // A machine with a driver: whatever it says, it is not "no driver".
            if let Err(e) = check(Device::Cuda(0)) {
                assert!(!e.to_string().contains("no NVIDIA driver found"), "{e}");
            }
            return;
        }
        let err = check(Device::Cuda(0)).unwrap_err();
        assert!(matches!(err, Error::Driver(_)), "{err}");
        let err = err.to_string();
        assert!(
            err.starts_with("no NVIDIA driver found (libcuda.so.1 could not be loaded: ")
                && err.contains("libcuda.so.1"),
            "{err}"
        );
    }

    #[test]
    fn the_runtime_version_is_torchs_when_torch_has_one() {
        // A CUDA torch build (PyPI's default) links libcudart; a CPU-only one has none.
        match runtime_version() {
            Ok(version) => {
                assert!(version.major >= 11, "{version}");
                // The libcudart the installation ships, found by path, is the one loaded.
                assert_eq!(shipped_runtime_version(), Ok(version));
            }
            Err(why) => assert!(why.contains("libcudart"), "{why}"),
        }
    }

    #[test]
    fn libcudart_is_looked_for_where_wheels_and_archives_keep_it() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "libcudart.so.13",
            "libcudart_static.a",
            "libcudart-1a2b.so.12",
            "libc10.so",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let names: Vec<String> = cudart_files(dir.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["libcudart-1a2b.so.12", "libcudart.so.13"]);
        let dirs = cudart_dirs(Path::new("/venv/site-packages/torch/lib"));
        assert_eq!(
            dirs[0],
            Path::new("/venv/site-packages/torch/lib/../../nvidia/cu13/lib")
        );
    }
}

//! Links libtorch for the `rsd-eval` binary and its tests (see rsd-build).
fn main() {
    rsd_build::link_libtorch();
}

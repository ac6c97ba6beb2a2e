//! Links libtorch for rsd-train's binary, tests and benches (see rsd-build).
fn main() {
    rsd_build::link_libtorch();
}

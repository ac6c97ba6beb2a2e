#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs (scripts/setup.sh), checks
# formatting, builds the workspace with clippy's lints, runs the Rust tests, then the peer tests in Python
# (transformers, megatron-core, mosaicml-streaming, pyarrow, datasets, zstd) against our binaries.
# Pass or fail is each tool's own exit status; cargo and pytest print their own summaries.
#
#   scripts/test.sh                   # everything
#   RSD_SKIP_LINT=1 scripts/test.sh   # skip fmt and clippy's lints while iterating
#   RSD_TEST_WORKERS=1 scripts/test.sh  # the peer tests on one worker (default 2)
#   RSD_TEST_NO_SLURM=1 scripts/test.sh  # no local SLURM; the tests that submit real jobs are skipped
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
# shellcheck disable=SC1091
source .rsd-env
# A real two-node SLURM on this machine (slurmctld, two slurmd, munged) for the tests that submit jobs to it
# (docs/TESTS.md, "The real SLURM in the suite"); started here, before the build, so that a
# failed install or start stops the run at once. A no-op when it is already up.
if [ "${RSD_TEST_NO_SLURM:-}" != 1 ]; then
  bash scripts/slurm-local.sh start
fi

# The Python tests drive failure paths (a NaN gradient, a failed write) through fault-injection
# hooks that exist only in builds with these features; release builds never carry them.
features="rsd-data/fault-injection,rsd-train/fault-injection"

step() { printf '\n==> %s\n' "$*" >&2; }

# A full run needs ~8 GB for a fresh target/ and ~2 GB of temp files at a time; say so up front
# rather than fail late with ENOSPC. CI builds once, so incremental caches would only take space.
for d in . "${TMPDIR:-/tmp}"; do
  free_kb=$(df -Pk "$d" | awk 'NR == 2 { print $4 }')
  if [ "${free_kb:-0}" -lt $((12 * 1024 * 1024)) ]; then
    printf 'warning: only %s MB free under %s; the suite needs ~12 GB\n' "$((free_kb / 1024))" "$d" >&2
  fi
done
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL=0
  # A clean clone's result must not depend on proptest's draw; local runs keep searching.
  export PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-1}"
fi
lints=""
if [ -z "${RSD_SKIP_LINT:-}" ]; then
  step "cargo fmt --check"
  cargo fmt --all -- --check
  cargo fmt --manifest-path python/Cargo.toml -- --check   # the Python package's crate (outside the workspace)
  # Clippy's lints run inside the build: clippy-driver compiles the workspace's own crates as
  # rustc does, with the lints on (warnings are errors). `cargo clippy` is a check build with
  # artifacts of its own, which compiled every dependency and the C++ shims (libtorch's API
  # among them, minutes each) a second time.
  driver="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)"
  [ -n "$driver" ] || { echo "clippy-driver not found: rustup component add clippy" >&2; exit 1; }
  export RUSTC_WORKSPACE_WRAPPER="$driver"
  export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
  lints=", clippy's lints as errors"
fi
step "cargo build (with $features$lints)"
cargo build --workspace --all-targets --features "$features" -q
step "cargo test"
# cargo's own output (compact with -q, complete on failure); the status is cargo's (pipefail), the
# log only feeds the total below.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace --features "$features" -q 2>&1 | tee "$log"
awk '/^test result: ok\./ { n += $4 } END { printf "cargo test: %d passed\n", n }' "$log" >&2
step "rsd-dist with NCCL (compiles and links here; runs a world of one where a GPU is visible)"
cargo test -p rsd-dist --features nccl -q nccl
# Two workers (pytest-xdist): most tests wait on one rsd process at a time, so one worker keeps
# only one of this machine's two cores busy. Work stealing: a worker that runs out of tests takes
# some of the other's, so the run does not end on one long file (1,384 s against 1,538 s with a
# file per worker). RSD_TEST_WORKERS=0 runs them in this process.
workers="${RSD_TEST_WORKERS:-2}"
step "pytest (peer tests against our binaries in target/debug, $workers workers)"
export RSD_BIN_DIR="$PWD/target/debug"
# --durations: the slowest tests, for keeping the whole run within CI's 45 minutes.
python -m pytest tests/ -q -n "$workers" --dist worksteal -p no:cacheprovider --durations 30 \
  -W ignore::DeprecationWarning -W ignore::UserWarning

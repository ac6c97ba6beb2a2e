#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs (scripts/setup.sh), checks
# formatting and lints, builds the workspace, runs the Rust tests, then the peer tests in Python
# (transformers, megatron-core, mosaicml-streaming, pyarrow, datasets, zstd) against our binaries.
#
#   scripts/test.sh            # everything
#   RSD_SKIP_LINT=1 scripts/test.sh   # skip fmt/clippy while iterating
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
# shellcheck disable=SC1091
source .rsd-env

step() { printf '\n==> %s\n' "$*" >&2; }
if [ -z "${RSD_SKIP_LINT:-}" ]; then
  step "cargo fmt --check"
  cargo fmt --all -- --check
  step "cargo clippy (warnings are errors)"
  cargo clippy --workspace --all-targets -q -- -D warnings
fi
step "cargo build"
cargo build --workspace --all-targets -q
step "cargo test"
cargo test --workspace -q 2>&1 | tee /tmp/rsd-cargo-test.log | grep -E "^(test result|failures|---- |thread|error)" || true
if grep -qE "test result: FAILED|^error" /tmp/rsd-cargo-test.log || ! grep -q "test result: ok" /tmp/rsd-cargo-test.log; then
  cat /tmp/rsd-cargo-test.log >&2
  echo "cargo test failed" >&2
  exit 1
fi
rust_passed=$(grep -oE "test result: ok\. [0-9]+ passed" /tmp/rsd-cargo-test.log | awk '{s+=$4} END {print s+0}')
echo "cargo test: ${rust_passed} passed" >&2
step "pytest (peer tests against our binaries in target/debug)"
export RSD_BIN_DIR="$PWD/target/debug"
python -m pytest tests/ -q -p no:cacheprovider -W ignore::DeprecationWarning -W ignore::UserWarning

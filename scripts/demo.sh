#!/usr/bin/env bash
# The main job end to end on the bundled data: install, build, pack the bundled corpus (books and code
# repositories) into shards, then inspect and verify them. Idempotent: a second run repacks with --force.
#
#   scripts/demo.sh                 # output under runs/demo/
#   RSD_DEMO_OUT=/tmp/x scripts/demo.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
# shellcheck disable=SC1091
source .rsd-env
out="${RSD_DEMO_OUT:-runs/demo}"
mkdir -p "$out"

echo "==> building (release)" >&2
cargo build --release -q -p rsd-data
bin=target/release

echo "==> packing corpus/books and corpus/code into $out/shards (mixed mode, 2048 tokens)" >&2
"$bin/rsd-data" pack --len 2048 --mode mixed --src corpus/books --src corpus/code --out "$out/shards" --force
echo "==> inspect" >&2
"$bin/rsd-data" inspect "$out/shards" --sample 0 --chars 300
echo "==> verify" >&2
"$bin/rsd-data" verify "$out/shards"

echo
echo "shards:   $out/shards (index.json, shard-*.bin/.idx; megatron-core's IndexedDataset opens them too)"

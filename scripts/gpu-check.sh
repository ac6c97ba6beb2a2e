#!/usr/bin/env bash
# The checks that need a CUDA machine, in one short script. It cannot run on a machine without a
# GPU; CI never runs it. What it does, in order (each step says what it found, the first failure
# stops it):
#
#   1. the GPU and the torch it finds (python3's, or the venv's after scripts/setup.sh);
#   2. builds rsd against that libtorch with NCCL, or states the exact version mismatch;
#   3. NCCL at world size 1 (rsd-dist's own NCCL test) — one GPU cannot hold two NCCL ranks;
#   4. a world-of-N run (N = visible GPUs, torchrun) against one process: fp32, 2 steps,
#      losses equal to 1e-4 relative;
#   5. one bf16 step on cuda:0 (finite loss);
#   6. the process's GPU memory during bf16 steps (nvidia-smi) against `rsd-train memory`'s plan.
#
#   scripts/gpu-check.sh                   # everything, release build
#   RSD_GPU_CHECK_BYPASS=1 scripts/gpu-check.sh   # try a torch other than the one tch expects
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'gpu-check: %s\n' "$*" >&2; exit 1; }
want_torch="2.13.0" # what tch 0.26 (Cargo.toml) is written against

say "1. GPU and torch"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs a CUDA machine"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
if [ -f .rsd-env ]; then source .rsd-env; fi
py="$(command -v python3)"
have_torch="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')" \
  || die "$py has no torch; run scripts/setup.sh (it installs PyPI torch==$want_torch in a venv)"
gpus="$("$py" -c 'import torch; print(torch.cuda.device_count())')"
echo "python: $py, torch $have_torch, $gpus GPU(s) visible to torch"
[ "$gpus" -ge 1 ] || die "torch $have_torch sees no GPU (a CPU-only wheel, or no driver)"

say "2. build against torch $have_torch"
command -v cargo >/dev/null || die "cargo not found; install Rust (rustup) to build rsd here"
export LIBTORCH_USE_PYTORCH=1
if [ "$have_torch" != "$want_torch" ]; then
  if [ -z "${RSD_GPU_CHECK_BYPASS:-}" ]; then
    die "torch $have_torch found, tch 0.26 is written against torch $want_torch. Either run \
scripts/setup.sh (a venv with torch==$want_torch), or try this torch with RSD_GPU_CHECK_BYPASS=1 \
(sets LIBTORCH_BYPASS_VERSION_CHECK=1; a C++ API change then fails the build with the symbol named)"
  fi
  echo "torch $have_torch ≠ $want_torch: building with LIBTORCH_BYPASS_VERSION_CHECK=1"
  export LIBTORCH_BYPASS_VERSION_CHECK=1
fi
cargo build --release -q -p rsd-train -p rsd-data --features rsd-dist/nccl
bin=target/release
readelf -d "$bin/rsd-train" | grep -q 'libtorch_cuda' \
  || die "$bin/rsd-train does not link libtorch_cuda (NEEDED): --device cuda would find no GPU"

say "3. NCCL at world size 1 (rsd-dist's NCCL tests)"
cargo test --release -q -p rsd-dist --features nccl nccl

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$bin/rsd-data" pack --len 512 --src corpus/books --out "$work/shards" --force >/dev/null
common=(--config configs/tiny-cpu.toml --shards "$work/shards" --device cuda --steps 2
  --save-every 0 --heldout-every 0 --progress false)
last_loss() { "$py" -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1])][-1])' "$1"; }

say "4. $gpus NCCL rank(s) (torchrun) against one process, fp32, 2 steps"
"$bin/rsd-train" "${common[@]}" --dtype fp32 --out "$work/one"
"$py" -m torch.distributed.run --standalone --nproc-per-node "$gpus" --no-python \
  "$bin/rsd-train" "${common[@]}" --dtype fp32 --out "$work/world"
one="$(last_loss "$work/one/metrics.jsonl")"
world="$(last_loss "$work/world/metrics.jsonl")"
echo "loss after 2 steps: one process $one, $gpus rank(s) $world"
"$py" -c "import sys; a,b=$one,$world; sys.exit(0 if abs(a-b) <= 1e-4*max(abs(a),1e-12) else 1)" \
  || die "the $gpus-rank run's loss differs from one process's beyond 1e-4 relative"

say "5. one bf16 step on cuda:0"
"$bin/rsd-train" "${common[@]}" --dtype bf16 --steps 1 --out "$work/bf16"
loss="$(last_loss "$work/bf16/metrics.jsonl")"
"$py" -c "import math,sys; sys.exit(0 if math.isfinite($loss) else 1)" || die "bf16 loss $loss is not finite"
echo "bf16 step: loss $loss"

say "6. the GPU memory of a bf16 step against the plan"
# `rsd-train memory --measure` counts libtorch's CPU allocator only; on the GPU the process's
# memory as nvidia-smi reports it (the caching allocator's reserved bytes plus the CUDA context)
# is sampled while 2 steps run, and must stay within the plan's total (which counts the context).
"$bin/rsd-train" memory --config configs/tiny-cpu.toml --shards "$work/shards" --device cuda \
  --dtype bf16 --json >"$work/plan.json"
"$bin/rsd-train" "${common[@]}" --dtype bf16 --out "$work/mem" &
pid=$!
peak=0
while kill -0 "$pid" 2>/dev/null; do
  used="$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits \
    | awk -F', ' -v p="$pid" '$1 == p { print $2 }')"
  [ -n "$used" ] && [ "$used" -gt "$peak" ] && peak="$used"
  sleep 0.2
done
wait "$pid" || die "the bf16 run for the memory check failed"
"$py" - "$work/plan.json" "$peak" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))["plan"]["total"]
peak = int(sys.argv[2]) * 2**20
print(f"plan {plan / 2**20:.0f} MiB (context and allocator slack included), "
      f"nvidia-smi peak {peak / 2**20:.0f} MiB, measured/plan {peak / plan:.3f}")
sys.exit(0 if 0 < peak <= plan else 1)
PY
say "all GPU checks passed"

#!/usr/bin/env bash
# Everything a GPU machine without cargo or a network needs, built here in one command: rsd's
# binaries against the GPU machine's torch (with NCCL), stripped, and the Llama-3 tokenizer the
# data of scripts/gpu-check.sh and benches/gpu_step.py is packed with there. Then carry OUT to the GPU machine and run the command printed at
# the end (docs/GPU.md).
#
#   scripts/gpu-build.sh OUT                         # torch 2.11.0 (what the GPU machines carry)
#   RSD_GPU_TORCH=2.11.0 RSD_GPU_NCCL=2.28.9 scripts/gpu-build.sh OUT
#
# Steps (each idempotent; a second run reuses the venv, the patched torch-sys and the build):
#   1. a venv with PyPI torch==$RSD_GPU_TORCH and the CUDA header wheels the NCCL build compiles
#      against (NCCL's own headers pinned to the release that torch was built with);
#   2. a copy of torch-sys 0.26 whose wrappers of ops that torch lacks throw instead
#      (scripts/patch_torch_sys.py), used through cargo's [patch] in a copy of the workspace, so
#      the repository's Cargo.lock is untouched;
#   3. release builds of rsd-train, rsd-data, rsd-eval and the GPU test binaries, stripped
#      (17 minutes on this project's 2-core machine the first time);
#   4. the Llama-3 tokenizer beside them (OUT/assets): gpu-check.sh packs the data on the GPU
#      machine with OUT/bin/rsd-data, so OUT stays under the 64 MiB a borrowed machine takes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$PWD"
say() { printf '\n==> [%ss] %s\n' "$SECONDS" "$*" >&2; }
die() { printf 'gpu-build: %s\n' "$*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: scripts/gpu-build.sh OUT (see the header of this script)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
torch_v="${RSD_GPU_TORCH:-2.11.0}"
nccl_v="${RSD_GPU_NCCL:-2.28.9}"
cache="${RSD_CACHE:-$HOME/.cache/rsd}"
venv="$cache/venv-torch-$torch_v"

bash scripts/setup.sh # the project's own venv, apt packages and the Llama-3 tokenizer
# shellcheck disable=SC1091
source .rsd-env

say "1. torch $torch_v and the CUDA headers in $venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" || die "python3 -m venv $venv failed"
fi
"$venv/bin/pip" install -q "torch==$torch_v" "nvidia-nccl-cu13==$nccl_v" \
  "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*" \
  || die "pip install torch==$torch_v and the CUDA header wheels failed (see above)"
torch_dir="$("$venv/bin/python" -W ignore -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
have="$("$venv/bin/python" -W ignore -c 'import torch; print(torch.__version__.split("+")[0])')"
[ "$have" = "$torch_v" ] || die "the venv holds torch $have, not $torch_v"

say "2. torch-sys patched for torch $torch_v"
registry="$(ls -d "$HOME"/.cargo/registry/src/*/torch-sys-0.26.0 2>/dev/null | head -1)"
[ -n "$registry" ] || { cargo fetch -q; registry="$(ls -d "$HOME"/.cargo/registry/src/*/torch-sys-0.26.0 | head -1)"; }
sys_copy="$cache/torch-sys-0.26.0-torch-$torch_v"
if [ ! -f "$sys_copy/.patched" ]; then
  rm -rf "$sys_copy"
  cp -r "$registry" "$sys_copy"
  python3 scripts/patch_torch_sys.py "$sys_copy" "$torch_dir/include"
  touch "$sys_copy/.patched"
fi

say "3. release build against torch $torch_v (with NCCL), in a copy of the workspace"
work="$cache/gpu-build-torch-$torch_v"
mkdir -p "$work"
# The sources, not target/ or .git: the copy keeps its own target/ between runs. Only files whose
# content changed are written, with the current time: cargo then rebuilds exactly what changed
# (a copy that kept the sources' older times would look older than the last build, and stale).
python3 - "$repo" "$work" <<'PY'
import filecmp, os, shutil, sys
src, dst = sys.argv[1:]
for root, dirs, files in os.walk(src):
    if root == src:
        dirs[:] = [d for d in dirs if d not in ("target", ".git")]
    for f in files:
        s = os.path.join(root, f)
        d = os.path.join(dst, os.path.relpath(s, src))
        if os.path.exists(d) and filecmp.cmp(s, d, shallow=False):
            continue
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copyfile(s, d)
        shutil.copymode(s, d)
PY
(
  cd "$work"
  export LIBTORCH="$torch_dir" LIBTORCH_BYPASS_VERSION_CHECK=1
  unset LIBTORCH_USE_PYTORCH
  patch=(--config "patch.crates-io.torch-sys.path=\"$sys_copy\"")
  cargo build "${patch[@]}" --release -q -p rsd-train -p rsd-data -p rsd-eval --features rsd-dist/nccl
  cargo test "${patch[@]}" --release -q --no-run -p rsd-model --test cuda 2>&1 | tail -3
  cargo test "${patch[@]}" --release -q --no-run -p rsd-dist --features nccl 2>&1 | tail -3
  cargo test "${patch[@]}" --release -q --no-run -p rsd-train --lib 2>&1 | tail -3
)
mkdir -p "$out/bin"
for b in rsd-train rsd-data rsd-eval; do
  cp "$work/target/release/$b" "$out/bin/"
done
newest() { ls -t "$work"/target/release/deps/"$1"-* 2>/dev/null | grep -v '\.d$' | head -1; }
cp "$(newest cuda)" "$out/bin/test-rsd-model-cuda"
cp "$(newest gloo)" "$out/bin/test-rsd-dist-gloo"
cp "$(newest rsd_train)" "$out/bin/test-rsd-train-lib"
strip "$out"/bin/*
readelf -d "$out/bin/rsd-train" | grep -q libtorch_cuda \
  || die "rsd-train does not link libtorch_cuda: --device cuda would find no GPU"

say "4. the Llama-3 tokenizer (the GPU machine packs the data with bin/rsd-data)"
mkdir -p "$out/assets"
cp "${RSD_ASSETS:-$cache/assets}/llama3-tokenizer.json" "$out/assets/"
bytes="$(du -sb "$out" | cut -f1)"
echo "$out: $((bytes / 1048576)) MiB (binaries $(du -sh "$out/bin" | cut -f1), tokenizer $(du -sh "$out/assets" | cut -f1))"
[ "$bytes" -le $((64 * 1048576)) ] \
  || echo "warning: $out is above 64 MiB, what a borrowed GPU machine takes; leave out rsd-eval (only steps 8-9 need it)" >&2
say "done. On the GPU machine, from a checkout of this commit with $out beside it:"
cat >&2 <<EOF
  RSD_GPU_CHECK_BIN=$out/bin RSD_ASSETS=$out/assets RSD_GPU_CHECK_OUT=gpu-out \\
    RSD_GPU_CHECK_BENCH=only scripts/gpu-check.sh      # attention under each kernel, then the benchmark
  RSD_GPU_CHECK_BIN=$out/bin RSD_ASSETS=$out/assets RSD_GPU_CHECK_OUT=gpu-out \\
    scripts/gpu-check.sh                                # every check
EOF

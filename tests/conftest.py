"""Fixtures several test files share."""
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rsd_cli import run

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The bundled books packed into 128-token samples (fixed mode): small, fast training data."""
    out = tmp_path_factory.mktemp("shards") / "books128"
    run("rsd-data", "pack", "--len", "128", "--src", REPO / "corpus" / "books", "--out", out)
    return out


@pytest.fixture(scope="module")
def mini_shards(tmp_path_factory):
    """The bundled books in 128-token rows packed with the miniature's 1,024-token tokenizer, next
    to the tiny model's config at that vocabulary (`tiny-1k.json` beside the shard directory). At
    Qwen3's 151,669 tokens the fp64 LM head is most of a step of the 64-wide tiny model: tests
    that compare runs with each other (data and context parallel, sharded, resumed) run ~10×
    faster on these, and the vocabulary changes nothing they compare."""
    out = tmp_path_factory.mktemp("shards") / "books128-mini"
    run("rsd-data", "pack", "--len", "128", "--src", REPO / "corpus" / "books", "--tokenizer",
        REPO / "assets" / "tokenizers" / "mini-1k" / "tokenizer.json", "--out", out)
    config = json.loads((REPO / "configs" / "model" / "tiny-qwen3-64.json").read_text())
    config.update(vocab_size=1024, bos_token_id=0, eos_token_id=0)
    (out.parent / "tiny-1k.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct converted from PyPI's GGUF (scripts/convert_smollm2.py) into
    $RSD_SMOLLM2_DIR (default ~/.cache/rsd/smollm2-hf); reused when already converted."""
    out = Path(os.environ.get("RSD_SMOLLM2_DIR", Path.home() / ".cache/rsd/smollm2-hf"))
    out.parent.mkdir(parents=True, exist_ok=True)
    # Test workers (pytest -n) share the directory: one converts, the others wait for it.
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([sys.executable, str(REPO / "scripts/convert_smollm2.py"), "--out",
                        str(out)], check=True)
    return out

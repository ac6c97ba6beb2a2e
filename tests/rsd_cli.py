"""Running the rsd-data binary from the peer tests (found through RSD_BIN_DIR, default target/debug)."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("RSD_BIN_DIR", ROOT / "target" / "debug")) / "rsd-data"


def rsd(*args, ok=True):
    """Run `rsd-data ARGS`; assert it succeeded (or failed, with ok=False) and never panicked."""
    res = subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert "panicked" not in res.stderr, res.stderr
    if ok:
        assert res.returncode == 0, f"rsd-data {args} failed:\n{res.stderr}"
    else:
        assert res.returncode != 0, f"rsd-data {args} should have failed"
    return res

"""Fixtures several test files share."""
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

"""docs/RESULTS.md's numbers come from the committed per-item results, and nothing else.

scripts/miniature_report.sh recomputes the miniature study's tables from docs/results/miniature/
(one results.jsonl per evaluated model and length): the base's recall per depth against the bar,
and the paired differences with their bootstrap intervals (seeded, so they repeat exactly). Each
block of RESULTS.md between `<!-- results:NAME -->` and `<!-- /results:NAME -->` must equal what
the script writes now (headings compared without their level, so the page may nest them).
"""
import re
import subprocess
from pathlib import Path

import pytest

from rsd_cli import BIN_DIR

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results" / "miniature"
PAGE = REPO / "docs" / "RESULTS.md"


def block(name):
    text = PAGE.read_text()
    m = re.search(rf"<!-- results:{name} -->\n(.*?)<!-- /results:{name} -->", text, re.S)
    assert m, f"docs/RESULTS.md has no results:{name} block"
    return m.group(1)


def normal(md):
    """Headings without their level; no blank runs at the ends."""
    return re.sub(r"^#+ ", "", md, flags=re.M).strip()


def report(*args):
    env = {"RSD_MINI_BIN": str(BIN_DIR), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["bash", str(REPO / "scripts" / "miniature_report.sh"), *args],
                          capture_output=True, text=True, env=env, check=True, timeout=600)


def test_the_bar_table_is_the_committed_base_results():
    got = report("bar", str(RESULTS), "0.8").stdout
    assert normal(block("base-bar")) == normal(got)


@pytest.mark.parametrize("baseline", ["standard", "standard-matched"])
def test_the_paired_differences_are_the_committed_results(baseline, tmp_path):
    report("compare", str(RESULTS), str(tmp_path))
    md = (tmp_path / f"compare-vs-{baseline}" / "compare.md").read_text()
    section = md[md.index("## Paired differences"):]
    assert normal(block(f"vs-{baseline}")) == normal(section)

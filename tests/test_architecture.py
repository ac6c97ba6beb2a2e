"""The crate map in docs/DESIGN.md is the workspace's: every crate is in its table, and the table's
order is a dependency order (no crate depends on one listed below it), so data flows one way."""
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_design_maps_crate_table_lists_every_crate_in_dependency_order():
    rows = re.findall(r"^\| `([\w/-]+)`", (REPO / "docs/DESIGN.md").read_text(), re.M)
    crates = {}
    for manifest in sorted((REPO / "crates").glob("*/Cargo.toml")):
        toml = tomllib.loads(manifest.read_text())
        deps = set()
        for table in ("dependencies", "build-dependencies"):
            deps |= {d for d in toml.get(table, {}) if d.startswith("rsd-")}
        crates[toml["package"]["name"]] = deps
    listed = [r for r in rows if r in crates]
    assert sorted(listed) == sorted(crates), (listed, sorted(crates))
    above = set()
    for crate in listed:
        assert crates[crate] <= above, f"{crate} depends on {crates[crate] - above}, listed below it"
        above.add(crate)

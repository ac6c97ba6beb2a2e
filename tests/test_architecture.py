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


def crate_modules(src):
    """Each module of a crate's `src/` (`a::b` for src/a/b.rs or src/a/b/mod.rs) and the modules
    of the same crate its code names through `crate::…`, outside comments and test modules."""
    text = {}
    for f in src.rglob("*.rs"):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        code = re.split(r"\n#\[cfg\(test\)\]\s*\nmod tests", f.read_text())[0]
        text["::".join(parts)] = "\n".join(
            line for line in code.split("\n") if not line.strip().startswith("//"))
    uses = {m: set() for m in text}
    for m, code in text.items():
        for ref in re.findall(r"\bcrate::([a-z_]\w*(?:::[a-z_]\w*)*)", code):
            parts = ref.split("::")
            target = next(("::".join(parts[:k]) for k in range(len(parts), 0, -1)
                           if "::".join(parts[:k]) in text), None)
            # A module and its own submodules are one unit here.
            if target and not (target == m or m.startswith(target + "::")
                               or target.startswith(m + "::")):
                uses[m].add(target)
    return uses


def cycles(uses):
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, out = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in uses[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(uses):
        if v not in index:
            visit(v)
    return out


def test_no_crate_has_a_module_cycle():
    found = {src.parent.name: cycles(crate_modules(src))
             for src in sorted((REPO / "crates").glob("*/src"))}
    assert not any(found.values()), {k: v for k, v in found.items() if v}
    # The check sees cycles: two modules naming each other are one.
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_binaries_are_thin_and_share_the_model_flags():
    """A binary's main.rs holds its command line and dispatches (each subcommand's work is in the
    libraries, its printing in a `*_cmd.rs` beside main.rs); the flags every tool that loads a
    model takes (--model, --device/--dtype, --rope-scaling) are one definition, rsd_model::cli."""
    for main in sorted((REPO / "crates").glob("*/src/main.rs")):
        lines = len(main.read_text().splitlines())
        assert lines <= 150, f"{main.relative_to(REPO)}: {lines} lines"
    shared = REPO / "crates/rsd-model/src/cli.rs"
    for f in sorted((REPO / "crates").rglob("*.rs")):
        if f == shared or "target" in f.parts:
            continue
        code = f.read_text()
        assert not re.search(r"#\[arg\(long[^\]]*\)\]\s*(pub(\(\w+\))?\s+)?model:\s*PathBuf", code), \
            f"{f.relative_to(REPO)}: --model is rsd_model::cli::ModelDirArgs"
        assert '#[arg(long, default_value = "cpu")]' not in code, \
            f"{f.relative_to(REPO)}: a --device flag of its own; flatten rsd_model::cli::DeviceArgs"
        assert not re.search(r"rope_scaling: Option<String>", code), \
            f"{f.relative_to(REPO)}: a --rope-scaling of its own; flatten RopeScalingArgs"
    # rsd-train's commands read --nproc (the run's ranks) from one group.
    nproc = [f for f in (REPO / "crates").rglob("*.rs")
             if "target" not in f.parts and "pub nproc: Option<usize>" in f.read_text()]
    assert nproc == [REPO / "crates/rsd-train/src/args.rs"], nproc


FN = re.compile(r'^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?'
                r'(?:extern\s+"[^"]*"\s+)?fn\s+(\w+)')


def functions(lines):
    """Each fn with a body in a Rust file's `lines`: (index of its `fn` line, name, length in
    lines from the `fn` line to the closing brace at the `fn` line's indentation)."""
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        # The signature ends at the first `{` (a body) or `;` outside brackets (a declaration,
        # no body; `[u8; 32]` is a type).
        j, body, depth = i, None, 0
        while j < len(lines) and body is None:
            for ch in lines[j]:
                depth += (ch in "([") - (ch in ")]")
                if ch == "{" or (ch == ";" and depth == 0):
                    body = ch == "{"
                    break
            else:
                j += 1
        if not body:
            continue
        # A body opened and closed on the signature's last line is that long.
        if lines[j].count("{") == lines[j].count("}"):
            yield i, m.group(2), j - i + 1
            continue
        k = next((k for k in range(j + 1, len(lines)) if lines[k].startswith(m.group(1) + "}")),
                 len(lines) - 1)
        yield i, m.group(2), k - i + 1


def test_no_function_is_long_without_a_reason():
    """A fn over 100 lines (from its `fn` line to its closing brace) is split into named steps,
    or says why not: a `Long because:` comment just above it (among its doc comments and
    attributes)."""
    # The measure sees bodies, one-liners and declarations as they are.
    sample = ["fn a() {", "    x", "}", "    fn b(&self);", "fn c() -> u8 { 1 }",
              "pub(crate) fn d(", "    y: u8,", ") {", "    if y {", "    }", "}",
              "fn e(x: [u8; 4]) -> [u8; 4] {", "    x", "}"]
    assert list(functions(sample)) == [(0, "a", 3), (4, "c", 1), (5, "d", 6), (11, "e", 3)]
    patterns = ("crates/*/src/**/*.rs", "crates/*/tests/*.rs", "crates/*/benches/*.rs")
    long = []
    for f in sorted({f for pattern in patterns for f in REPO.glob(pattern)}):
        lines = f.read_text().split("\n")
        for i, name, length in functions(lines):
            if length <= 100:
                continue
            above = i - 1
            while above >= 0 and lines[above].strip().startswith(("//", "#[", "#![")):
                above -= 1
            if not any("Long because:" in line for line in lines[above + 1:i]):
                long.append(f"{f.relative_to(REPO)}:{i + 1}:{name}:{length}")
    assert not long, "functions over 100 lines with no `Long because:` comment above them " \
        "(split them, or say why not):\n" + "\n".join(long)

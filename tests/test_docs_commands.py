"""Every command in README.md and the user guides runs as written, so the docs cannot drift from
the tools.

A command is a line of a fenced code block that starts with one of rsd's binaries, `mkdir` or
`cp` (continuation lines joined, the trailing `# comment` dropped). Each document's commands run in
order, through bash, in a scratch directory of their own (so `--resume` finds the run the line
above made) that links `configs/`, `corpus/`, `assets/` and `pipelines/` to the repository's and
holds the files the docs name as placeholders:

  DIR, MODEL, ckpt/   a tiny Qwen3 made by `rsd-model init` (configs/model/tiny-qwen3-64.json)
                      with the bundled Qwen3 tokenizer (the one `rsd-data pack` uses by default)
  T.npy, P.npy        token ids and positions, int64 [2, 128]

Sizes are shrunk so the whole file runs in a few minutes (SUBSTITUTIONS below, applied in order,
each a (pattern, replacement) of Python's `re.sub`); training commands that do not name `--steps`
run 2 steps. A line that is a synopsis (`[--optional]`, `…`) is not a command; a few commands are
not run, each for a stated reason (SKIPPED). The docs' page on tests (docs/TESTS.md, "Testing
the docs") holds the same table.
"""

import re
import shutil
import subprocess
import os
from pathlib import Path

import numpy as np
import pytest

from rsd_cli import BIN_DIR, ROOT, exe

DOCS = ["README.md", "docs/DATA.md", "docs/TRAIN.md", "docs/EVAL.md", "docs/MODEL.md",
        "docs/LOADER.md", "docs/MEMORY.md"]

COMMAND = re.compile(r"^(rsd-(data|train|model|eval)|mkdir|cp)\b(?!:)")

SUBSTITUTIONS = [
    (r"\b(DIR|MODEL)\b(?!…)", "model"),
    (r"\bckpt/", "model"),
    (r"--len (65536|8192|1024|512)\b", "--len 256"),
    (r"--tokens-per-step 1024\b", "--tokens-per-step 512"),
    (r"--steps 50\b", "--steps 2"),
    (r"--steps 100\b", "--steps 4"),
    (r"step-00000050\b", "step-00000002"),
    (r"--lengths 4096,8192\b", "--lengths 256"),
    (r"--depths 10\b", "--depths 2"),
    (r"--samples 4\b", "--samples 1"),
    (r"--max-new-tokens 64\b", "--max-new-tokens 8"),
    (r"--seq-len 2048\b", "--seq-len 128"),
    (r"\b(runs/eval-standard|runs/eval-rsd|runs/standard|runs/rsd)\b", "runs/eval"),
    (r"\bs\d/(std|rsd)\b", "runs/eval"),
    (r"\bRUN/", "runs/eval/"),
]

SKIPPED = {
    "scripts/demo.sh": "the demo itself (scripts/demo.sh)",
    "scripts/test.sh": "this test suite",
    "scripts/memory_matrix.py": "the memory matrix takes an hour; tests/test_memory.py runs its CI "
                                "entries",
    "--src prolong/book": "ProLong's data is not bundled (tests/test_pack_peers.py packs MDS shards)",
    "--data hellaswag_val.jsonl": "HellaSwag is not bundled (tests/test_eval_mc.py scores files in "
                                  "its published format)",
    "rsd-eval longbench --data data.json": "LongBench v2 is not bundled "
                                           "(tests/test_eval_longbench.py runs files in its format)",
    "rsd-model init --config configs/model/tiny-llama.json --seed 0 --out model":
        "would overwrite the scratch model; the same command made it (with tiny-qwen3-64)",
}

# Made before a document's commands, where a command reads what no earlier line of that document
# writes.
SETUP = {
    "README.md": ["rsd-data pack --len 256 --mode fixed --src corpus/books --out data/heldout",
                  """echo '{"context": "The capital of France is", "candidates": [" Paris", " Rome"], """
                  """"answer": " Paris"}' > my-items.jsonl"""],
    "docs/EVAL.md": ["rsd-eval run --model model --tasks niah_single_1 --lengths 256 --depths 2 "
                     "--samples 1 --out runs/eval"],
}


def commands(doc):
    """The command lines of `doc`'s code blocks, in order."""
    text = (ROOT / doc).read_text()
    out = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M):
        line = ""
        for raw in block.splitlines():
            line += raw.rstrip()
            if line.endswith("\\"):
                line = line[:-1] + " "
                continue
            line, whole = "", line.strip()
            if COMMAND.match(whole) or whole.startswith("scripts/"):
                out.append(re.sub(r"\s+#\s.*$", "", whole).strip())
    return out


def is_synopsis(cmd):
    return "[" in cmd or "…" in cmd


def sized(cmd):
    for pattern, replacement in SUBSTITUTIONS:
        cmd = re.sub(pattern, replacement, cmd)
    training = re.match(r"^rsd-train (?!probe|memory)", cmd) and "--print-config" not in cmd
    if training and "--steps" not in cmd:
        cmd += " --steps 2"
    return cmd


def skip_reason(cmd):
    return next((why for key, why in SKIPPED.items() if key in cmd), None)


@pytest.fixture(scope="module")
def scratch_template(tmp_path_factory):
    """A directory with the placeholders' files, copied for each document."""
    d = tmp_path_factory.mktemp("docs-template")
    subprocess.run([exe("rsd-model"), "init", "--config",
                    str(ROOT / "configs/model/tiny-qwen3-64.json"), "--seed", "0", "--out",
                    str(d / "model")], check=True, capture_output=True)
    # The bundled Qwen3 tokenizer, as every pack without --tokenizer writes it beside its shards.
    (d / "text").mkdir()
    (d / "text" / "a.txt").write_text("Call me Ishmael. " * 200)
    subprocess.run([exe("rsd-data"), "pack", "--len", "256", "--src", str(d / "text"), "--out",
                    str(d / "tok")], check=True, capture_output=True)
    shutil.copy(d / "tok" / "tokenizer.json", d / "model" / "tokenizer.json")
    shutil.rmtree(d / "tok")
    shutil.rmtree(d / "text")
    rng = np.random.default_rng(0)
    np.save(d / "T.npy", rng.integers(0, 151_000, size=(2, 128), dtype=np.int64))
    np.save(d / "P.npy", np.tile(np.arange(128, dtype=np.int64), (2, 1)))
    return d


def scratch_for(template, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(template, work)
    for name in ("configs", "corpus", "assets", "pipelines"):
        (work / name).symlink_to(ROOT / name)
    return work


def run_line(cmd, cwd):
    env = {**os.environ, "PATH": f"{BIN_DIR}:{os.environ['PATH']}"}
    p = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, env=env,
                       timeout=600)
    assert "panicked" not in p.stderr, f"{cmd} panicked:\n{p.stderr}"
    assert p.returncode == 0, f"{cmd} failed (exit {p.returncode}):\n{p.stderr[-3000:]}"
    return p


def test_the_substitution_table_is_used_and_every_document_has_commands():
    lines = [c for doc in DOCS for c in commands(doc)]
    for doc in DOCS:
        assert commands(doc), f"{doc}: no commands found (did the block format change?)"
    for pattern, _ in SUBSTITUTIONS:
        assert any(re.search(pattern, c) for c in lines), f"{pattern}: matches no doc command"
    for key in SKIPPED:
        assert any(key in sized(c) for c in lines), f"SKIPPED {key!r}: matches no doc command"


@pytest.mark.parametrize("doc", DOCS)
def test_every_documented_command_runs(doc, scratch_template, tmp_path):
    work = scratch_for(scratch_template, tmp_path)
    ran, skipped = [], []
    for cmd in SETUP.get(doc, []):
        run_line(cmd, work)
    for cmd in commands(doc):
        if is_synopsis(cmd):
            skipped.append((cmd, "a synopsis"))
            continue
        cmd = sized(cmd)
        why = skip_reason(cmd)
        if why:
            skipped.append((cmd, why))
            continue
        run_line(cmd, work)
        ran.append(cmd)
    print(f"{doc}: ran {len(ran)}, skipped {len(skipped)}")
    for cmd, why in skipped:
        print(f"  skipped ({why}): {cmd}")
    # The guides whose blocks are all synopses still have their commands run elsewhere here.
    if doc not in ("docs/LOADER.md", "docs/MEMORY.md"):
        assert ran, f"{doc}: no command ran"

"""Running rsd's binaries from the peer tests: the one harness every test file uses.

Binaries are found in $RSD_BIN_DIR (default <repo>/target/debug). `run` checks that the binary was
built, captures its output, asserts that it never panicked (a user must see an error message, not a
Rust panic) and, with check=True, that it exited 0; a failure shows the command line, the exit
status and the binary's stderr.
"""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN_DIR = Path(os.environ.get("RSD_BIN_DIR", ROOT / "target" / "debug"))


def exe(name):
    """The path of binary `name`, asserting that it was built."""
    path = BIN_DIR / name
    assert path.exists(), f"{path} not built (cargo build --workspace, or set RSD_BIN_DIR)"
    return str(path)


def _command_line(name, args):
    return " ".join([name, *map(str, args)])


def run(name, *args, check=True, env=None, timeout=None):
    """Run binary `name` with ARGS and return the CompletedProcess (text stdout/stderr).

    check=True: it must exit 0. check=False: any exit status is returned for the test to judge.
    env: variables added to this process's environment. Either way it must not panic.
    """
    p = subprocess.run([exe(name), *map(str, args)], capture_output=True, text=True,
                       env=None if env is None else {**os.environ, **env}, timeout=timeout)
    assert "panicked" not in p.stderr, f"{_command_line(name, args)} panicked:\n{p.stderr}"
    if check and p.returncode != 0:
        raise AssertionError(f"{_command_line(name, args)} failed (exit {p.returncode}):\n{p.stderr}")
    return p


def fails(name, *args, env=None, timeout=None):
    """Run binary `name` with ARGS, assert that it failed (without panicking), and return it."""
    p = run(name, *args, check=False, env=env, timeout=timeout)
    assert p.returncode != 0, f"{_command_line(name, args)} should have failed:\n{p.stdout}"
    return p


def rsd(*args, ok=True):
    """`rsd-data ARGS`, which must succeed (or, with ok=False, fail)."""
    return run("rsd-data", *args, timeout=300) if ok else fails("rsd-data", *args, timeout=300)

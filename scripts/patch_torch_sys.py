"""Makes a copy of torch-sys build against an older libtorch than the one tch was generated for.

tch's generated C wrappers (libtch/torch_api_generated.cpp) call every ATen op of the torch it was
written for; ops an older torch lacks fail to compile. This compiles the file against the target
torch's headers (syntax only), finds the `atg_*` wrappers whose bodies do not compile, and replaces
each body with a throw naming the op, until the file compiles. rsd calls none of those ops; a
call would end in a clear error, not a crash.

    python scripts/patch_torch_sys.py TORCH_SYS_COPY TORCH_INCLUDE_DIR
"""
import re
import subprocess
import sys
from pathlib import Path


def errors(src, include):
    """Line numbers (1-based) of the compile errors in `src`."""
    cmd = ["c++", "-fsyntax-only", "-std=c++17", "-w", "-D_GLIBCXX_USE_CXX11_ABI=1",
           "-I", str(include), "-I", str(Path(include) / "torch/csrc/api/include"),
           "-I", str(src.parent), str(src)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    pat = re.compile(re.escape(src.name) + r":(\d+):\d+: error")
    return sorted({int(m.group(1)) for m in pat.finditer(p.stderr)}), p.returncode, p.stderr


def stub_functions(lines, bad_lines):
    """Replaces the body of every `atg_*` function holding one of `bad_lines` (1-based) with a
    throw; returns how many. Bottom-up, so the line numbers above stay valid."""
    starts = [i for i, line in enumerate(lines) if re.match(r"^[\w:<>\s\*]+\batg_\w+\(", line)]
    targets = sorted({max(s for s in starts if s <= b - 1) for b in bad_lines
                      if any(s <= b - 1 for s in starts)}, reverse=True)
    for i in targets:
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == "}")
        name = re.search(r"(atg_\w+)\(", lines[i]).group(1)
        body = [f'  PROTECT(throw std::runtime_error("{name}: this op does not exist in this libtorch");)']
        if not lines[i].startswith("void "):
            body.append("  return {};")
        lines[i + 1:end] = body
    return len(targets)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root, include = Path(sys.argv[1]), Path(sys.argv[2])
    src = root / "libtch" / "torch_api_generated.cpp"
    total = 0
    for _ in range(4):
        bad, rc, stderr = errors(src, include)
        if rc == 0:
            print(f"patch_torch_sys: {src} compiles against {include} ({total} wrappers stubbed)")
            return
        if not bad:
            sys.exit(f"patch_torch_sys: errors outside the generated wrappers:\n{stderr[-3000:]}")
        lines = src.read_text().split("\n")
        n = stub_functions(lines, list(bad))
        if n == 0:
            sys.exit(f"patch_torch_sys: could not place the errors in a wrapper:\n{stderr[-3000:]}")
        src.write_text("\n".join(lines))
        total += n
    sys.exit(f"patch_torch_sys: still not compiling after 4 passes ({total} wrappers stubbed)")


if __name__ == "__main__":
    main()

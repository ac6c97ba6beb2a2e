"""What `rsd-data pack --chat` costs over packing the same text as plain documents.

The bundled chat set (corpus/chat/train.jsonl), repeated, is packed twice with the bundled Qwen3
tokenizer, in interleaved rounds (the VM's speed drifts):
  * --chat: each record's messages rendered with Qwen3's chat template, tokenized whole, and masked
    (one more rendering per assistant turn, and the text encoded a second time in segments);
  * plain: a JSONL of the same conversations already rendered (transformers' apply_chat_template,
    tokenize=False), packed as text with --bos none --eos none: the same tokens, no template.
Both write the same token count; the ratio is what rendering and masking cost.

Usage (after scripts/setup.sh; builds nothing itself):
  cargo build --release -p rsd-data
  python benches/chat_pack_bench.py --bin target/release --copies 40 --workers 1,2 --rounds 3
"""

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import zstandard

ROOT = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(ROOT / "target/release"))
    ap.add_argument("--copies", type=int, default=40, help="repeats of corpus/chat/train.jsonl")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()

    from transformers import AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix="chat-bench-"))
    tok_dir = tmp / "qwen3"
    tok_dir.mkdir()
    raw = (ROOT / "assets/tokenizers/qwen3/tokenizer.json.zst").read_bytes()
    (tok_dir / "tokenizer.json").write_bytes(
        zstandard.ZstdDecompressor().decompress(raw, max_output_size=64 << 20))
    shutil.copy(ROOT / "assets/tokenizers/qwen3/tokenizer_config.json", tok_dir)
    tok = AutoTokenizer.from_pretrained(tok_dir)

    records = [json.loads(x) for x in (ROOT / "corpus/chat/train.jsonl").read_text().splitlines()]
    chat, plain = tmp / "chat.jsonl", tmp / "plain.jsonl"
    with open(chat, "w") as c, open(plain, "w") as p:
        for k in range(a.copies):
            for r in records:
                # A different first user message per copy, so no two conversations are the same.
                msgs = [dict(m) for m in r["messages"]]
                first = next(m for m in msgs if m["role"] == "user")
                first["content"] = f"({k}) " + first["content"]
                c.write(json.dumps({"messages": msgs}) + "\n")
                p.write(json.dumps({"text": tok.apply_chat_template(msgs, tokenize=False)}) + "\n")
    mb = chat.stat().st_size / 1e6
    print(f"{a.copies * len(records)} conversations, {mb:.1f} MB of messages JSONL")

    rsd = str(Path(a.bin) / "rsd-data")
    common = ["--len", "8192", "--tokenizer", str(tok_dir / "tokenizer.json"), "--force",
              "--progress", "none"]
    args = {
        "chat": ["pack", "--chat", "--src", str(chat), *common],
        "plain": ["pack", "--mode", "mixed", "--bos", "none", "--eos", "none", "--src", str(plain),
                  *common],
    }
    print("| workers | what | tokens | seconds (best of rounds) | tokens/s | chat / plain |")
    print("|---:|---|---:|---:|---:|---:|")
    for w in [int(x) for x in a.workers.split(",")]:
        best = {}
        tokens = {}
        for _ in range(a.rounds):
            for name in ("plain", "chat"):
                out = tmp / f"out-{name}"
                t = time.perf_counter()
                subprocess.run([rsd, *args[name], "--out", str(out), "--workers", str(w)],
                               check=True, capture_output=True, text=True)
                dt = time.perf_counter() - t
                best[name] = min(best.get(name, dt), dt)
                tokens[name] = json.loads((out / "index.json").read_text())["totals"]["tokens"]
        assert tokens["chat"] == tokens["plain"], tokens
        for name in ("plain", "chat"):
            ratio = f"{best['plain'] / best['chat']:.2f}" if name == "chat" else ""
            print(f"| {w} | {name} | {tokens[name]} | {best[name]:.2f} | "
                  f"{tokens[name] / best[name] / 1e6:.2f} M | {ratio} |")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()

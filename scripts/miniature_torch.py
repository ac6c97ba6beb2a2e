"""The miniature's pretraining, written again in plain PyTorch, with transformers' Qwen3 as the
model: a check, independent of rsd's model and trainer, of what a base of this size learns from a
data mix in a given number of steps (docs/RESULTS.md, the pilots for the shared base).

It builds `Qwen3ForCausalLM` from the same config.json (configs/model/mini-qwen3.json), trains it
with AdamW as configs/miniature.toml does (betas 0.9/0.95, weight decay 0.1 on matrices, clip 1.0,
10% warm-up, cosine to 10% of the peak) on documents drawn from JSONL files by weight, and every
--eval-every steps scores item files as `rsd-eval score --items` does: teacher-forced, the answer's
log-probability and whether it ranks first among the candidates (one-token answers only).

Two differences from rsd-train, both in the data path: a row holds one document, padded (rsd packs
several to a row and masks attention at their boundaries: the same thing for attention, more
padding here), and each step draws documents until --tokens real tokens.

    python scripts/miniature_torch.py --mix pairs.jsonl:1 --evals pair-items.jsonl --steps 1500 --save p1.pt
    python scripts/miniature_torch.py --init p1.pt --mix pairs.jsonl:0.3,drill.jsonl:0.4,kv.jsonl:0.3 \\
        --evals drill-items.jsonl,items-256.jsonl --steps 1500
"""
import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import Qwen3Config, Qwen3ForCausalLM

REPO = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--mix", required=True, help="FILE.jsonl:WEIGHT,… documents ({\"text\"} per line)")
    ap.add_argument("--evals", default="", help="item files, comma-separated ({context, candidates, answer})")
    ap.add_argument("--config", default=str(REPO / "configs/model/mini-qwen3.json"))
    ap.add_argument("--tokenizer", default=str(REPO / "assets/tokenizers/mini-1k/tokenizer.json"))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--tokens", type=int, default=2048, help="real tokens per step")
    ap.add_argument("--max-len", type=int, default=256, help="a document's tokens, at most")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-items", type=int, default=64, help="items per file scored (a fixed sample)")
    ap.add_argument("--init", help="weights to start from (a --save file)")
    ap.add_argument("--save", help="write the weights here at the end")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    torch.set_num_threads(a.threads)
    tok = Tokenizer.from_file(a.tokenizer)
    cfg = json.loads(Path(a.config).read_text())
    model = Qwen3ForCausalLM(Qwen3Config(**{k: v for k, v in cfg.items() if k != "architectures"}))
    if a.init:
        model.load_state_dict(torch.load(a.init))

    def ids(text):
        return tok.encode(text, add_special_tokens=False).ids

    mix = []
    for part in a.mix.split(","):
        path, weight = part.rsplit(":", 1)
        with open(path) as f:
            mix.append(([ids(json.loads(line)["text"])[:a.max_len] for line in f], float(weight)))
    evals = []
    for path in filter(None, a.evals.split(",")):
        with open(path) as f:
            items = [json.loads(line) for line in f]
        random.Random(5).shuffle(items)
        evals.append((Path(path).name, items[:a.eval_items]))

    def batch():
        rows, n = [], 0
        while n < a.tokens:
            docs = rng.choices([d for d, _ in mix], weights=[w for _, w in mix])[0]
            rows.append(rng.choice(docs))
            n += len(rows[-1])
        width = max(map(len, rows))
        x = torch.zeros(len(rows), width, dtype=torch.long)
        y = torch.full((len(rows), width), -100)
        for i, r in enumerate(rows):
            x[i, :len(r)] = torch.tensor(r)
            y[i, :len(r) - 1] = torch.tensor(r[1:])
        return x, y

    @torch.no_grad()
    def score(items):
        model.eval()
        right, logprob = 0, 0.0
        for it in items:
            lp = model(torch.tensor([ids(it["context"])])).logits[0, -1].float().log_softmax(-1)
            cands = [ids(c)[0] for c in it["candidates"]]
            answer = ids(it["answer"])[0]
            right += max(cands, key=lambda c: lp[c]) == answer
            logprob += lp[answer].item()
        model.train()
        return right / len(items), logprob / len(items)

    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    warmup = max(1, a.steps // 10)

    def lr_at(step):
        if step < warmup:
            return a.lr * (step + 1) / warmup
        p = (step - warmup) / max(1, a.steps - warmup)
        return a.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * p)))

    t0, smooth = time.time(), None
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = batch()
        logits = model(x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smooth = loss.item() if smooth is None else 0.98 * smooth + 0.02 * loss.item()
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            scores = " ".join(f"{name}: {r:.3f} ({lp:.2f})" for name, items in evals for r, lp in [score(items)])
            print(f"step {step + 1} loss {smooth:.3f} | {scores} | {time.time() - t0:.0f}s", flush=True)
    if a.save:
        torch.save(model.state_dict(), a.save)


if __name__ == "__main__":
    main()

"""Train the miniature's 1,024-token byte-level BPE (assets/tokenizers/mini-1k/tokenizer.json).

The paper's models have 128K–152K-token vocabularies; at the miniature's scale (a 4-layer,
128-wide model) such an embedding would be 95% of the parameters and most of the compute, so the
miniature uses a small BPE learned from the bundled books plus the evaluation's prompt templates
(RULER's needle sentences and noise haystack). Digits are single tokens, as in Qwen3 and Llama-3,
so a 7-digit value is 7 tokens to copy whatever its digits.

    python scripts/miniature/make_tokenizer.py PROMPTS.jsonl --out assets/tokenizers/mini-1k

PROMPTS.jsonl: `rsd-eval run --dump-prompts` output (its `prompt` fields are read).
Deterministic for a given tokenizers version and input; the committed file is what the miniature
uses, this script is how it was made.
"""
import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

REPO = Path(__file__).resolve().parents[2]
PROMPT_REPEATS = 20


def texts(prompts):
    for p in sorted((REPO / "corpus" / "books").glob("*.txt")):
        yield p.read_text(encoding="utf-8")
    # The books are ~30x the prompts' text: repeat the prompts so that the templates' words
    # (special, magic, mentioned, provided…) become single tokens too.
    with open(prompts, encoding="utf-8") as f:
        lines = [json.loads(line)["prompt"] for line in f]
    for _ in range(PROMPT_REPEATS):
        yield from lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prompts", help="rsd-eval --dump-prompts JSONL")
    ap.add_argument("--out", required=True, help="directory for tokenizer.json")
    ap.add_argument("--vocab", type=int, default=1024)
    a = ap.parse_args()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts(a.prompts), trainer=trainer)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    print(f"{out / 'tokenizer.json'}: {tok.get_vocab_size()} tokens")


if __name__ == "__main__":
    main()

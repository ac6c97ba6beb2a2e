"""Dense recall documents for the miniature's base: each `rsd-eval run --dump-prompts` item (a
needle prompt and its answer) followed by the answer sentence of every other needle of its
context, in random order, so one document asks for each of its values, not only one. With
`--form drill`, the item's needles without the haystack, then the answer of each.

    python scripts/miniature_dense.py DUMP.jsonl OUT.jsonl --seed 1001 \
        --tokenizer assets/tokenizers/mini-1k/tokenizer.json --max-tokens 255

A needle is RULER's sentence "One of the special magic numbers for KEY is: VALUE."; an answer
sentence is its question's answer prefix and value, "The special magic number for KEY mentioned in
the provided text is VALUE." Sentences stop where the next would take the document past
--max-tokens (so a packed row never splits one). Writes one {"text": …} object per line (what
`rsd-data pack` reads).
"""
import argparse
import json
import random
import re
import sys

NEEDLE = re.compile(r"One of the special magic numbers for ([\w-]+) is: (\d+)\.")


# The added sentences: RULER's answer ("answer"), or the needle itself again ("needle"), which
# a model can complete by copying what followed the same words before.
FORMS = {
    "answer": "The special magic number for {k} mentioned in the provided text is {v}.",
    "needle": "One of the special magic numbers for {k} is: {v}.",
}


def dense(item, rng, count, max_tokens, form="answer"):
    """The item's prompt and answer, then one answer sentence per other needle of its context,
    while the text stays within `max_tokens` by `count`."""
    pairs = list(dict.fromkeys(NEEDLE.findall(item["prompt"])))
    asked = item["expected"][0]
    if asked not in [v for _, v in pairs]:
        raise ValueError(f"sample {item['sample']}: the answer {asked} is in no needle")
    rest = [(k, v) for k, v in pairs if v != asked]
    rng.shuffle(rest)
    text = f"{item['prompt']} {asked}."
    for k, v in rest:
        more = text + "\n" + FORMS[form].format(k=k, v=v)
        if count(more) > max_tokens:
            break
        text = more
    return text


def drill(item, rng, count, max_tokens):
    """The item's needles without their haystack, then the answer sentence of each, in another
    order: as many needles as fit with their answers within `max_tokens`."""
    pairs = list(dict.fromkeys(NEEDLE.findall(item["prompt"])))
    rng.shuffle(pairs)
    best = None
    for n in range(1, len(pairs) + 1):
        asked = pairs[:n]
        order = asked[:]
        rng.shuffle(order)
        text = " ".join(FORMS["needle"].format(k=k, v=v) for k, v in asked) + "\n" + "\n".join(
            FORMS["answer"].format(k=k, v=v) for k, v in order)
        if count(text) > max_tokens:
            break
        best = text
    if best is None:
        raise ValueError(f"sample {item['sample']}: one needle and its answer exceed {max_tokens} tokens")
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dump", help="rsd-eval run --dump-prompts output")
    ap.add_argument("out", help="JSONL of {\"text\": …} documents")
    ap.add_argument("--seed", type=int, default=0, help="the order of the added sentences")
    ap.add_argument("--form", choices=sorted(FORMS) + ["drill"], default="answer",
                    help="the added sentences: RULER's answer, or the needle repeated; drill: "
                         "the needles alone (no haystack), then each one's answer")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json the documents are packed with")
    ap.add_argument("--max-tokens", type=int, required=True,
                    help="tokens a document may take (the packed row's length less its EOS)")
    a = ap.parse_args()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    count = lambda text: len(tok.encode(text, add_special_tokens=False).ids)
    rng = random.Random(a.seed)
    n = 0
    with open(a.dump) as f, open(a.out + ".tmp", "w") as w:
        for i, line in enumerate(f, 1):
            try:
                item = json.loads(line)
                text = (drill(item, rng, count, a.max_tokens) if a.form == "drill"
                        else dense(item, rng, count, a.max_tokens, a.form))
            except (ValueError, KeyError, json.JSONDecodeError) as e:
                sys.exit(f"{a.dump}:{i}: {e}")
            w.write(json.dumps({"text": text}) + "\n")
            n += 1
    import os
    os.replace(a.out + ".tmp", a.out)
    print(f"{n} dense documents -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Key→value recall in RULER's words, with keys and values of one token each: the data of the
miniature's second attempt (docs/RESULTS.md).

Attempt 1 used RULER's keys (`fierce-machine`, 8 tokens of the miniature's 1,024-token
vocabulary) and values (7 digits, one token each): matching a key meant matching a run of
tokens, and no base learned it. Here a key and a value are each one word that is one token of
the tokenizer; the two sets share no word, and neither holds a word of the sentences around them.
The sentences are RULER's niah, with "words" for "numbers":

  needle:   One of the special magic words for KEY is: VALUE.
  question: What is the special magic word for KEY mentioned in the provided text?
  answer:   The special magic word for KEY mentioned in the provided text is VALUE.

Two outputs:

  docs:  training documents ({"text": …} per line, what `rsd-data pack` reads): RULER's preamble,
         the bundled books with 1–6 needles at random places, then the question for one needle
         and the answer sentence of every needle, in random order, as long as the document stays
         within --max-tokens. Many answers per document: each is a recall to learn.
  items: evaluation items for `rsd-eval score --items`: niah_multikey_1's shape (four needles in
         the books, one asked for, at depth d of the haystack), the context ending with the
         answer prefix, the four values as candidates; the context fills LENGTH - 8 tokens.
         With --drill: drills (--docs --drill) cut before one of their answers, the drill's
         values as candidates. With --pairs N: pair lists cut before one repeated value.

The plainest form, --pairs N ("KEY VALUE." N times, then the same pairs in another order), is
what a base learns recall from first: an induction head (find the current token earlier, copy
what followed it) answers it, and RULER's sentences build on that (docs/RESULTS.md).

    python scripts/miniature_kv.py docs OUT.jsonl --docs 9900 --seed 1001 --max-tokens 255
    python scripts/miniature_kv.py docs OUT.jsonl --docs 9900 --seed 1003 --drill
    python scripts/miniature_kv.py items OUT.jsonl --lengths 1024,2048 --depths 11 --items 32 --seed 7
    python scripts/miniature_kv.py items OUT.jsonl --drill --items 64 --seed 77
    python scripts/miniature_kv.py docs OUT.jsonl --docs 40000 --seed 2001 --pairs 4
    python scripts/miniature_kv.py items OUT.jsonl --pairs 4 --items 64 --seed 79
"""
import argparse
import json
import os
import random
import sys

PREAMBLE = ("Some special magic words are hidden within the following text. Make sure to "
            "memorize it. I will quiz you about the words afterwards.\n")
NEEDLE = "One of the special magic words for {k} is: {v}."
QUESTION = "What is the special magic word for {k} mentioned in the provided text?"
ANSWER_PREFIX = "The special magic word for {k} mentioned in the provided text is"
# Tokens left after an evaluation context for the answer (rsd-eval's prompts leave the same).
ANSWER_ROOM = 8
# What stands between a key and its value in RULER's answer sentence: pair lists with a gap take
# the last words of it (scripts' --gap).
GAP_WORDS = ["mentioned", "in", "the", "provided", "text", "is"]


def template_words():
    text = " ".join([PREAMBLE, NEEDLE, QUESTION, ANSWER_PREFIX]).replace("{k}", "").replace("{v}", "")
    return {w.strip(".,:?!").lower() for w in text.split()}


def vocabulary(tok):
    """Keys and values: lowercase words of at least four letters that are one token after a
    space, and stay one token in the needle and the answer; none of the template's words.
    Sorted, then dealt alternately: keys and values share no word."""
    skip = template_words()
    words = sorted(w[1:] for w in tok.get_vocab() if w.startswith("\u0120") and w[1:].isalpha()
                   and w[1:].islower() and len(w) >= 5 and w[1:] not in skip)
    ok = []
    for w in words:
        one = tok.encode(" " + w, add_special_tokens=False).ids
        # In both sentences the word must stay that one token, as key and as value.
        if len(one) == 1 and all(
                tok.encode(s, add_special_tokens=False).ids.count(one[0]) == 2
                for s in (NEEDLE.format(k=w, v=w), ANSWER_PREFIX.format(k=w) + f" {w}.")):
            ok.append(w)
    return ok[0::2], ok[1::2]


def book_words(root):
    words = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".txt"):
            with open(os.path.join(root, name), encoding="utf-8") as f:
                words.extend(f.read().split())
    return words


class Maker:
    def __init__(self, tok, books, seed):
        self.tok = tok
        self.keys, self.values = vocabulary(tok)
        if len(self.keys) < 8 or len(self.values) < 8:
            sys.exit(f"the tokenizer has only {len(self.keys)} key and {len(self.values)} value words of one token")
        self.words = book_words(books)
        self.rng = random.Random(seed)

    def count(self, text, special=False):
        return len(self.tok.encode(text, add_special_tokens=special).ids)

    def pairs(self, n):
        return list(zip(self.rng.sample(self.keys, n), self.rng.sample(self.values, n)))

    def haystack(self, n):
        start = self.rng.randrange(len(self.words) - n - 1)
        return self.words[start:start + n]

    @staticmethod
    def insert(words, needles):
        """`words` with each (position, sentence) inserted before the word at that position."""
        out = list(words)
        for pos, sentence in sorted(needles, key=lambda p: -p[0]):
            out[pos:pos] = [sentence]
        return " ".join(out)

    def doc(self, max_tokens):
        """One training document within `max_tokens` (a packed row less its EOS)."""
        pairs = self.pairs(self.rng.randint(1, 6))
        asked = self.rng.choice(pairs)
        order = pairs[:]
        self.rng.shuffle(order)
        qa = "\n" + QUESTION.format(k=asked[0]) + " " + " ".join(
            ANSWER_PREFIX.format(k=k) + f" {v}." for k, v in [asked] + [p for p in order if p != asked])
        needles = [NEEDLE.format(k=k, v=v) for k, v in pairs]
        fixed = self.count(PREAMBLE + " ".join(needles) + qa)
        if fixed > max_tokens:
            return self.doc(max_tokens)
        n = max(0, (max_tokens - fixed) * 2 // 3)
        while True:
            hay = self.haystack(n)
            text = PREAMBLE + self.insert(hay, [(self.rng.randint(0, n), s) for s in needles]) + qa
            if self.count(text) <= max_tokens or n == 0:
                return text
            n = n * 9 // 10

    def pair_list(self, n, gap=0):
        """The plainest recall: `n` pairs as "KEY VALUE.", then the same pairs in another order.
        Each value's key sits right before it, so an induction head (find the current token
        earlier, copy what followed) recalls it. With `gap` g, the last g words of RULER's
        answer prefix ("… mentioned in the provided text is") stand between each key and its
        value, in both halves: the key must be carried forward over them."""
        pairs = self.pairs(n)
        order = pairs[:]
        self.rng.shuffle(order)
        words = GAP_WORDS[len(GAP_WORDS) - gap:] if gap else []
        entry = lambda k, v: " ".join([k, *words, v]) + "."  # noqa: E731
        return " ".join(entry(k, v) for k, v in pairs) + "\n" + " ".join(entry(k, v) for k, v in order)

    def pair_item(self, n, gap=0):
        """A held-out pair list cut before the value of one of its repeated pairs: the candidates
        are the list's values."""
        text = self.pair_list(n, gap)
        first, second = text.split("\n")
        repeated = second.rstrip(".").split(". ")
        k = self.rng.randrange(len(repeated))
        prefix, value = repeated[k].rsplit(" ", 1)
        values = [p.rsplit(" ", 1)[1] for p in first.rstrip(".").split(". ")]
        earlier = "".join(p + ". " for p in repeated[:k])
        return {"task": "kv_pairs", "depth": round(k / max(1, n - 1), 4),
                "context": first + "\n" + earlier + prefix,
                "candidates": [f" {v}" for v in values], "answer": f" {value}"}

    def drill(self, max_tokens, most=16):
        """A drill within `max_tokens`: needles without a haystack, then the answer sentence of
        each, in another order: as many pairs as fit, up to `most`."""
        pairs = self.pairs(most)
        order = pairs[:]
        self.rng.shuffle(order)
        best = None
        for n in range(1, len(pairs) + 1):
            asked = [p for p in order if p in pairs[:n]]
            text = " ".join(NEEDLE.format(k=k, v=v) for k, v in pairs[:n]) + "\n" + " ".join(
                ANSWER_PREFIX.format(k=k) + f" {v}." for k, v in asked)
            if self.count(text) > max_tokens:
                break
            best = text
        return best

    def drill_item(self, max_tokens, most=16):
        """A held-out drill cut before one of its answers: the candidates are the drill's values."""
        text = self.drill(max_tokens, most)
        needles, answers = text.split("\n")
        sentences = answers.split(". ")
        k = self.rng.randrange(len(sentences))
        prefix, value = sentences[k].rstrip(".").rsplit(" ", 1)
        values = [s.rsplit(" ", 1)[1].rstrip(".") for s in needles.split(". ")]
        earlier = ". ".join(sentences[:k]) + (". " if k else "")
        return {"task": "kv_drill", "depth": round(k / max(1, len(sentences) - 1), 4),
                "context": needles + "\n" + earlier + prefix,
                "candidates": [f" {v}" for v in values], "answer": f" {value}"}

    def item(self, length, depth):
        """niah_multikey_1's shape: four needles, the asked one at `depth` of the haystack."""
        pairs = self.pairs(4)
        asked = pairs[0]
        tail = "\n" + QUESTION.format(k=asked[0]) + " " + ANSWER_PREFIX.format(k=asked[0])
        needles = [NEEDLE.format(k=k, v=v) for k, v in pairs]
        budget = length - ANSWER_ROOM
        start = self.rng.randrange(len(self.words) - 4 * length)
        others = [self.rng.random() for _ in needles[1:]]

        def build(n):
            hay = self.words[start:start + n]
            at = [(round(depth * n), needles[0])] + [(round(f * n), s) for f, s in zip(others, needles[1:])]
            return PREAMBLE + self.insert(hay, at) + tail

        lo, hi = 0, 2 * length  # haystack words: the most that fit in the budget
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.count(build(mid), special=True) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return {"task": "kv_multikey", "length": length, "depth": depth,
                "context": build(lo), "candidates": [f" {v}" for _, v in pairs],
                "answer": f" {asked[1]}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("what", choices=["docs", "items", "words"])
    ap.add_argument("out", help="JSONL to write (words: - for standard output)")
    ap.add_argument("--tokenizer", default="assets/tokenizers/mini-1k/tokenizer.json")
    ap.add_argument("--books", default="corpus/books", help="the haystack: a directory of .txt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--docs", type=int, default=9900, help="docs: documents to write")
    ap.add_argument("--drill", action="store_true",
                    help="docs: drills, needles without a haystack, then every answer sentence; "
                         "items: --items held-out drills, each cut before one answer")
    ap.add_argument("--pairs", type=int, default=0,
                    help="docs: pair lists of this many pairs (KEY VALUE. …, then again in another order); "
                         "items: --items held-out pair lists, each cut before one repeated value")
    ap.add_argument("--gap", type=int, default=0,
                    help="--pairs: the last GAP words of RULER's answer prefix between each key and "
                         "its value (docs: each list draws its gap from 0..GAP; items: exactly GAP)")
    ap.add_argument("--most", type=int, default=16, help="docs --drill: needles per drill, at most")
    ap.add_argument("--max-tokens", type=int, default=255, help="docs: tokens a document may take")
    ap.add_argument("--lengths", default="256", help="items: context lengths, comma-separated")
    ap.add_argument("--depths", type=int, default=11, help="items: depths 0, 1/(n-1), …, 1")
    ap.add_argument("--items", type=int, default=32, help="items: per length and depth")
    a = ap.parse_args()
    from tokenizers import Tokenizer
    m = Maker(Tokenizer.from_file(a.tokenizer), a.books, a.seed)
    if a.what == "words":
        print(json.dumps({"keys": m.keys, "values": m.values}))
        return
    tmp = a.out + ".tmp"
    with open(tmp, "w") as w:
        if a.what == "docs":
            for _ in range(a.docs):
                if a.pairs:
                    text = m.pair_list(a.pairs, m.rng.randint(0, a.gap) if a.gap else 0)
                elif a.drill:
                    text = m.drill(a.max_tokens, a.most)
                else:
                    text = m.doc(a.max_tokens)
                w.write(json.dumps({"text": text}) + "\n")
        elif a.pairs:
            for _ in range(a.items):
                w.write(json.dumps(m.pair_item(a.pairs, a.gap)) + "\n")
        elif a.drill:
            for _ in range(a.items):
                w.write(json.dumps(m.drill_item(a.max_tokens, a.most)) + "\n")
        else:
            for length in (int(x) for x in a.lengths.split(",")):
                for i in range(a.depths):
                    depth = round(i / (a.depths - 1), 4) if a.depths > 1 else 0.5
                    for _ in range(a.items):
                        w.write(json.dumps(m.item(length, depth)) + "\n")
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()

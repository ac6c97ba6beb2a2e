#!/usr/bin/env python3
"""Writes corpus/chat/: the small bundled chat set for SFT tests and examples.

Conversations in the messages format of Tulu-v3 (`{"messages": [{"role", "content"}, …]}`),
generated from a fixed seed so the files are reproducible: arithmetic, capitals, spelling words
backwards and counting letters; some with a system message, some with two or three turns.
`train.jsonl` and `heldout.jsonl` share no conversation.

    python3 scripts/make_chat_corpus.py            # rewrites corpus/chat/{train,heldout}.jsonl
"""
import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "corpus" / "chat"
CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Canada": "Ottawa",
    "Egypt": "Cairo", "Norway": "Oslo", "Chile": "Santiago", "India": "New Delhi",
    "Spain": "Madrid", "Italy": "Rome", "Ghana": "Accra", "Cuba": "Havana", "Iran": "Tehran",
    "Poland": "Warsaw", "Greece": "Athens", "Mexico": "Mexico City", "Brazil": "Brasília",
    "Vietnam": "Hanoi", "Portugal": "Lisbon",
}
WORDS = ["river", "garden", "planet", "window", "silver", "candle", "forest", "bridge", "rocket",
         "pencil", "marble", "thunder", "harbor", "lantern", "meadow", "violin", "copper", "falcon"]
SYSTEMS = ["You are a helpful assistant.", "Answer briefly.", "You are a careful tutor."]


def turn(rng):
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randrange(2, 60), rng.randrange(2, 60)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if kind == 1:
        country = rng.choice(sorted(CAPITALS))
        return f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}."
    word = rng.choice(WORDS)
    if kind == 2:
        return f"Spell the word {word} backwards.", f"{word} backwards is {word[::-1]}."
    letter = rng.choice(sorted(set(word)))
    n = word.count(letter)
    return (f"How many times does the letter {letter} appear in {word}?",
            f"The letter {letter} appears {n} time{'s' if n != 1 else ''} in {word}.")


def conversation(rng):
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        q, a = turn(rng)
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return {"messages": messages}


def main():
    rng = random.Random(20261126)
    seen, rows = set(), []
    while len(rows) < 1100:
        c = conversation(rng)
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            rows.append(c)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, part in [("train.jsonl", rows[:1000]), ("heldout.jsonl", rows[1000:])]:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part)
        (OUT / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

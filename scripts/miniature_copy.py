"""Copy documents for the miniature's base: twelve random 7-digit numbers, then the same twelve
again, one document per line ({"text": …}, what `rsd-data pack` reads). Repeating random digit
strings is what teaches a small model to copy (docs/RESULTS.md, the pilots of attempt 1).

    python scripts/miniature_copy.py OUT.jsonl --docs 9900 --seed 5
"""
import argparse
import json
import os
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSONL of {\"text\": …} documents")
    ap.add_argument("--docs", type=int, required=True, help="documents to write")
    ap.add_argument("--numbers", type=int, default=12, help="numbers per repeated sequence")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shuffle", action="store_true",
                    help="repeat the numbers in another order, so that copying one must find it "
                         "by its first digits, not at a fixed distance back")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.out + ".tmp", "w") as w:
        for _ in range(a.docs):
            nums = [str(rng.randrange(10**6, 10**7)) for _ in range(a.numbers)]
            again = nums[:]
            if a.shuffle:
                rng.shuffle(again)
            w.write(json.dumps({"text": f"{' '.join(nums)}.\n{' '.join(again)}."}) + "\n")
    os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes examples/data/arith-mix.jsonl: a small, deterministic mix of arithmetic problems for
the built-in `dataset` environment (standard library only; the same file on every run).

Rows: {"id", "prompt", "answer", "data_source", "level"} with three data sources:
  arith/int       integer sums, differences and products       (answer "82")
  arith/fraction  sums and differences of two fractions         (answer "7/12", lowest terms)
  arith/choice    multiple choice with four options A-D          (answer "B")

Scored per source, e.g.:

    [environment.options]
    path = "data/arith-mix.jsonl"
    held_out_fraction = 0.1
    [environment.options.sources]
    "arith/int" = { verifier = "last_integer" }
    "arith/fraction" = { verifier = "math" }
    "arith/choice" = { verifier = "choice" }

Usage: python3 scripts/make-example-data.py [OUTPUT]   (default examples/data/arith-mix.jsonl)
"""

import json
import random
import sys
from fractions import Fraction
from pathlib import Path

SEED = 2026
PER_SOURCE = 100


def integer_row(rng, level):
    a, b = rng.randint(2, 10 ** (level + 1)), rng.randint(2, 10 ** (level + 1))
    op = rng.choice("+-*" if level > 0 else "+-")
    if op == "*":
        a, b = rng.randint(2, 30), rng.randint(2, 30)
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    word = {"+": "+", "-": "-", "*": "times"}[op]
    return f"What is {a} {word} {b}? Answer with an integer.", str(value)


def fraction_row(rng, level):
    top = 3 + 3 * level
    x = Fraction(rng.randint(1, top), rng.randint(2, top + 1))
    y = Fraction(rng.randint(1, top), rng.randint(2, top + 1))
    op = rng.choice("+-")
    value = x + y if op == "+" else x - y
    answer = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    text = f"What is {x} {op} {y}? Give the answer as a fraction in lowest terms."
    return text, answer


def choice_row(rng, level):
    a, b = rng.randint(2, 12 + 8 * level), rng.randint(2, 12)
    value = a * b
    options = {value}
    while len(options) < 4:
        options.add(value + rng.choice([-1, 1]) * rng.randint(1, max(3, b)))
    options = sorted(options)
    rng.shuffle(options)
    letters = "ABCD"
    lines = "\n".join(f"{letters[i]}. {o}" for i, o in enumerate(options))
    text = f"What is {a} times {b}?\n{lines}\nAnswer with the letter of the correct option."
    return text, letters[options.index(value)]


def rows():
    rng = random.Random(SEED)
    makers = [("arith/int", integer_row), ("arith/fraction", fraction_row), ("arith/choice", choice_row)]
    seen = set()
    out = []
    for i in range(PER_SOURCE * len(makers)):
        source, make = makers[i % len(makers)]
        level = rng.randint(0, 2)
        prompt, answer = make(rng, level)
        while prompt in seen:
            prompt, answer = make(rng, level)
        seen.add(prompt)
        out.append({"id": f"mix-{i:04d}", "prompt": prompt, "answer": answer, "data_source": source, "level": level})
    return out


def main():
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "examples/data/arith-mix.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8", newline="\n") as f:
        for row in rows():
            f.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()

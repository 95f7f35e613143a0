"""Train the digits CNNs whose weights ship with hooklab (src/hooklab/weights/), and write them.

Notebooks 05 and its solutions load these weights (``hooklab.models.trained_digits_cnn``) instead
of training in the notebook: a few hundred Adam steps turn the last-bit differences between
CPUs into visibly different networks, and the numbers printed from a trained network must be
the same on every machine. Training itself is repeatable on one machine with a fixed seed and
thread count; ``tests/test_trained_weights.py`` retrains and checks that the result is as good as what
ships.

    make env && .venv/bin/python tools/train_digits.py     # rewrites both weight files
"""

from __future__ import annotations

import argparse
import sys

import torch

from hooklab.data import digits
from hooklab.models import HEADS, DigitsCNN, accuracy, train_digits, weights_path

#: how both shipped networks are trained
RECIPE = {"epochs": 12, "seed": 0}


def train(head: str) -> DigitsCNN:
    torch.set_num_threads(1)
    return train_digits(DigitsCNN(head=head), epochs=RECIPE["epochs"], seed=RECIPE["seed"], progress=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("heads", nargs="*", help=f"any of {', '.join(HEADS)} (default: all)")
    args = parser.parse_args(argv)
    if unknown := set(args.heads) - set(HEADS):
        parser.error(f"unknown head {', '.join(sorted(unknown))}: choose from {', '.join(HEADS)}")
    data = digits()
    for head in args.heads or HEADS:
        model = train(head)
        torch.save(model.state_dict(), weights_path(head))
        print(f"{head}: test accuracy {accuracy(model, data.x_test, data.y_test):.2%} -> {weights_path(head).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

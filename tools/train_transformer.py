"""Train the small transformer whose weights ship with hooklab (src/hooklab/weights/), and write them.

Lesson 08 loads these weights (``hooklab.transformer.trained_transformer``) instead of training in the
notebook, so that the printed numbers are the same on every machine. The task is induction (a
sequence of random tokens, repeated: ``hooklab.transformer.induction_batch``); the model predicts the
second half from the first. Training is repeatable on one machine with a fixed seed and thread count;
``tests/test_transformer.py`` retrains and checks that the result is as good as what ships.

    make env && .venv/bin/python tools/train_transformer.py     # rewrites the weight file
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from hooklab.transformer import TinyTransformer, induction_accuracy, induction_batch, induction_mask, weights_path

#: how the shipped network is trained
RECIPE = {"steps": 800, "batch": 64, "lr": 1e-3, "weight_decay": 0.01, "seed": 0}


def train(steps: int = RECIPE["steps"]) -> TinyTransformer:
    """AdamW on fresh random batches; the loss is next-token cross-entropy where the run is repeated."""
    torch.set_num_threads(1)
    model = TinyTransformer(seed=RECIPE["seed"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=RECIPE["lr"], weight_decay=RECIPE["weight_decay"])
    generator = torch.Generator().manual_seed(RECIPE["seed"])
    for _ in range(steps):
        tokens = induction_batch(RECIPE["batch"], generator)
        mask = induction_mask(tokens)
        loss = F.cross_entropy(model(tokens)[:, :-1][mask], tokens[:, 1:][mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def held_out_tokens() -> torch.Tensor:
    """1,000 sequences that training never draws from (another seed)."""
    return induction_batch(1000, torch.Generator().manual_seed(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    model = train()
    torch.save(model.state_dict(), weights_path())
    print(f"induction accuracy {induction_accuracy(model, held_out_tokens()):.3f}: wrote {weights_path().name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

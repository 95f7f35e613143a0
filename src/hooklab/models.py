"""The small models the course keeps coming back to.

* ``TinySigmoidNet``: the 2-2-2 sigmoid network with fixed weights whose gradients notebook 04
  works out by hand (one bias shared by both units of a layer, as in the classic worked example).
* ``TinyConvNet``: conv 3×3 → ReLU(inplace) → conv 1×1 → ReLU(inplace), weights from a seed.
* ``DigitsCNN``: a small CNN for 8×8 digits; ``head="gap"`` (global average pooling, the
  default) or ``head="flatten"`` (the cautionary Grad-CAM example of notebook 05).
* ``train_digits``: trains a ``DigitsCNN`` in seconds, bit-for-bit repeatable with a fixed seed
  and thread count on one machine (other CPUs add up floats in another order and end elsewhere).
* ``trained_digits_cnn``: the one trained with ``train_digits``' defaults, from weights that ship
  with hooklab, so that it is the same network on every machine.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .checks import whole_number
from .data import Digits, digits

__all__ = ["DigitsCNN", "TinyConvNet", "TinySigmoidNet", "accuracy", "train_digits", "trained_digits_cnn"]

HEADS = ("gap", "flatten")


class TinySigmoidNet(nn.Module):
    """2 inputs → Linear → Sigmoid → Linear → Sigmoid, with the fixed weights of notebook 04."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 2)
        self.s1 = nn.Sigmoid()
        self.fc2 = nn.Linear(2, 2)
        self.s2 = nn.Sigmoid()
        with torch.no_grad():
            # weight[j, i]: from input i to unit j, laid out so that the forward pass gives the classic
            # worked example's numbers (net_h1 = 0.3775); one bias shared by both units of a layer, as there
            self.fc1.weight = nn.Parameter(torch.tensor([[0.15, 0.20], [0.25, 0.30]]))
            self.fc1.bias = nn.Parameter(torch.tensor([0.35]))
            self.fc2.weight = nn.Parameter(torch.tensor([[0.40, 0.45], [0.50, 0.55]]))
            self.fc2.bias = nn.Parameter(torch.tensor([0.60]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.s2(self.fc2(self.s1(self.fc1(x))))


class TinyConvNet(nn.Module):
    """conv 3×3 (1→2) → ReLU(inplace) → conv 1×1 (2→1) → ReLU(inplace); weights from ``seed``."""

    def __init__(self, seed: int = 0, inplace: bool = True) -> None:
        super().__init__()
        with torch.random.fork_rng():  # weights from `seed`; the caller's random stream stays as it was
            torch.manual_seed(seed)
            self.conv1 = nn.Conv2d(1, 2, kernel_size=3)
            self.relu1 = nn.ReLU(inplace=inplace)
            self.conv2 = nn.Conv2d(2, 1, kernel_size=1)
            self.relu2 = nn.ReLU(inplace=inplace)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu2(self.conv2(self.relu1(self.conv1(x))))


class DigitsCNN(nn.Module):
    """conv16–ReLU–conv32–ReLU–maxpool–conv64–ReLU–head, for (N, 1, 8, 8) digits.

    The input must be a batch of one-channel images (the ``"flatten"`` head: 8×8 ones); another
    shape raises ``ValueError`` at once, not from deep inside a layer.
    """

    def __init__(self, head: str = "gap", seed: int = 0) -> None:
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"head must be 'gap' or 'flatten', not {head!r}")
        self.input_size = None if head == "gap" else (8, 8)  # the spatial size the head needs
        with torch.random.fork_rng():  # weights from `seed`; the caller's random stream stays as it was
            torch.manual_seed(seed)
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(16, 32, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 3, padding=1),
                nn.ReLU(),
            )
            if head == "gap":
                self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
            else:
                self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 4 * 4, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor) and (x.dim() != 4 or x.shape[1] != 1 or
                                            (self.input_size is not None and x.shape[2:] != self.input_size)):
            _bad_input(x)
        return self.head(self.features(x))


def _bad_input(x: torch.Tensor) -> None:
    shape = tuple(x.shape)
    hint = ": add a batch dimension with x[None]" if x.dim() == 3 and shape[0] == 1 else ""
    hint = ": add batch and channel dimensions with x[None, None]" if x.dim() == 2 else hint
    raise ValueError(f"DigitsCNN expects (N, 1, 8, 8), got {shape}{hint}")


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of ``x`` that ``model`` classifies as ``y`` (model switched to eval and back)."""
    if len(x) != len(y) or not len(y):
        raise ValueError(f"accuracy needs as many labels as images, at least one: got {len(x)} images, {len(y)} labels")
    was_training = model.training
    model.eval()
    correct = (model(x).argmax(dim=1) == y).sum().item()
    model.train(was_training)
    return correct / len(y)


def train_digits(
    model: nn.Module | None = None,
    data: Digits | None = None,
    epochs: int = 12,
    batch_size: int = 32,
    lr: float = 5e-3,
    seed: int = 0,
    progress: bool = True,
) -> nn.Module:
    """Train ``model`` (default: a new ``DigitsCNN``) with Adam; returns it in eval mode.

    Repeatable bit for bit on one machine for a fixed seed and thread count; another CPU adds up
    floats in another order, and after a few hundred steps ends at other weights (which is why
    ``trained_digits_cnn`` ships its weights). ``progress`` shows a progress bar in a notebook and
    prints one line per epoch. To watch training, wrap the call in ``hooklab.stats.track_stats``.
    """
    whole_number("epochs", epochs, 0)
    whole_number("batch_size", batch_size, 1)
    model = DigitsCNN() if model is None else model
    data = digits() if data is None else data
    if not len(data.y_train):
        raise ValueError("data holds no training images: pass a Digits with at least one")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    n = len(data.y_train)
    steps_per_epoch = (n + batch_size - 1) // batch_size
    bar = _progress_bar(epochs * steps_per_epoch) if progress else None
    step = 0
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(n, generator=generator)
        total = 0.0
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            loss = loss_fn(model(data.x_train[idx]), data.y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
            step += 1
            if bar is not None:
                bar.value = step
        if progress:
            acc = accuracy(model, data.x_test, data.y_test)
            print(f"epoch {epoch + 1}/{epochs}  train loss {total / n:.4f}  test accuracy {acc:.2%}")
    model.eval()
    return model


def _progress_bar(total: int):
    """An ipywidgets progress bar inside a notebook, nothing elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import display
        from ipywidgets import IntProgress
    except ImportError:  # pragma: no cover
        return None
    if get_ipython() is None:
        return None
    bar = IntProgress(value=0, min=0, max=total, description="training")
    display(bar)
    return bar


def weights_path(head: str = "gap") -> Path:
    """Where the trained weights of a ``DigitsCNN(head=head)`` ship with hooklab."""
    if head not in HEADS:
        raise ValueError(f"head must be 'gap' or 'flatten', not {head!r}")
    return Path(__file__).with_name("weights") / f"digits_cnn_{head}.pt"


def trained_digits_cnn(head: str = "gap") -> DigitsCNN:
    """A ``DigitsCNN`` trained on ``digits()`` (12 epochs of Adam, seed 0), in eval mode.

    The weights ship with hooklab (``tools/train_digits.py`` wrote them): training for a few
    hundred steps turns the last-bit differences between CPUs into visibly different networks,
    and the numbers printed from a trained network should be the same on every machine.
    """
    model = DigitsCNN(head=head)
    model.load_state_dict(torch.load(weights_path(head), weights_only=True))
    return model.eval()

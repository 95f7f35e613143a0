"""Data that ships with installed packages: the course never downloads anything.

* ``digits()``: scikit-learn's 1,797 handwritten 8×8 digits, split once with a fixed seed.
* ``photo()``: a real photo from scikit-image (the CC0 cat "chelsea" by default), resized and
  normalised the way torchvision's ImageNet models expect.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["digits", "photo", "to_display"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DIGITS, CLASSES = 1797, 10  # scikit-learn's digits: images and classes


class Digits(NamedTuple):
    x_train: torch.Tensor  # (N, 1, 8, 8), pixel values scaled to [0, 1]
    y_train: torch.Tensor  # (N,) int64 labels 0..9
    x_test: torch.Tensor
    y_test: torch.Tensor


def digits(test_fraction: float = 0.25, seed: int = 0) -> Digits:
    """scikit-learn's digits as tensors, split into train and test with a fixed, stratified seed.

    test_fraction: the share of the 1,797 digits in the test set, leaving at least 10 (one per
    class) on each side; seed: a whole number from 0 to 2**32 - 1.
    """
    _check_split(test_fraction, seed)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None]
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, bunch.target, test_size=test_fraction, random_state=seed, stratify=bunch.target
    )
    return Digits(
        torch.from_numpy(x_tr), torch.from_numpy(y_tr).long(), torch.from_numpy(x_te), torch.from_numpy(y_te).long()
    )


def _check_split(test_fraction: float, seed: int) -> None:
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real):
        raise TypeError(f"test_fraction must be a number between 0 and 1, not {test_fraction!r}")
    n_test = math.ceil(test_fraction * DIGITS) if 0 < test_fraction < 1 else 0
    if not CLASSES <= n_test <= DIGITS - CLASSES:
        low, high = CLASSES / DIGITS, 1 - CLASSES / DIGITS
        raise ValueError(f"test_fraction must leave at least {CLASSES} of the {DIGITS} digits (one per class) on each "
                         f"side of the split: between {low:.4f} and {high:.4f}, not {test_fraction}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be a whole number from 0 to 2**32 - 1, not {seed!r}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be a whole number from 0 to 2**32 - 1, not {seed}")


def photo(name: str = "chelsea", size: int = 224) -> torch.Tensor:
    """A photo shipped with scikit-image as a normalised ``(1, 3, size, size)`` float tensor.

    ``name`` is a function of ``skimage.data``: ``"chelsea"`` (a cat, CC0), ``"astronaut"``
    (NASA, public domain) or ``"coffee"`` (CC0). The photo is centre-cropped to a square first.
    """
    from skimage import data as skdata

    allowed = ("chelsea", "astronaut", "coffee")
    if name not in allowed:
        raise ValueError(f"unknown photo {name!r}; choose one of {', '.join(allowed)}")
    image = getattr(skdata, name)()
    h, w = image.shape[:2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    image = image[top : top + side, left : left + side]
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float().div(255.0)[None]
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def to_display(x: torch.Tensor) -> np.ndarray:
    """Undo ``photo``'s normalisation: ``(1, 3, H, W)`` tensor -> ``(H, W, 3)`` array in [0, 1]."""
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (x[0].detach() * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()

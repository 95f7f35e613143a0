"""What the explorers and the Grad-CAM tools check before any work, so that a wrong argument gets a
message saying what to do instead of an error from deep inside torch or matplotlib.

* ``check_inputs(model, x, what)``: ``x`` an ``(N, C, H, W)`` floating-point batch of the model's
  dtype and device, and no BatchNorm or Dropout of the model in train mode.
* ``class_scores``, ``wanted_targets``, ``targets_for``: the model's output as ``(N, classes)``
  scores and the class index per image (``None``: the predicted class), each checked.
* ``check_index``: an int in range (a channel, an image); ``whole_number``: a count or size
  setting; ``drawn``: draw on a figure and close it
  (if pyplot made it) when drawing fails; ``new_figure``: the same on a new pyplot or bare figure.
"""

from __future__ import annotations

import numbers
import operator

import torch
from torch import nn

#: layers that behave differently in train mode
_TRAIN_MODE = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LazyBatchNorm1d, nn.LazyBatchNorm2d,
               nn.LazyBatchNorm3d, nn.SyncBatchNorm, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d,
               nn.AlphaDropout, nn.FeatureAlphaDropout)


def check_inputs(model: nn.Module, x, what: str) -> None:
    """Raise, naming what to do, unless ``x`` is a batch the model takes and the model is in eval mode."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} takes a tensor of images (N, C, H, W), got {type(x).__name__}")
    if x.dim() != 4:
        hint = ": add a batch dimension with x[None]" if x.dim() == 3 else ""
        raise ValueError(f"{what} takes a batch of images (N, C, H, W), got shape {tuple(x.shape)}{hint}")
    if len(x) == 0:
        raise ValueError(f"{what} got an empty batch: pass at least one image")
    if not x.is_floating_point():
        raise TypeError(f"{what} takes floating-point images, got {x.dtype}: convert them with x.float()")
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    if param is not None and x.dtype != param.dtype:
        raise TypeError(f"the images are {x.dtype} but the model's parameters are {param.dtype}: "
                        f"convert them with x.to({param.dtype})")
    if param is not None and x.device != param.device:
        raise ValueError(f"the images are on {x.device} but the model is on {param.device}: "
                         f"move them with x.to('{param.device}')")
    for name, module in model.named_modules():
        if module.training and isinstance(module, _TRAIN_MODE) and getattr(module, "p", 1) != 0:
            change = "drop other units" if hasattr(module, "p") else "normalise by the batch and update its statistics"
            raise ValueError(f"model is in train mode; call model.eval() first (its {type(module).__name__} "
                             f"{name!r} would {change} on every pass)")


def class_scores(output, n: int) -> torch.Tensor:
    """The model's output as (N, classes) scores, or a ValueError saying what the output was."""
    if not isinstance(output, torch.Tensor) or output.dim() < 2 or output.shape[0] != n:
        got = f"shape {tuple(output.shape)}" if isinstance(output, torch.Tensor) else f"a {type(output).__name__}"
        raise ValueError(f"the model must return an (N, classes) tensor of scores; for {n} images it gave {got}")
    return output.flatten(1)


def wanted_targets(target, n: int) -> torch.Tensor | None:
    """``target`` as a tensor of class indices (checked against the batch size ``n``), or None."""
    if target is None:
        return None
    try:
        wanted = torch.as_tensor(target)
    except (TypeError, ValueError, RuntimeError):
        wanted = None
    if wanted is None or wanted.dtype == torch.bool or wanted.is_floating_point() or wanted.is_complex():
        raise TypeError(f"target must be a class index (int), or one per image, got {target!r}")
    if wanted.dim() > 1 or (wanted.dim() == 1 and len(wanted) != n):
        raise ValueError(f"target has {len(wanted) if wanted.dim() == 1 else tuple(wanted.shape)} entries "
                         f"for a batch of {n} images: pass one class index, or one per image")
    return wanted.long().expand(n) if wanted.dim() == 0 else wanted.long()


def targets_for(scores: torch.Tensor, wanted: torch.Tensor | None) -> torch.Tensor:
    """Class index per image: the checked ``wanted`` ones, or (None) the argmax."""
    if wanted is None:
        return scores.argmax(dim=1)
    classes = scores.shape[1]
    outside = wanted[(wanted < 0) | (wanted >= classes)]
    if len(outside):
        raise IndexError(f"target {int(outside[0])} is out of range: the model gives {classes} class scores "
                         f"(0..{classes - 1})")
    return wanted.to(scores.device)


def drawn(fig, draw):
    """``draw(fig)`` and return ``fig``; a pyplot figure is closed if drawing fails."""
    import matplotlib.pyplot as plt

    try:
        draw(fig)
    except BaseException:
        plt.close(fig)
        raise
    return fig


def new_figure(pyplot: bool, draw, **kwargs):
    """``draw(fig)`` on a new figure of ``kwargs`` and return it: a pyplot figure (``plt.show()``
    displays it; closed again if drawing fails), or a bare ``Figure`` that pyplot does not track."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    return drawn((plt.figure if pyplot else Figure)(**kwargs), draw)


def check_index(value, count: int, what: str, items: str) -> int:
    """``value`` as an int in ``0..count - 1``, or a TypeError / IndexError naming the range."""
    try:
        if isinstance(value, bool):
            raise TypeError
        index = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})") from None
    if not 0 <= index < count:
        raise IndexError(f"{what} {index} is out of range for {count} {items} (0..{count - 1})")
    return index


def whole_number(label: str, value, low: int, none_ok: bool = False) -> int | None:
    """``value`` as an int >= ``low`` (or None where allowed), else a TypeError / ValueError."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{label} must be a whole number{' or None' if none_ok else ''}, not {value!r}")
    if value < low:
        raise ValueError(f"{label} must be at least {low}{' (or None)' if none_ok else ''}, not {value}")
    return int(value)

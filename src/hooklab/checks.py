"""What the explorers and the Grad-CAM tools check before any work, so that a wrong argument gets a
message saying what to do instead of an error from deep inside torch or matplotlib.

* ``check_inputs(model, x, what)``: ``x`` an ``(N, C, H, W)`` floating-point batch of the model's
  dtype and device (not ``meta``), with as many channels as the model's first convolution takes,
  and no BatchNorm or Dropout of the model in train mode; a warning if ``x`` holds NaN or inf
  (``not_finite`` says where).
* ``short(value)``: a value as errors show it, a tensor by shape and dtype, never its numbers.
* ``class_scores``, ``wanted_targets``, ``targets_for``: the model's output as ``(N, classes)``
  scores and the class index per image (``None``: the predicted class), each checked.
* ``check_index``: an int in range (a channel, an image); ``whole_number``: a count or size
  setting; ``drawn``: draw on a figure and close it
  (if pyplot made it) when drawing fails; ``new_figure``: the same on a new pyplot or bare figure.
"""

from __future__ import annotations

import numbers
import operator
import reprlib
import warnings

import torch
from torch import nn

#: layers that behave differently in train mode
_TRAIN_MODE = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LazyBatchNorm1d, nn.LazyBatchNorm2d,
               nn.LazyBatchNorm3d, nn.SyncBatchNorm, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d,
               nn.AlphaDropout, nn.FeatureAlphaDropout)


def short(value) -> str:
    """``value`` as an error message shows it: a tensor by its shape and dtype (``a float32 tensor of
    shape (2, 1, 8, 8)``), a module by its type, anything else by a ``repr`` cut to about 60 characters."""
    if isinstance(value, torch.Tensor):
        where = "" if value.device.type == "cpu" else f" on {value.device}"
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}{where}"
    if isinstance(value, nn.Module):
        return f"a {type(value).__name__} module"
    return _SHORT.repr(value)


_SHORT = reprlib.Repr()  # what short() shows of other values
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlist = _SHORT.maxtuple = 6


def non_finite_kinds(x: torch.Tensor) -> str | None:
    """``"NaN"``, ``"inf"`` or ``"NaN and inf"``: what ``x`` holds besides finite numbers, or None."""
    kinds = [k for k, found in (("NaN", x.isnan().any()), ("inf", x.isinf().any())) if found]
    return " and ".join(kinds) or None


def not_finite(x: torch.Tensor) -> str | None:
    """Where ``x`` (a batch) holds NaN or inf, in words (``"NaN in 1 value of image 0"``), or None."""
    kinds = non_finite_kinds(x)
    if kinds is None:
        return None
    bad = ~x.isfinite()
    images = bad.flatten(1).any(dim=1).nonzero().flatten().tolist()
    which = f"image {images[0]}" if len(images) == 1 else f"{len(images)} images (first: {images[0]})"
    count = int(bad.sum())
    return f"{kinds} in {count} value{'s' if count > 1 else ''} of {which}"


def first_conv(model: nn.Module) -> tuple[str, nn.Conv2d] | None:
    """The model's first ``nn.Conv2d`` (in the order the model declares its layers) and its name."""
    return next(((n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)), None)


def _check_channels(model: nn.Module, x: torch.Tensor) -> None:
    """Raise if the images have a number of channels that the model's first convolution does not take
    (and no other convolution takes either: a model may declare its layers in another order)."""
    found = first_conv(model)
    if found is None or isinstance(found[1], nn.modules.lazy.LazyModuleMixin):
        return
    name, conv = found
    channels = x.shape[1]
    if conv.in_channels == channels or any(
            isinstance(m, nn.Conv2d) and m.in_channels == channels for m in model.modules()):
        return
    wants = conv.in_channels
    if channels == 1 and wants == 3:
        fix = "repeat the grey channel: x.expand(-1, 3, -1, -1)"
    elif channels == 3 and wants == 1:
        fix = "make them grey: x.mean(dim=1, keepdim=True)"
    elif channels == 4 and wants == 3:
        fix = "drop the alpha channel: x[:, :3]"
    else:
        fix = f"give it images with {wants} channels"
    raise ValueError(f"{type(model).__name__} wants {wants} channel{'s' if wants > 1 else ''} (its first convolution "
                     f"{name!r} takes {wants}), but the images have {channels}: {fix}")


def check_inputs(model: nn.Module, x, what: str) -> None:
    """Raise, naming what to do, unless ``x`` is a batch the model takes and the model is in eval mode;
    warn if ``x`` holds NaN or inf (every score computed from it would be NaN)."""
    if not isinstance(x, torch.Tensor):
        swapped = f" {x!r}: is it a layer name? check the order of the arguments" if isinstance(x, str) else ""
        raise TypeError(f"{what} takes a tensor of images (N, C, H, W), got {type(x).__name__}{swapped}")
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
    for holder, device in (("model's weights", param.device if param is not None else None), ("images", x.device)):
        if device is not None and device.type == "meta":
            fix = ("load real weights: model.to_empty(device='cpu'), then model.load_state_dict(...)"
                   if holder != "images" else "make the images from real data (e.g. torch.rand(...), or a dataset)")
            raise ValueError(f"the {holder} are on the 'meta' device: meta tensors hold no data (only their shapes), "
                             f"so there is nothing to compute with; {fix}")
    if param is not None and x.device != param.device:
        raise ValueError(f"the images are on {x.device} but the model is on {param.device}: "
                         f"move them with x.to('{param.device}')")
    for name, module in model.named_modules():
        if module.training and isinstance(module, _TRAIN_MODE) and getattr(module, "p", 1) != 0:
            change = "drop other units" if hasattr(module, "p") else "normalise by the batch and update its statistics"
            raise ValueError(f"model is in train mode; call model.eval() first (its {type(module).__name__} "
                             f"{name!r} would {change} on every pass)")
    _check_channels(model, x)
    where = not_finite(x)
    if where is not None:
        warnings.warn(f"the input holds {where}: every score and gradient computed from it will be NaN; "
                      "replace those values first, e.g. x.nan_to_num(0.0)", stacklevel=3)


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
        raise TypeError(f"target must be a class index (int), or one per image, got {short(target)}")
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
        raise TypeError(f"{what} must be an int, got {short(value)} ({type(value).__name__})") from None
    if not 0 <= index < count:
        raise IndexError(f"{what} {index} is out of range for {count} {items} (0..{count - 1})")
    return index


def whole_number(label: str, value, low: int, none_ok: bool = False) -> int | None:
    """``value`` as an int >= ``low`` (or None where allowed), else a TypeError / ValueError."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{label} must be a whole number{' or None' if none_ok else ''}, not {short(value)}")
    if value < low:
        raise ValueError(f"{label} must be at least {low}{' (or None)' if none_ok else ''}, not {value}")
    return int(value)

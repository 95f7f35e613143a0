"""The argument checks of ``hooklab.backprop.layers``, kept apart so that the formulas read on their own.

A hand-written backward that gets a ``dout`` of the wrong shape would often broadcast it into a
wrong answer without any error; ``check_dout`` refuses it, naming the function and both shapes.
Every function of ``hooklab.backprop.layers`` calls it or one of the checks here (flatten and dropout,
whose output shape is not known from their arguments, compare sizes or the mask's shape).
"""

from __future__ import annotations

import math
import numbers


def pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def check_dout(function: str, dout, expected) -> None:
    """``dout`` is dL/d(output): it must have the shape of the forward output, ``expected``."""
    if tuple(dout.shape) != tuple(expected):
        raise ValueError(f"{function}: dout has shape {tuple(dout.shape)} but the forward output has shape "
                         f"{tuple(expected)}; dout is dL/d(output), one number per output element")


def pooled_size(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    """Output length of a conv / pooling window along one axis (``ceil_mode=False``)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def check_linear(x, w, dout) -> None:
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear_backward: x has {x.shape[-1]} features but w {tuple(w.shape)} takes {w.shape[1]}")
    check_dout("linear_backward", dout, (*x.shape[:-1], w.shape[0]))


def same_padding(kernel, dilation) -> tuple[int, ...] | None:
    """The padding of ``padding="same"`` per side, or None when it would be uneven (even kernels)."""
    total = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
    return None if any(t % 2 for t in total) else tuple(t // 2 for t in total)


def check_conv2d(x, w, dout, stride, padding, dilation, groups) -> tuple[int, int]:
    """Check the shapes of a conv; returns ``padding`` as two ints (``"valid"``: 0, ``"same"``: the
    padding that keeps the size, refused when it is uneven)."""
    kernel = w.shape[-2:]
    if padding == "valid":
        padding = 0
    elif padding == "same":
        padding = same_padding(kernel, dilation)  # conv2d_backward passes it as a pair
        if padding is None:
            raise ValueError("conv2d_backward: padding='same' with an even kernel pads unevenly (more on one side); "
                             "pad the input with F.pad and pass padding=0")
    elif isinstance(padding, str):
        raise ValueError(f"conv2d_backward: padding must be an int, a pair, 'valid' or 'same', not {padding!r}")
    padding = pair(padding)
    if x.dim() != 4 or x.shape[1] != w.shape[1] * groups or w.shape[0] % groups:
        raise ValueError(f"conv2d_backward: x {tuple(x.shape)} and w {tuple(w.shape)} with groups={groups} do not "
                         "fit: x must be (N, C, H, W) with C = w.shape[1] * groups")
    size = [pooled_size(x.shape[i + 2], kernel[i], stride[i], padding[i], dilation[i]) for i in range(2)]
    check_dout("conv2d_backward", dout, (x.shape[0], w.shape[0], *size))
    return padding


def check_layer_norm(x, dout, normalized_shape) -> tuple[int, ...]:
    """Check the shapes of a layer norm; returns ``normalized_shape`` as a tuple."""
    normalized = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(x.shape[x.dim() - len(normalized):]) != normalized:
        raise ValueError(f"layer_norm_backward: normalized_shape {normalized} is not the last dims of x "
                         f"{tuple(x.shape)}")
    check_dout("layer_norm_backward", dout, x.shape)
    return normalized


def check_flatten(x_shape, dout) -> None:
    if dout.numel() != math.prod(x_shape):
        raise ValueError(f"flatten_backward: dout has shape {tuple(dout.shape)} ({dout.numel()} elements) but the "
                         f"input shape {tuple(x_shape)} has {math.prod(x_shape)}; dout is dL/d(output)")


def check_dropout(mask, dout, p) -> None:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p <= 1:
        raise ValueError(f"dropout_backward: p is the probability of dropping an element, in [0, 1], not {p!r}")
    if tuple(mask.shape) != tuple(dout.shape):
        raise ValueError(f"dropout_backward: mask has shape {tuple(mask.shape)} but dout {tuple(dout.shape)}; both "
                         "are shaped like the layer's output")

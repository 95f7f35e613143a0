"""The table from layer type to its hand-written backward (notebook 04), used by ``hooklab.backprop.verify``.

``BACKWARD[type(module)](module, x, out, dout) -> (dx, {parameter name: gradient})``: each
entry reads the layer's settings (stride, padding, eps, running statistics, ...) from
``module`` and calls the matching function of ``hooklab.backprop.layers`` with the layer's recorded
input ``x``, output ``out`` and ``dout = dL/d(out)``. A parameter gradient is ``None`` where the
layer has no such parameter. A setting the formulas do not cover raises
``UnsupportedLayerError``; ``SETTINGS`` checks those from the module alone, so that
``check_supported`` refuses them before anything runs (the entries check them again: they can be
called on their own). To support another layer type, add one entry here (and one to ``SETTINGS``
if some of its settings have no formula).
"""

from __future__ import annotations

from torch import nn

from . import layers as bp
from .shapes import same_padding


class UnsupportedLayerError(TypeError):
    """A layer (or a setting of it) that ``hooklab.backprop`` has no formula for."""


def _linear(m, x, out, dout):
    dx, dw, db = bp.linear_backward(x, m.weight, dout, m.bias)
    return dx, {"weight": dw, "bias": db}


def _conv2d_settings(m):
    """Raise for the Conv2d settings the formula does not cover (``conv2d_backward`` resolves
    ``padding="valid"`` and ``"same"`` itself)."""
    if m.padding_mode != "zeros":
        raise UnsupportedLayerError(f"padding_mode={m.padding_mode!r}")
    if m.padding == "same" and same_padding(m.kernel_size, m.dilation) is None:
        raise UnsupportedLayerError("padding='same' with uneven padding")


def _conv2d(m, x, out, dout):
    _conv2d_settings(m)
    dx, dw, db = bp.conv2d_backward(x, m.weight, dout, m.bias, m.stride, m.padding, m.dilation, m.groups)
    return dx, {"weight": dw, "bias": db}


def _max_pool2d_settings(m):
    if m.return_indices:
        raise UnsupportedLayerError("return_indices=True")


def _avg_pool2d_settings(m):
    if m.ceil_mode:
        raise UnsupportedLayerError("ceil_mode=True")


def _max_pool2d(m, x, out, dout):
    _max_pool2d_settings(m)
    return bp.max_pool2d_backward(x, dout, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode), {}


def _avg_pool2d(m, x, out, dout):
    _avg_pool2d_settings(m)
    return bp.avg_pool2d_backward(x.shape, dout, m.kernel_size, m.stride, m.padding, m.count_include_pad,
                                  m.divisor_override), {}


def _batch_norm(m, x, out, dout):
    batch_stats = m.training or m.running_mean is None
    stats = (None, None) if batch_stats else (m.running_mean, m.running_var)
    dx, dw, db = bp.batch_norm_backward(x, m.weight, dout, m.eps, *stats)
    return dx, {"weight": dw, "bias": db}


def _layer_norm(m, x, out, dout):
    dx, dw, db = bp.layer_norm_backward(x, dout, m.normalized_shape, m.weight, m.bias, m.eps)
    return dx, {"weight": dw, "bias": db}


def _dropout(m, x, out, dout):
    if not m.training or m.p == 0:
        return dout, {}
    if (x == 0).any():
        raise ValueError("the mask can't be read where the input is 0: pass the replayed mask (see verify)")
    return bp.dropout_backward(out != 0, dout, m.p), {}


BACKWARD = {
    nn.Linear: _linear,
    nn.Sigmoid: lambda m, x, out, dout: (bp.sigmoid_backward(out, dout), {}),
    nn.Tanh: lambda m, x, out, dout: (bp.tanh_backward(out, dout), {}),
    nn.ReLU: lambda m, x, out, dout: (bp.relu_backward(out, dout), {}),
    nn.LeakyReLU: lambda m, x, out, dout: (bp.leaky_relu_backward(out, dout, m.negative_slope), {}),
    nn.Conv2d: _conv2d,
    nn.MaxPool2d: _max_pool2d,
    nn.AvgPool2d: _avg_pool2d,
    nn.AdaptiveAvgPool2d: lambda m, x, out, dout: (bp.adaptive_avg_pool2d_backward(x.shape, dout), {}),
    nn.BatchNorm1d: _batch_norm,
    nn.BatchNorm2d: _batch_norm,
    nn.LayerNorm: _layer_norm,
    nn.Flatten: lambda m, x, out, dout: (bp.flatten_backward(x.shape, dout), {}),
    nn.Dropout: _dropout,
    nn.Identity: lambda m, x, out, dout: (dout, {}),
}


#: per layer type, a check that raises ``UnsupportedLayerError`` for a setting without a formula
SETTINGS = {nn.Conv2d: _conv2d_settings, nn.MaxPool2d: _max_pool2d_settings, nn.AvgPool2d: _avg_pool2d_settings}


def check_supported(model: nn.Module, layers: dict[str, nn.Module]) -> None:
    """Raise ``UnsupportedLayerError`` naming every layer in ``layers`` (name → leaf module) whose
    type has no entry in ``BACKWARD`` or whose settings it does not cover (``SETTINGS``), and every
    parameter of ``model`` that no such layer owns; nothing needs to run for this."""
    problems = [f"{name!r} ({type(m).__name__})" for name, m in layers.items() if type(m) not in BACKWARD]
    settings = []
    for name, m in layers.items():
        try:
            SETTINGS.get(type(m), lambda m: None)(m)
        except UnsupportedLayerError as e:
            settings.append(f"layer {name!r} ({type(m).__name__}): {e}")
    owned = {id(p) for m in layers.values() for p in m.parameters()}
    stray = [n for n, p in model.named_parameters() if id(p) not in owned]
    message = []
    if problems:
        supported = ", ".join(sorted(t.__name__ for t in BACKWARD))
        message.append(f"no manual backward for layer {', '.join(problems)}; supported types: {supported}")
    message.extend(settings)
    if stray:
        message.append(f"parameters outside any leaf layer: {', '.join(stray)}")
    if message:
        raise UnsupportedLayerError("; ".join(message))

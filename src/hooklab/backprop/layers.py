"""Backward passes written by hand, one plain function per layer type (notebook 04).

Each function takes what the forward pass saw (inputs, or the output where that is enough)
and ``dout``, the gradient of the final scalar with respect to the layer's output, and returns
the gradients with respect to the layer's input and parameters, in the order
``(dx, dweight, dbias)``. Nothing here calls ``backward()``: the point is that every formula
can be read, and checked against autograd (``tests/test_backprop.py`` does so in float64).

The local derivative of each layer, written next to its forward:

* linear ``y = x Wᵀ + b``: ``dx = dout W``, ``dW = doutᵀ x``, ``db = dout`` summed to ``b``'s shape
  (a bias of shape ``[1]`` shared by every unit gets ``dout.sum()``).
* sigmoid ``s``: ``dx = dout·s·(1 − s)``; tanh ``t``: ``dx = dout·(1 − t²)``.
* ReLU / LeakyReLU: ``dout`` where the output is positive, else 0 (or ``slope·dout``). Read from
  the *output*, so an in-place ReLU, whose input was overwritten, is handled too.
* conv2d: a linear layer applied to every patch (``F.unfold``); the patch gradients are added
  back into place with ``F.fold``.
* max pooling sends each window's gradient to the input that won it; average pooling spreads
  it evenly over the window.
* batch norm / layer norm: the normalised ``x̂`` and ``1/σ`` are recomputed from the input.
* flatten: a reshape back; dropout: ``dout·mask/(1 − p)`` with the mask of that call.

Every function checks that ``dout`` has the shape of the forward output (a smaller ``dout``
would otherwise broadcast into a wrong answer) and raises ``ValueError`` naming both shapes.

Losses are in ``hooklab.backprop.losses``; the table from layer type to function is
``hooklab.backprop.table.BACKWARD`` (used by ``hooklab.backprop.verify``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import shapes


def linear_backward(x, w, dout, b=None):
    """``y = x @ w.T + b`` → ``(dx, dw, db)``; ``db`` is None without a bias."""
    shapes.check_linear(x, w, dout)
    x2, d2 = x.reshape(-1, x.shape[-1]), dout.reshape(-1, dout.shape[-1])
    dx = dout @ w
    dw = d2.T @ x2
    db = None if b is None else dout.sum_to_size(b.shape)
    return dx, dw, db


def sigmoid_backward(out, dout):
    """``out = sigmoid(x)`` → ``dx = dout * out * (1 - out)``, multiplied in PyTorch's order
    (``dout * (1 - out) * out``) so that float32 results agree to the last bit."""
    shapes.check_dout("sigmoid_backward", dout, out.shape)
    return dout * (1 - out) * out


def tanh_backward(out, dout):
    """``out = tanh(x)`` → ``dx = dout * (1 - out²)``."""
    shapes.check_dout("tanh_backward", dout, out.shape)
    return dout * (1 - out * out)


def relu_backward(out, dout):
    """``out = relu(x)`` → ``dout`` where ``out > 0``, else 0 (works for in-place ReLU)."""
    shapes.check_dout("relu_backward", dout, out.shape)
    return dout * (out > 0)


def leaky_relu_backward(out, dout, negative_slope=0.01):
    """``out = leaky_relu(x)`` → ``dout`` where ``out > 0``, else ``negative_slope * dout``."""
    shapes.check_dout("leaky_relu_backward", dout, out.shape)
    return torch.where(out > 0, dout, dout * negative_slope)


def conv2d_backward(x, w, dout, b=None, stride=1, padding=0, dilation=1, groups=1):
    """``y = conv2d(x, w, b, stride, padding, dilation, groups)`` → ``(dx, dw, db)``.

    Every output position is a dot product of ``w`` with one patch of ``x``. ``F.unfold``
    lays the patches out as columns, so the conv is a matrix product per group and its
    backward is a linear layer's; ``F.fold`` adds each patch's gradient back into place
    (overlapping patches add up, padding is dropped).
    """
    kernel, stride, dilation = w.shape[-2:], shapes.pair(stride), shapes.pair(dilation)
    padding = shapes.check_conv2d(x, w, dout, stride, padding, dilation, groups)
    n = x.shape[0]
    out_ch, l_out = w.shape[0], dout.shape[-2] * dout.shape[-1]
    cols = F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)  # (N, C*kh*kw, L)
    cols = cols.reshape(n, groups, -1, l_out)
    d = dout.reshape(n, groups, out_ch // groups, l_out)
    wg = w.reshape(groups, out_ch // groups, -1)
    dw = torch.einsum("ngol,ngkl->gok", d, cols).reshape(w.shape)
    dcols = torch.einsum("gok,ngol->ngkl", wg, d).reshape(n, -1, l_out)
    dx = F.fold(dcols, x.shape[-2:], kernel, dilation=dilation, padding=padding, stride=stride)
    db = None if b is None else dout.sum(dim=(0, 2, 3))
    return dx, dw, db


def max_pool2d_backward(x, dout, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """``y = max_pool2d(x, ...)`` → ``dx``: each window's gradient goes to its maximum.

    The forward is re-run to learn which input won each window (the first one on ties, as
    PyTorch does); overlapping windows that share a winner add their gradients.
    """
    stride = kernel_size if stride is None else stride
    _, idx = F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)
    shapes.check_dout("max_pool2d_backward", dout, idx.shape)
    dx = torch.zeros_like(x).flatten(2)
    dx.scatter_add_(2, idx.flatten(2), dout.flatten(2))
    return dx.reshape(x.shape)


def avg_pool2d_backward(x_shape, dout, kernel_size, stride=None, padding=0, count_include_pad=True,
                        divisor_override=None):
    """``y = avg_pool2d(x, ...)`` (``ceil_mode=False``) → ``dx``: ``dout / window size`` to every input
    of the window. The divisor counts padding only if ``count_include_pad``."""
    kernel = shapes.pair(kernel_size)
    stride = kernel if stride is None else shapes.pair(stride)
    padding = shapes.pair(padding)
    h, w = x_shape[-2:]
    size = [shapes.pooled_size(n, k, s, p) for n, k, s, p in zip((h, w), kernel, stride, padding, strict=True)]
    shapes.check_dout("avg_pool2d_backward", dout, (*x_shape[:-2], *size))
    l_out = dout.shape[-2] * dout.shape[-1]
    if divisor_override:
        divisor = torch.full((l_out,), float(divisor_override), dtype=dout.dtype)
    elif count_include_pad:
        divisor = torch.full((l_out,), float(kernel[0] * kernel[1]), dtype=dout.dtype)
    else:  # count the real (unpadded) inputs in each window
        ones = torch.ones(1, 1, h, w, dtype=dout.dtype)
        divisor = F.unfold(ones, kernel, padding=padding, stride=stride).sum(1)[0]
    d = (dout.flatten(2) / divisor).flatten(0, 1).unsqueeze(1)  # (N*C, 1, L)
    dcols = d.expand(-1, kernel[0] * kernel[1], -1)
    dx = F.fold(dcols, (h, w), kernel, padding=padding, stride=stride)
    return dx.reshape(x_shape)


def _adaptive_matrix(size_in: int, size_out: int, dtype) -> torch.Tensor:
    """(size_out, size_in) averaging matrix of adaptive pooling: window i is
    ``[floor(i·n/m), ceil((i+1)·n/m))``."""
    m = torch.zeros(size_out, size_in, dtype=dtype)
    for i in range(size_out):
        start, end = (i * size_in) // size_out, -((-(i + 1) * size_in) // size_out)
        m[i, start:end] = 1.0 / (end - start)
    return m


def adaptive_avg_pool2d_backward(x_shape, dout):
    """``y = adaptive_avg_pool2d(x, size)`` → ``dx = A_hᵀ · dout · A_w`` (the pooling is
    ``A_h · x · A_wᵀ`` with one averaging matrix per axis). The output size is read from ``dout``."""
    shapes.check_dout("adaptive_avg_pool2d_backward", dout, (*x_shape[:-2], *dout.shape[-2:]))
    a_h = _adaptive_matrix(x_shape[-2], dout.shape[-2], dout.dtype)
    a_w = _adaptive_matrix(x_shape[-1], dout.shape[-1], dout.dtype)
    return a_h.T @ dout @ a_w


def batch_norm_backward(x, weight, dout, eps=1e-5, running_mean=None, running_var=None):
    """Batch norm over channel dim 1 → ``(dx, dweight, dbias)``; ``weight`` is γ (None without one).

    The arguments come in the order of notebook 04's exercise, ``batch_norm_backward(x, gamma, dout,
    eps)``, and of the other formulas here: input, parameter, ``dout``.

    Train mode (no running stats given): the batch statistics are recomputed from ``x``;
    ``dx = w/σ · (dout − mean(dout) − x̂·mean(dout·x̂))`` with means over every dim but 1.
    Eval mode (running stats given): a fixed affine map, ``dx = dout·w/σ_running``.
    """
    shapes.check_dout("batch_norm_backward", dout, x.shape)
    dims = [d for d in range(x.dim()) if d != 1]
    shape = [1, -1] + [1] * (x.dim() - 2)
    if running_mean is None:
        mean, var = x.mean(dims, keepdim=True), x.var(dims, unbiased=False, keepdim=True)
    else:
        mean, var = running_mean.reshape(shape), running_var.reshape(shape)
    inv_std = torch.rsqrt(var + eps)
    x_hat = (x - mean) * inv_std
    g = dout if weight is None else dout * weight.reshape(shape)
    if running_mean is None:
        dx = inv_std * (g - g.mean(dims, keepdim=True) - x_hat * (g * x_hat).mean(dims, keepdim=True))
    else:
        dx = g * inv_std
    dweight = None if weight is None else (dout * x_hat).sum(dims)
    dbias = None if weight is None else dout.sum(dims)
    return dx, dweight, dbias


def layer_norm_backward(x, dout, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer norm over the last ``len(normalized_shape)`` dims → ``(dx, dweight, dbias)``;
    the same formula as batch norm in train mode, with the means taken over those dims."""
    normalized_shape = shapes.check_layer_norm(x, dout, normalized_shape)
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    lead = tuple(range(x.dim() - len(normalized_shape)))
    mean, var = x.mean(dims, keepdim=True), x.var(dims, unbiased=False, keepdim=True)
    inv_std = torch.rsqrt(var + eps)
    x_hat = (x - mean) * inv_std
    g = dout if weight is None else dout * weight
    dx = inv_std * (g - g.mean(dims, keepdim=True) - x_hat * (g * x_hat).mean(dims, keepdim=True))
    dweight = None if weight is None else (dout * x_hat).sum(lead)
    dbias = None if bias is None else dout.sum(lead)
    return dx, dweight, dbias


def flatten_backward(x_shape, dout):
    """``y = x.flatten(...)`` → ``dout`` reshaped to the input's shape."""
    shapes.check_flatten(x_shape, dout)
    return dout.reshape(x_shape)


def dropout_backward(mask, dout, p):
    """``y = x·(mask/(1 − p))`` in training → ``dx = dout·(mask/(1 − p))``; ``mask`` is 1 where an
    element was kept (in eval mode dropout is the identity: pass an all-ones mask and ``p=0``).

    The mask is not an input of the layer: read it from the recorded call (``out != 0`` where
    ``x != 0``; ambiguous where ``x == 0``) or replay the call's random numbers, as
    ``hooklab.backprop.verify`` does. ``p`` is in [0, 1] (with ``p = 1`` every element is dropped)."""
    shapes.check_dropout(mask, dout, p)
    return dout * (mask / (1 - p)) if p < 1 else torch.zeros_like(dout)

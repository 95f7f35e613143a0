"""Check a whole network's backward pass against hand-written formulas (notebook 04).

``verify(model, x, ...)`` runs one forward and backward inside ``hooklab.record(model,
backward=True)``, then, for every recorded layer call, recomputes ``grad_input`` from the
recorded input, output and ``grad_output`` with the functions of ``hooklab.backprop``, and each
parameter's gradient (summed over calls). Every tensor gets one row of a ``cmp``-style table:

    tensor                    shape          exact  allclose  max |diff|
    conv1.grad_input          (1, 1, 3, 3)   True   True      0.0e+00

* reference for ``grad_input``: the recorder's value (autograd's gradient at that layer);
  for parameters and the loss: ``torch.autograd.grad`` (``.grad`` fields are left alone).
* ``exact`` is ``torch.equal``; ``allclose`` is ``torch.allclose`` at the float32 tolerances
  of ``torch.testing.assert_close`` (``rtol=1.3e-6, atol=1e-5``). A manual formula that adds
  the same numbers in another order is close, not exact; the table says so.
* A leaf layer whose type has no entry in ``BACKWARD`` (or an unsupported setting) raises
  ``UnsupportedLayerError`` naming it, before anything runs. Parameters that no leaf layer
  owns are refused the same way. Operations written inside a ``forward`` between layers
  (``x + 1``, ``torch.flatten``) are not checked, but do not disturb the per-layer checks.
* Dropout's mask is recovered by replaying the forward with the same seed and each Dropout's
  input replaced by ones (its output is then the scaled mask). Buffers such as batch norm's
  running statistics are restored afterwards, and the global random state is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import backprop as bp
from . import losses
from .layers import select_layers
from .record import NoGradientError, record

__all__ = ["BACKWARD", "Row", "UnsupportedLayerError", "Verification", "compare", "verify"]

RTOL, ATOL = 1.3e-6, 1e-5


class UnsupportedLayerError(TypeError):
    """A layer (or a setting of it) that ``hooklab.backprop`` has no formula for."""


@dataclass(frozen=True)
class Row:
    name: str
    shape: tuple
    exact: bool
    close: bool
    max_diff: float

    def line(self, width: int = 26) -> str:
        return (f"{self.name:<{width}} {self.shape!s:<14} {self.exact!s:<6} {self.close!s:<9} "
                f"{self.max_diff:.1e}")


def compare(name: str, manual: torch.Tensor, reference: torch.Tensor) -> Row:
    """makemore's ``cmp``: is ``manual`` exactly / closely equal to ``reference``, and how far off?"""
    if manual.shape != reference.shape:
        raise ValueError(f"{name}: manual shape {tuple(manual.shape)} != reference {tuple(reference.shape)}")
    diff = (manual - reference).abs().max().item() if manual.numel() else 0.0
    return Row(name, tuple(reference.shape), torch.equal(manual, reference),
               torch.allclose(manual, reference, rtol=RTOL, atol=ATOL), diff)


@dataclass
class Verification:
    rows: list[Row]
    notes: list[str]

    @property
    def ok(self) -> bool:
        """Every tensor matched (exactly or within tolerance)."""
        return all(r.close for r in self.rows)

    def table(self) -> str:
        width = max([26] + [len(r.name) + 1 for r in self.rows])
        head = f"{'tensor':<{width}} {'shape':<14} {'exact':<6} {'allclose':<9} max |diff|"
        return "\n".join([head] + [r.line(width) for r in self.rows] + self.notes)

    def __str__(self) -> str:
        return self.table()


# ----- the table: layer type -> (module, x, out, dout) -> (dx, {parameter name: grad}) ---------
def _linear(m, x, out, dout):
    dx, dw, db = bp.linear_backward(x, m.weight, dout, m.bias)
    return dx, {"weight": dw, "bias": db}


def _conv2d(m, x, out, dout):
    if m.padding_mode != "zeros":
        raise UnsupportedLayerError(f"padding_mode={m.padding_mode!r}")
    padding = m.padding
    if isinstance(padding, str):
        total = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size, strict=True)]
        if padding == "valid":
            padding = 0
        elif all(t % 2 == 0 for t in total):
            padding = tuple(t // 2 for t in total)
        else:
            raise UnsupportedLayerError("padding='same' with uneven padding")
    dx, dw, db = bp.conv2d_backward(x, m.weight, dout, m.bias, m.stride, padding, m.dilation, m.groups)
    return dx, {"weight": dw, "bias": db}


def _max_pool2d(m, x, out, dout):
    if m.return_indices:
        raise UnsupportedLayerError("return_indices=True")
    return bp.max_pool2d_backward(x, dout, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode), {}


def _avg_pool2d(m, x, out, dout):
    if m.ceil_mode:
        raise UnsupportedLayerError("ceil_mode=True")
    return bp.avg_pool2d_backward(x.shape, dout, m.kernel_size, m.stride, m.padding, m.count_include_pad,
                                  m.divisor_override), {}


def _batch_norm(m, x, out, dout):
    batch_stats = m.training or m.running_mean is None
    stats = (None, None) if batch_stats else (m.running_mean, m.running_var)
    dx, dw, db = bp.batch_norm_backward(x, dout, m.weight, m.eps, *stats)
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


def _check_supported(model: nn.Module, layers: dict[str, nn.Module]) -> None:
    problems = [f"{name!r} ({type(m).__name__})" for name, m in layers.items() if type(m) not in BACKWARD]
    owned = {id(p) for m in layers.values() for p in m.parameters()}
    stray = [n for n, p in model.named_parameters() if id(p) not in owned]
    message = []
    if problems:
        supported = ", ".join(sorted(t.__name__ for t in BACKWARD))
        message.append(f"no manual backward for layer {', '.join(problems)}; supported types: {supported}")
    if stray:
        message.append(f"parameters outside any leaf layer: {', '.join(stray)}")
    if message:
        raise UnsupportedLayerError("; ".join(message))


def _dropout_noise(model, x, layers, seed) -> dict[tuple[str, int], torch.Tensor]:
    """Replay the forward with the same seed, each Dropout fed ones: its output is mask/(1 − p)."""
    names = [n for n, m in layers.items() if isinstance(m, nn.Dropout) and m.training and m.p > 0]
    if not names:
        return {}
    handles = [layers[n].register_forward_pre_hook(lambda m, args: (torch.ones_like(args[0]),)) for n in names]
    try:
        with torch.random.fork_rng(), torch.no_grad(), record(model, names) as rec:
            torch.manual_seed(seed)
            model(x)
    finally:
        for h in handles:
            h.remove()
    return {(r.name, r.call): r.output for r in rec}


def verify(model: nn.Module, x: torch.Tensor, *, target: torch.Tensor | None = None, loss: str | None = None,
           grad: torch.Tensor | None = None, seed: int = 0) -> Verification:
    """Verify every leaf layer of ``model`` on input ``x``; see the module docstring.

    loss: ``None`` (backward from ``grad``, default all ones), ``"mse"`` or ``"cross_entropy"``
        (with ``target``); the loss's gradient is checked too.
    """
    if loss not in (None, "mse", "cross_entropy"):
        raise ValueError(f"loss must be None, 'mse' or 'cross_entropy', not {loss!r}")
    layers = select_layers(model)
    _check_supported(model, layers)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    x = x.detach().clone().requires_grad_(True)
    rows, notes = [], []
    try:
        noise = _dropout_noise(model, x, layers, seed)
        with torch.random.fork_rng(), record(model, backward=True) as rec:
            torch.manual_seed(seed)
            out = model(x)
            wrt = [out, x, *(p for _, p in params)]
            if loss is None:
                start = torch.ones_like(out) if grad is None else grad
                grads = torch.autograd.grad(out, wrt, start, allow_unused=True)
            else:
                value = F.mse_loss(out, target) if loss == "mse" else F.cross_entropy(out, target)
                grads = torch.autograd.grad(value, wrt, allow_unused=True)
                backward = losses.mse_backward if loss == "mse" else losses.softmax_cross_entropy_backward
                rows.append(compare(f"{loss}: d output", backward(out.detach(), target), grads[0]))
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(buffers[n])
    manual: dict[str, torch.Tensor] = {}
    per_layer: dict[str, list[Row]] = {}
    for r in rec:
        module = layers[r.name]
        label = r.name if r.call == 0 else f"{r.name}[call {r.call}]"
        try:
            dout = r.grad_output[0]
        except NoGradientError:
            notes.append(f"{label}: no gradient reached it, nothing to compare")
            continue
        x_in, y = r.inputs[0], r.output
        if (r.name, r.call) in noise:
            x_in, y = torch.ones_like(x_in), noise[(r.name, r.call)]
        try:
            with torch.no_grad():  # the formulas need no graph of their own
                dx, pgrads = BACKWARD[type(module)](module, x_in, y, dout)
        except UnsupportedLayerError as e:
            raise UnsupportedLayerError(f"layer {r.name!r} ({type(module).__name__}): {e}") from None
        if r.grad_input[0] is not None:
            per_layer.setdefault(r.name, []).append(compare(f"{label}.grad_input", dx, r.grad_input[0]))
        for pname, g in pgrads.items():
            if g is not None:
                key = f"{r.name}.{pname}" if r.name else pname
                manual[key] = manual[key] + g if key in manual else g
    for (name, _), reference in zip(params, grads[2:], strict=True):
        if name in manual and reference is not None:
            layer = name.rpartition(".")[0]
            per_layer.setdefault(layer, []).append(compare(f"{name}.grad", manual[name], reference))
    for name in rec.names:
        rows.extend(per_layer.get(name, []))
    return Verification(rows, notes)

"""Check a whole network's backward pass against hand-written formulas (notebook 04).

``verify(model, x, ...)`` runs one forward and backward inside ``hooklab.record(model,
backward=True)``, then, for every recorded layer call, recomputes ``grad_input`` from the
recorded input, output and ``grad_output`` with the functions of ``hooklab.backprop.layers``, and each
parameter's gradient (summed over calls). Every tensor gets one row of a table like the ``cmp``
helper of Karpathy's makemore lecture "Becoming a backprop ninja":

    tensor             shape         exact  allclose  max |diff|
    conv1.grad_input   (1, 1, 3, 3)  True   True      0
    conv1.weight.grad  (2, 1, 3, 3)  False  True      < 1e-05

* reference for ``grad_input``: the recorder's value (autograd's gradient at that layer);
  for parameters and the loss: ``torch.autograd.grad`` (``.grad`` fields are left alone).
* ``exact`` is ``torch.equal``; ``allclose`` is ``torch.allclose`` at the tolerances that
  ``torch.testing.assert_close`` uses for the dtype (float32: ``rtol=1.3e-6, atol=1e-5``;
  float64: ``rtol=1e-7, atol=1e-7``). A manual formula that adds the same numbers in another
  order is close, not exact; the table says so.
* ``max |diff|`` is printed as ``0`` when exact and as the bound ``< atol`` when close and
  smaller than ``atol``: the digits of such a difference are float rounding, and they change
  with the CPU's instruction set (AVX-512, AVX2, SSE kernels add in different orders). Any
  other difference is printed as it is; ``Row.max_diff`` always holds the exact value.
* The formulas are looked up by layer type in ``hooklab.backprop.table.BACKWARD``.
  A leaf layer whose type has no entry there (or an unsupported setting) raises
  ``UnsupportedLayerError`` naming it, before anything runs. Bad arguments (a loss without
  target, a target without loss, ``grad`` with a loss, NaN or inf in the input) raise
  ``ValueError`` or ``TypeError``, also before anything runs. Parameters that no leaf layer
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

from ..hooks import Hooks
from ..layers import select_layers
from ..recording import NoGradientError, record
from . import losses
from .table import BACKWARD, UnsupportedLayerError, check_supported

# (rtol, atol) of torch.testing.assert_close, by dtype; other dtypes are compared exactly
TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing tensors of ``dtype``."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


@dataclass(frozen=True)
class Row:
    name: str
    shape: tuple
    exact: bool
    close: bool
    max_diff: float
    atol: float = TOLERANCES[torch.float32][1]

    @property
    def diff_text(self) -> str:
        """``max_diff`` as printed: ``0`` if exact, ``< atol`` for rounding-sized differences, else the value."""
        if self.exact:
            return "0"
        if self.close and self.max_diff < self.atol:
            return f"< {self.atol:.0e}"
        return f"{self.max_diff:.1e}"

    def line(self, width: int = 26, shape_width: int = 15) -> str:
        """One table line; ``width`` and ``shape_width`` are the first two columns' widths."""
        return (f"{self.name:<{width}} {self.shape!s:<{shape_width}} {self.exact!s:<6} {self.close!s:<9} "
                f"{self.diff_text}")


def compare(name: str, manual: torch.Tensor, reference: torch.Tensor) -> Row:
    """Like makemore's ``cmp``: is ``manual`` exactly / closely equal to ``reference``, and how far off?

    Both must be tensors of the same shape and dtype (compare float32 with float32: a float64
    formula compared with a float32 gradient would measure the rounding of float32). The
    tolerances are those of the dtype (``tolerances``)."""
    for label, t in (("manual", manual), ("reference", reference)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {label} must be a tensor, not {type(t).__name__}")
    if manual.dtype != reference.dtype:
        raise TypeError(f"{name}: manual dtype {manual.dtype} != reference {reference.dtype}: compute both in the "
                        f"same dtype (convert one with .to({reference.dtype}))")
    if manual.shape != reference.shape:
        raise ValueError(f"{name}: manual shape {tuple(manual.shape)} != reference {tuple(reference.shape)}")
    diff = (manual - reference).abs().max().item() if manual.numel() else 0.0
    rtol, atol = tolerances(reference.dtype)
    return Row(name, tuple(reference.shape), torch.equal(manual, reference),
               torch.allclose(manual, reference, rtol=rtol, atol=atol), diff, atol)


@dataclass
class Verification:
    rows: list[Row]
    notes: list[str]

    @property
    def ok(self) -> bool:
        """Every tensor matched (exactly or within tolerance)."""
        return all(r.close for r in self.rows)

    def table(self) -> str:
        """The rows under a header, columns aligned, one space or more between them; notes last."""
        width = max([len("tensor")] + [len(r.name) for r in self.rows]) + 1
        shape_width = max([len("shape")] + [len(str(r.shape)) for r in self.rows]) + 1
        head = f"{'tensor':<{width}} {'shape':<{shape_width}} {'exact':<6} {'allclose':<9} max |diff|"
        return "\n".join([head] + [r.line(width, shape_width) for r in self.rows] + self.notes)

    def __str__(self) -> str:
        return self.table()


def _dropout_noise(model, x, layers, seed) -> dict[tuple[str, int], torch.Tensor]:
    """Replay the forward with the same seed, each Dropout fed ones: its output is mask/(1 − p)."""
    names = [n for n, m in layers.items() if isinstance(m, nn.Dropout) and m.training and m.p > 0]
    if not names:
        return {}
    with Hooks() as hooks, torch.random.fork_rng(), torch.no_grad(), record(model, names) as rec:
        for n in names:
            hooks.add(layers[n].register_forward_pre_hook(lambda m, args: (torch.ones_like(args[0]),)))
        torch.manual_seed(seed)
        model(x)
    return {(r.name, r.call): r.output for r in rec}


def _one_value_per_channel(module: nn.Module, args: tuple) -> None:
    """Forward pre-hook on a batch norm in training mode: refuse a batch it cannot normalise."""
    x = args[0]
    if x.numel() == x.shape[1]:
        raise ValueError("batch norm in training mode needs more than one value per channel to compute batch "
                         "statistics: verify with a batch of 2 or more, or call model.eval() first")


def _check_arguments(model, x, target, loss, grad, seed) -> None:
    """Every argument of ``verify`` that can be judged before anything runs."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    if loss not in (None, "mse", "cross_entropy"):
        raise ValueError(f"loss must be None, 'mse' or 'cross_entropy', not {loss!r}")
    if loss is not None and target is None:
        what = "a tensor shaped like the output" if loss == "mse" else "class indices, one per row of the output"
        raise ValueError(f"loss={loss!r} needs target=... ({what})")
    if loss is None and target is not None:
        raise ValueError("target is only used by a loss: pass loss='mse' or loss='cross_entropy' with it, or drop it")
    if loss is not None and grad is not None:
        raise ValueError("grad is where the backward starts when loss=None; with a loss the backward starts from "
                         "the loss: pass grad or loss, not both")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int (it seeds the dropout masks), not {seed!r}")
    for label, t in (("x", x), ("target", target), ("grad", grad)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{label} must be a tensor, not {type(t).__name__}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{label} contains NaN or inf values: every gradient would be NaN, whatever the formulas")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor (verify needs its gradient), not {x.dtype}: use x.float()")
    dtype = next((p.dtype for p in model.parameters()), x.dtype)
    if x.dtype != dtype:
        raise TypeError(f"x is {x.dtype} but the model's parameters are {dtype}: convert x with x.to({dtype})")


def _check_output(out, target, loss, grad) -> None:
    if grad is not None and grad.shape != out.shape:
        raise ValueError(f"grad has shape {tuple(grad.shape)} but the model's output has shape {tuple(out.shape)}: "
                         "grad is dL/d(output), one number per output element")
    if loss == "mse" and target.shape != out.shape:
        raise ValueError(f"target has shape {tuple(target.shape)} but the model's output has shape "
                         f"{tuple(out.shape)}: loss='mse' compares them element by element")


def verify(model: nn.Module, x: torch.Tensor, *, target: torch.Tensor | None = None, loss: str | None = None,
           grad: torch.Tensor | None = None, seed: int = 0) -> Verification:
    """Verify every leaf layer of ``model`` on input ``x``; see the module docstring.

    loss: ``None`` (backward from ``grad``, default all ones, shaped like the output), ``"mse"``
        or ``"cross_entropy"`` (with ``target``, and without ``grad``); the loss's gradient is
        checked too. Inputs with NaN or inf are refused: the table could only blame a formula.
    """
    _check_arguments(model, x, target, loss, grad, seed)
    layers = select_layers(model)
    check_supported(model, layers)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    x = x.detach().clone().requires_grad_(True)
    batch_norms = [m for m in layers.values() if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d) and m.training]
    try:
        with Hooks() as hooks:
            for m in batch_norms:  # a clear error instead of PyTorch's from inside the layer
                hooks.add(m.register_forward_pre_hook(_one_value_per_channel))
            noise = _dropout_noise(model, x, layers, seed)
            rec, grads, rows = _run(model, x, params, seed, target=target, loss=loss, grad=grad)
    finally:
        with torch.no_grad():  # batch norm's running statistics, as they were
            for n, b in model.named_buffers():
                b.copy_(buffers[n])
    per_layer, notes = _manual_rows(rec, layers, noise, params, grads[2:])
    for name in rec.names:
        rows.extend(per_layer.get(name, []))
    return Verification(rows, notes)


def _run(model, x, params, seed, *, target, loss, grad):
    """One recorded forward and backward: the recording, autograd's gradients of (output, x,
    parameters), and the loss's row when there is a loss."""
    rows = []
    with torch.random.fork_rng(), record(model, backward=True) as rec:
        torch.manual_seed(seed)
        out = model(x)
        _check_output(out, target, loss, grad)
        wrt = [out, x, *(p for _, p in params)]
        if loss is None:
            start = torch.ones_like(out) if grad is None else grad
            grads = torch.autograd.grad(out, wrt, start, allow_unused=True)
        else:
            value = F.mse_loss(out, target) if loss == "mse" else F.cross_entropy(out, target)
            grads = torch.autograd.grad(value, wrt, allow_unused=True)
            backward = losses.mse_backward if loss == "mse" else losses.softmax_cross_entropy_backward
            rows.append(compare(f"{loss}: dL/d(output)", backward(out.detach(), target), grads[0]))
    return rec, grads, rows


def _manual_rows(rec, layers, noise, params, param_grads) -> tuple[dict[str, list[Row]], list[str]]:
    """Per layer, the rows of its ``grad_input`` and its parameters' gradients, computed by hand from
    the recording; and notes on the layers no gradient reached."""
    manual: dict[str, torch.Tensor] = {}
    per_layer: dict[str, list[Row]] = {}
    notes = []
    for r in rec:
        label = r.name if r.call == 0 else f"{r.name}[call {r.call}]"
        try:
            dout = r.grad_output[0]
        except NoGradientError:
            notes.append(f"{label}: no gradient reached it, nothing to compare")
            continue
        x_in, y = r.inputs[0], r.output
        if (r.name, r.call) in noise:
            x_in, y = torch.ones_like(x_in), noise[(r.name, r.call)]
        module = layers[r.name]
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
    for (name, _), reference in zip(params, param_grads, strict=True):
        if name in manual and reference is not None:
            per_layer.setdefault(name.rpartition(".")[0], []).append(compare(f"{name}.grad", manual[name], reference))
    return per_layer, notes

"""Exercises of notebook 04: write the backward pass of five layers by hand.

Each checker calls the student's function on fixed random float64 tensors, with autograd off and
failing an answer that reaches autograd, a backward operator, forward-mode AD or ``torch.func``'s
differentiating transforms, or the course's own backward formulas (``hooklab.backprop``,
``hooklab.backprop.losses``) anyway, and compares every returned gradient with autograd's. The watch
covers the thread that runs the answer: work handed to another thread is not seen. A passing
answer's largest difference (over every input the checker tries) is printed as the bound
``< 1e-12`` when it is that small: its digits are float64 rounding, and they change with the
CPU's instruction set.

Exercises 04.1 and 04.2 are the first steps of the 2-2-2 network's backward pass (the sigmoid, then
layer 1's four gradients), 04.5 the backward pass of a whole training step, 04.8 batch norm's. The
ids follow the order in which the notebook asks the exercises. A
wrong gradient gets a hint when it is the transpose of the right one or off by a constant factor
(a missing or extra 1/N of a mean over the batch).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..pytorch_internals import TorchDispatchMode, differentiating
from ..recording import tensors_in
from . import Outcome, compare_tensors, exercise, hint_for

D = torch.float64
SHOWN_AS_BOUND = 1e-12  # passing differences below this are rounding: printed as "< 1e-12"


def _rand(*shape, seed):
    return torch.randn(*shape, dtype=D, generator=torch.Generator().manual_seed(seed))


def _reference(fn, inputs, dout):
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    return torch.autograd.grad(fn(*leaves), leaves, dout)


class _Shortcuts(TorchFunctionMode):
    """Notes the first torch function called on a tensor that requires grad (autograd at work)."""

    def __init__(self):
        super().__init__()
        self.found: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.found is None and getattr(func, "__name__", "") != "__get__" and any(  # reading .shape is fine
                isinstance(t, torch.Tensor) and t.requires_grad for t in tensors_in((args, kwargs))):
            self.found = f"autograd ({getattr(func, '__name__', str(func))} on a tensor that requires grad)"
        return func(*args, **kwargs)


class _BackwardOps(TorchDispatchMode):
    """Notes the first ATen operator with "backward" in its name (PyTorch's own gradient formula),
    or run under forward-mode AD or a ``torch.func`` differentiating transform."""

    def __init__(self):
        super().__init__()
        self.found: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.found is None:
            if "backward" in str(func.overloadpacket):
                self.found = f"a backward op ({func.overloadpacket})"
            else:
                self.found = differentiating()
        return func(*args, **(kwargs or {}))


def _course_files() -> dict[str, str]:
    """The files of the course's own backward formulas, by module name."""
    from hooklab.backprop import layers, losses

    return {layers.__file__: "hooklab.backprop", losses.__file__: losses.__name__}


class _CourseAnswers(TorchDispatchMode):
    """Notes the first backward formula of ``hooklab.backprop`` or ``hooklab.backprop.losses`` (a function
    whose name ends in ``_backward``) that runs an operator. The frames of the call stack are read
    and their code's file compared, so a function imported or rebuilt under another name is found
    too; the source copied into the answer is the student's own code and is not."""

    def __init__(self):
        super().__init__()
        self.found: str | None = None
        self.files = _course_files()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.found is None:
            frame, outermost = sys._getframe(1), None
            while frame is not None and frame.f_code is not _by_hand.__code__:  # the answer's frames only
                module = self.files.get(frame.f_code.co_filename)
                if module and frame.f_code.co_name.endswith("_backward"):
                    outermost = f"{module}.{frame.f_code.co_qualname}"
                frame = frame.f_back
            if outermost:
                self.found = f"{outermost}, the course's own backward formula (writing it is the exercise)"
        return func(*args, **(kwargs or {}))


def _by_hand(answer, names: list[str], *inputs: torch.Tensor):
    """Call ``answer`` on copies of ``inputs`` (tensors are cloned, numbers passed as they are) with
    autograd off, watching for autograd, PyTorch's backward operators and the course's own formulas;
    returns ``(result, None)`` or ``(None, Outcome)`` when the answer used one of them or changed one
    of its inputs in place."""
    copies = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    autograd, backward_ops, course = _Shortcuts(), _BackwardOps(), _CourseAnswers()
    try:
        with torch.no_grad(), autograd, backward_ops, course:
            got = answer(*copies)
    except Exception as error:
        if course.found or backward_ops.found or autograd.found:
            got = None  # the shortcut explains the error
        elif isinstance(error, RuntimeError):
            return None, hint_for(error, dict.fromkeys(("does not require grad", "does not have a grad_fn"),
                "by hand means without autograd: compute the gradient from its formula (autograd is switched off "
                "while your function runs)"))  # fmt: skip
        else:
            raise
    found = course.found or backward_ops.found or autograd.found
    if found:
        return None, Outcome(False, f"write the formula yourself: your answer called {found}")
    for name, original, copy in zip(names, inputs, copies, strict=True):
        if isinstance(original, torch.Tensor) and not torch.equal(original, copy):
            return None, Outcome(False, f"your function changed its input {name} in place: compute new tensors "
                                        "instead (the caller still needs its inputs)")
    return got, None


Trap = tuple[tuple[torch.Tensor, ...], str]  # a known wrong result, and what to say when an answer gives it


def _compare(got, expected, names, traps: Sequence[Trap] = ()) -> Outcome | tuple[float, str]:
    """A failed Outcome, or the largest difference from ``expected`` and the gradient it is in."""
    if isinstance(got, torch.Tensor):
        got = (got,)
    if not isinstance(got, tuple | list) or not all(isinstance(g, torch.Tensor) for g in got):
        kind = type(got).__name__ if not isinstance(got, tuple | list) else "a sequence holding non-tensors"
        return Outcome(False, f"return {len(expected)} tensor(s) ({', '.join(names)}), not {kind}")
    if len(got) != len(expected):
        return Outcome(False, f"returned {len(got)} tensor(s), expected {len(expected)}: ({', '.join(names)})")
    worst, worst_name = 0.0, names[0]
    for name, g, e in zip(names, got, expected, strict=True):
        outcome = compare_tensors(g, e, atol=1e-10, rtol=1e-8)
        if not outcome.passed:
            hint = ""
            if g.dtype != e.dtype and g.shape == e.shape:
                hint = (f" (your {name} is {str(g.dtype).removeprefix('torch.')}, the inputs are float64: make new "
                        "tensors with zeros_like(...) or dtype=x.dtype)")
            elif g.shape == e.shape and (g.detach().double() - e).abs().max().item() < 1e-5:
                hint = (" (off by about float32 rounding: part of your computation ran in float32; an integer "
                        "tensor times a Python float is float32, so convert it to the inputs' dtype first)")
            else:
                hint = next((f" ({why})" for wrong, why in traps  # a one-tensor trap is about this gradient
                             if all(w.shape == t.shape and torch.allclose(t.detach().double(), w)
                                    for w, t in zip(wrong, (g,) if len(wrong) == 1 else got, strict=True))),
                            "") or _shape_or_scale(name, g, e)
            return Outcome(False, f"{name}: {outcome.detail}{hint}")
        diff = (g.detach().double() - e).abs().max().item()
        if diff >= worst:
            worst, worst_name = diff, name
    return worst, worst_name


def _shape_or_scale(name: str, got: torch.Tensor, expected: torch.Tensor) -> str:
    """A hint for two common slips: a transposed matrix, and a result off by a constant factor
    (a missing or extra 1/N of a mean over N rows). Empty when neither explains ``got``."""
    got = got.detach().double()
    if got.dim() == 2 and got.shape[0] != got.shape[1] and got.T.shape == expected.shape:
        if torch.allclose(got.T, expected, rtol=1e-6, atol=1e-9):
            return f" (it is the transpose of the right {name}: a gradient has the shape of its tensor)"
        return ""
    square = got.dim() == 2 and got.shape[0] == got.shape[1] == expected.shape[0] == expected.shape[-1]
    if square and torch.allclose(got.T, expected, rtol=1e-6, atol=1e-9):
        return f" (it is the transpose of the right {name}: a weight's gradient has one row per output unit)"
    if got.shape != expected.shape or not expected.abs().max() > 0:
        return ""
    big = expected.abs() > 1e-3 * expected.abs().max()
    if big.sum() < 2:  # one number is always some factor times another: no hint
        return ""
    factor = (got[big] / expected[big]).median().item()
    if abs(factor - 1) < 1e-6 or abs(factor) < 1e-6 or not torch.allclose(got, factor * expected, rtol=1e-6, atol=1e-9):
        return ""
    if factor < 1:
        return f" (every entry is {factor:.3g} × the right value, 1/{1 / factor:.3g}: an extra division, such as a 1/N)"
    return f" (every entry is {factor:.3g} × the right value: a missing division, such as the 1/N of a mean)"


def _verdict(names, worst: float, worst_name: str, prefix: str = "") -> Outcome:
    verb = "matches" if len(names) == 1 else "match"
    if worst < SHOWN_AS_BOUND:
        return Outcome(True, f"{prefix}{', '.join(names)} {verb} autograd; max |difference| < {SHOWN_AS_BOUND:.0e}")
    return Outcome(True, f"{prefix}{', '.join(names)} {verb} autograd; max |difference| {worst:.1e} (in {worst_name})")


def _run(answer, fn, inputs: dict[str, torch.Tensor], answer_inputs: dict, dout, traps: Sequence[Trap] = ()):
    """Autograd's gradients of ``fn(*inputs)`` first, then the answer's from ``answer_inputs``; the
    answer returns one gradient per input, named ``d<input>``. A failed Outcome, or what
    ``_compare`` found."""
    expected = _reference(fn, tuple(inputs.values()), dout)
    got, failed = _by_hand(answer, list(answer_inputs), *answer_inputs.values())
    return failed or _compare(got, expected, [f"d{name}" for name in inputs], traps)


def _check(answer, fn, inputs: dict[str, torch.Tensor], answer_inputs: dict, dout) -> Outcome:
    compared = _run(answer, fn, inputs, answer_inputs, dout)
    return compared if isinstance(compared, Outcome) else _verdict([f"d{name}" for name in inputs], *compared)


def _check_cases(answer, cases, passed_prefix: str) -> Outcome:
    """``_run`` on several cases ``(label, fn, inputs, answer_inputs, dout, traps)`` in turn: fails with
    the first case that fails (``with <label>: ...``), passes with the largest difference of all."""
    worst, worst_name = 0.0, ""
    for label, fn, inputs, answer_inputs, dout, traps in cases:
        compared = _run(answer, fn, inputs, answer_inputs, dout, traps)
        if isinstance(compared, Outcome):
            return Outcome(False, f"with {label}: {compared.detail}")
        if compared[0] >= worst:
            worst, worst_name = compared
    return _verdict([f"d{name}" for name in inputs], worst, worst_name, prefix=passed_prefix)


def _softmax_cases():
    """A square input first: there a row sum that lost its dimension broadcasts without an error."""
    for shape, seed in (((4, 4), 1), ((2, 3, 5), 13)):
        x, dout = _rand(*shape, seed=seed) * 2, _rand(*shape, seed=seed + 1)
        out = x.softmax(dim=-1)
        traps = []
        if shape[0] == shape[-1]:
            traps.append(((out * (dout - (dout * out).sum(-1)),),
                          "your row sums were added along the wrong dimension: a sum over the last dimension "
                          f"drops it, and the {tuple(shape[:-1])} result then lines up with the columns; "
                          "keepdim=True keeps one sum per row"))
        traps += [((out * (dout - (dout * out).sum(dim, keepdim=True)),),
                   "sum over the last dimension (dim=-1), where softmax normalises")
                  for dim in range(len(shape) - 1)]
        yield f"x of shape {shape}", partial(torch.softmax, dim=-1), {"x": x}, {"out": out, "dout": dout}, dout, traps


@exercise("04.3", "softmax backward from the output")
def _softmax(softmax_backward) -> Outcome:
    """``softmax_backward(out, dout) -> dx`` where ``out = x.softmax(dim=-1)``, for any incoming
    ``dout`` (no loss after it); tried on a (4, 4) and a (2, 3, 5) input."""
    return _check_cases(softmax_backward, _softmax_cases(), "with x of shapes (4, 4) and (2, 3, 5): ")


def _linear_cases():
    """Two (B, T, in) shapes, so that an answer with B·T or a size written in does not pass."""
    for (batch, steps, n_in, n_out), seed in (((2, 5, 4, 3), 3), ((3, 1, 4, 2), 20)):
        x, w = _rand(batch, steps, n_in, seed=seed), _rand(n_out, n_in, seed=seed + 1)
        b, dout = _rand(n_out, seed=seed + 2), _rand(batch, steps, n_out, seed=seed + 3)
        yield (f"x of shape {tuple(x.shape)}", F.linear, {"x": x, "w": w, "b": b}, {"x": x, "w": w, "dout": dout},
               dout, [])


@exercise("04.6", "linear backward on a batch of sequences")
def _linear(linear_backward) -> Outcome:
    """``linear_backward(x, w, dout) -> (dx, dw, db)`` for ``y = x @ w.T + b`` with ``x`` of shape
    ``(B, T, in)`` (bias shape ``[out]``); tried on x of shape (2, 5, 4) with 3 outputs, then
    (3, 1, 4) with 2."""
    return _check_cases(linear_backward, _linear_cases(), "with x of shapes (2, 5, 4) and (3, 1, 4): ")


@exercise("04.9", "ELU backward from the output")
def _elu(elu_backward) -> Outcome:
    """``elu_backward(out, dout, alpha) -> dx`` where ``out = F.elu(x, alpha)``: only the output is
    given, as after an in-place ELU; tried with alpha 1 and 0.5."""
    x, dout = _rand(5, 6, seed=7) * 2, _rand(5, 6, seed=8)
    cases = [(f"alpha={alpha}", partial(F.elu, alpha=alpha), {"x": x},
              {"out": F.elu(x, alpha), "dout": dout, "alpha": alpha}, dout, []) for alpha in (1.0, 0.5)]
    return _check_cases(elu_backward, cases, "with alpha 1.0 and 0.5: ")


@exercise("04.7", "conv2d backward, stride 1, no padding")
def _conv(conv2d_backward) -> Outcome:
    """``conv2d_backward(x, w, dout) -> (dx, dw)`` for ``y = F.conv2d(x, w)`` (no bias)."""
    x, w = _rand(2, 3, 6, 5, seed=9), _rand(4, 3, 3, 2, seed=10)
    dout = _rand(2, 4, 4, 4, seed=11)
    return _check(conv2d_backward, F.conv2d, {"x": x, "w": w}, {"x": x, "w": w, "dout": dout}, dout)


@exercise("04.4", "cross-entropy with label smoothing, backward")
def _softmax_ce(ce_backward) -> Outcome:
    """``ce_backward(logits, target, smoothing) -> dlogits`` for
    ``F.cross_entropy(logits, target, label_smoothing=smoothing)`` (mean over the batch)."""
    # class 3 of 4 is never a target: F.one_hot(target) without num_classes gives 3 columns
    logits, target = _rand(5, 4, seed=12) * 2, torch.tensor([2, 0, 1, 1, 2])
    cases = [(f"smoothing={smoothing}", partial(F.cross_entropy, target=target, label_smoothing=smoothing),
              {"logits": logits}, {"logits": logits, "target": target, "smoothing": smoothing},
              torch.tensor(1.0, dtype=D), []) for smoothing in (0.2, 0.0)]
    try:
        return _check_cases(ce_backward, cases, "with smoothing 0.2 and 0: ")
    except RuntimeError as error:
        columns = int(target.max()) + 1
        if f"size of tensor a ({logits.shape[1]})" not in str(error) or f"({columns})" not in str(error):
            raise
        return Outcome(False, f"your code raised RuntimeError: {error}. The targets here never include class "
                              f"{logits.shape[1] - 1}, and F.one_hot infers the number of classes from the "
                              "largest target: pass num_classes=logits.shape[1]")


# ----- the 2-2-2 network (04.1, 04.2), a training step (04.5), batch norm (04.8) ----------------

X222 = torch.tensor([[0.05, 0.1]], dtype=D)  # the 2-2-2 network's input
W1_222, B1_222 = torch.tensor([[0.15, 0.25], [0.20, 0.30]], dtype=D), torch.tensor([0.35], dtype=D)
W2_222, B2_222 = torch.tensor([[0.40, 0.50], [0.45, 0.55]], dtype=D), torch.tensor([0.60], dtype=D)


@exercise("04.1", "the sigmoid's backward, from its output")
def _sigmoid(sigmoid_backward) -> Outcome:
    """``sigmoid_backward(s, ds) -> dz`` where ``s = sigmoid(z)`` and ``ds`` is the gradient arriving
    at ``s``; tried on the 2-2-2 network's last layer (from ``[[1, 1]]``), then on a random batch."""
    z2 = torch.sigmoid(X222 @ W1_222.T + B1_222) @ W2_222.T + B2_222
    ones, z, dout = torch.ones(1, 2, dtype=D), _rand(4, 3, seed=31) * 2, _rand(4, 3, seed=32)
    cases = [(label, torch.sigmoid, {"z": zz}, {"s": torch.sigmoid(zz), "ds": d}, d,
              _sigmoid_traps(torch.sigmoid(zz), d))
             for label, zz, d in (("the 2-2-2 network's s2", z2, ones), ("a random (4, 3) batch", z, dout))]
    return _check_cases(sigmoid_backward, cases, "on the 2-2-2 network and a random batch: ")


def _sigmoid_traps(s, ds) -> list[Trap]:
    return [((ds * s * (1 + s),), "a sign slip: the derivative is s·(1 − s)"),
            ((s * (1 - s),), "multiply by ds, the gradient that arrives: the chain rule")]


def _layer1(x, w, b):
    """Layer 1 of the 2-2-2 network, written with its bias of shape (1,) shared by both units."""
    return torch.sigmoid(x @ w.T + b)


@exercise("04.2", "layer 1 of the 2-2-2 network: four gradients")
def _layer1_grads(layer1_backward) -> Outcome:
    """``layer1_backward(x, w1, s1, ds1) -> (dz1, dx, dw1, db1)`` for ``s1 = sigmoid(x @ w1.T + b1)``
    with one bias of shape (1,) shared by both units; ``ds1`` is the gradient arriving at ``s1``. Tried
    on the 2-2-2 network (started from ``[[1, 1]]``), then on a batch of 3 rows."""
    s1 = _layer1(X222, W1_222, B1_222)
    s2 = torch.sigmoid(s1 @ W2_222.T + B2_222)
    ds1 = (s2 * (1 - s2)) @ W2_222  # what arrives at s1 from [[1, 1]]
    batch, ds_batch = _rand(3, 2, seed=41), _rand(3, 2, seed=42)
    worst, worst_name = 0.0, ""
    for label, x, ds in (("the 2-2-2 network", X222, ds1), ("a batch of 3 rows", batch, ds_batch)):
        s = _layer1(x, W1_222, B1_222)
        leaves = [t.clone().requires_grad_(True) for t in (x, W1_222, B1_222)]
        z = leaves[0] @ leaves[1].T + leaves[2]
        z.retain_grad()
        torch.sigmoid(z).backward(ds)
        expected = (z.grad, *(t.grad for t in leaves))
        got, failed = _by_hand(layer1_backward, ["x", "w1", "s1", "ds1"], x, W1_222, s, ds)
        compared = failed or _compare(got, expected, ["dz1", "dx", "dw1", "db1"], _bias_traps(z.grad))
        if isinstance(compared, Outcome):
            return Outcome(False, f"with {label}: {_each(got, expected, _bias_traps(z.grad)) or compared.detail}")
        if compared[0] >= worst:
            worst, worst_name = compared
    return _verdict(["dz1", "dx", "dw1", "db1"], worst, worst_name, prefix="on the 2-2-2 network and a batch: ")


def _each(got, expected, traps: Sequence[Trap]) -> str:
    """One verdict per gradient, like ``cmp``: ``dz1 ok; dx ok; dw1: max |difference| ... (hint); db1 ok``.
    Empty when ``got`` is not four tensors (``_compare`` explains that)."""
    names = ["dz1", "dx", "dw1", "db1"]
    if not isinstance(got, tuple | list) or len(got) != 4 or not all(isinstance(g, torch.Tensor) for g in got):
        return ""
    verdicts = []
    for name, g, e in zip(names, got, expected, strict=True):
        one = _compare((g,), (e,), [name], [t for t in traps if len(t[0]) == 1] if name == "db1" else ())
        verdicts.append(one.detail if isinstance(one, Outcome) else f"{name} ok")
    return "; ".join(verdicts)


def _bias_traps(dz: torch.Tensor) -> list[Trap]:
    return [((dz.sum(0),), "db1 has one entry per unit: the bias is one number shared by both units, shape (1,), "
                           "so its gradient is the sum of every entry of dz1"),
            ((dz,), "db1 must have the bias's shape (1,): sum dz1 over every entry")]


def _net_loss(x, w1, b1, w2, b2, target):
    return F.mse_loss(torch.sigmoid(torch.sigmoid(x @ w1.T + b1) @ w2.T + b2), target)


STEP_INPUTS = torch.tensor([[0.05, 0.1], [0.9, 0.2], [0.3, 0.8], [0.6, 0.6]], dtype=D)
STEP_TARGETS = torch.tensor([[0.01, 0.99], [0.99, 0.01], [0.01, 0.99], [0.5, 0.5]], dtype=D)
STEPS, LR = 25, 2.0
#: a second layer with 3 outputs: there 2·(out − t)/N differs from (out − t)/rows
W2_WIDE = torch.tensor([[0.40, 0.50], [0.45, 0.55], [-0.30, 0.20]], dtype=D)
TARGETS_WIDE = torch.tensor([[0.01, 0.99, 0.5], [0.99, 0.01, 0.2], [0.01, 0.99, 0.7], [0.5, 0.5, 0.1]], dtype=D)
_STEP_NAMES = ["x", "w1", "b1", "w2", "b2", "target"]


def _rows_loss(x, w1, b1, w2, b2, target):
    """A loss whose gradient at the output is (out − t)/rows: right for 2 outputs only."""
    out = torch.sigmoid(torch.sigmoid(x @ w1.T + b1) @ w2.T + b2)
    return ((out - target) ** 2).sum() / (2 * len(target))


def _wide_case(net_backward) -> Outcome | tuple[float, str]:
    """One step of the network with 3 outputs: a failed Outcome, or ``_compare``'s result."""
    params, one = (W1_222, B1_222, W2_WIDE, B2_222), torch.tensor(1.0, dtype=D)
    expected = _reference(partial(_net_loss, target=TARGETS_WIDE), (STEP_INPUTS, *params), one)[1:]
    by_rows = _reference(partial(_rows_loss, target=TARGETS_WIDE), (STEP_INPUTS, *params), one)[1:]
    trap = (by_rows, "mse_loss's mean runs over every entry of the output: dL/d out = 2·(out − t)/N with "
                     "N = target.numel() (rows × outputs); (out − t)/rows is right only when there are 2 outputs")
    got, failed = _by_hand(net_backward, _STEP_NAMES, STEP_INPUTS, *params, TARGETS_WIDE)
    return failed or _compare(got, expected, ["dw1", "db1", "dw2", "db2"], [trap])


@exercise("04.5", "the backward pass of a training step")
def _train_step(net_backward) -> Outcome:
    """``net_backward(x, w1, b1, w2, b2, target) -> (dw1, db1, dw2, db2)``: the gradients of
    ``mse_loss(sigmoid(sigmoid(x @ w1.T + b1) @ w2.T + b2), target)`` (mean over every entry). The check
    compares one step of a network with 3 outputs with autograd, then trains the 2-2-2 network for
    25 SGD steps with your gradients and with autograd's, side by side."""
    wide = _wide_case(net_backward)
    if isinstance(wide, Outcome):
        return Outcome(False, f"with 3 outputs: {wide.detail}")
    params = [W1_222, B1_222, W2_222, B2_222]
    names = ["dw1", "db1", "dw2", "db2"]
    first, worst = None, wide[0]
    for step in range(STEPS):
        loss = partial(_net_loss, target=STEP_TARGETS)
        expected = _reference(loss, (STEP_INPUTS, *params), torch.tensor(1.0, dtype=D))[1:]
        got, failed = _by_hand(net_backward, _STEP_NAMES, STEP_INPUTS, *params, STEP_TARGETS)
        compared = failed or _compare(got, expected, names)
        if isinstance(compared, Outcome):
            return Outcome(False, compared.detail if step == 0 else f"at step {step + 1}: {compared.detail}")
        first = first if first is not None else _net_loss(STEP_INPUTS, *params, STEP_TARGETS).item()
        worst = max(worst, compared[0])
        params = [p - LR * g.detach().to(D) for p, g in zip(params, got, strict=True)]
    last = _net_loss(STEP_INPUTS, *params, STEP_TARGETS).item()
    if not last < first:
        return Outcome(False, f"the loss went from {first:.4f} to {last:.4f}: it should go down")
    bound = f"< {SHOWN_AS_BOUND:.0e}" if worst < SHOWN_AS_BOUND else f"{worst:.1e}"
    return Outcome(True, f"right with 3 outputs; {STEPS} SGD steps (lr {LR}) with your gradients take the 2-2-2 "
                         f"network's loss from {first:.4f} to {last:.4f}; every step's match autograd's, "
                         f"max |difference| {bound}")


def _bn(x, gamma, beta, eps):
    return F.batch_norm(x, None, None, gamma, beta, training=True, eps=eps)


@exercise("04.8", "batch norm backward, training mode")
def _batch_norm(batch_norm_backward) -> Outcome:
    """``batch_norm_backward(x, gamma, dout, eps) -> (dx, dgamma, dbeta)`` for
    ``F.batch_norm(x, None, None, gamma, beta, training=True, eps=eps)`` on ``x`` of shape (N, C):
    the batch's own mean and (biased) variance, per column. Tried with N = 6 and N = 3."""
    worst, worst_name, names = 0.0, "", ["dx", "dgamma", "dbeta"]
    for (n, c), seed in (((6, 4), 51), ((3, 5), 55)):
        x, gamma = _rand(n, c, seed=seed) * 2 + 1, _rand(c, seed=seed + 1)
        beta, dout, eps = _rand(c, seed=seed + 2), _rand(n, c, seed=seed + 3), 1e-5
        expected = _reference(partial(_bn, eps=eps), (x, gamma, beta), dout)
        got, failed = _by_hand(batch_norm_backward, ["x", "gamma", "dout", "eps"], x, gamma, dout, eps)
        compared = failed or _compare(got, expected, names, _bn_traps(x, gamma, dout, eps))
        if isinstance(compared, Outcome):
            return Outcome(False, f"with x of shape {(n, c)}: {compared.detail}")
        if compared[0] >= worst:
            worst, worst_name = compared
    return _verdict(names, worst, worst_name, prefix="with x of shapes (6, 4) and (3, 5): ")


def _bn_unbiased(x, gamma, beta, eps):
    return (x - x.mean(0)) / (x.var(0, unbiased=True) + eps).sqrt() * gamma + beta


def _bn_traps(x, gamma, dout, eps) -> list[Trap]:
    """The gradients when the statistics are treated as constants, and with the unbiased variance."""
    mean, var = x.mean(0), x.var(0, unbiased=False)
    frozen = (dout * gamma / (var + eps).sqrt(), (dout * (x - mean) / (var + eps).sqrt()).sum(0), dout.sum(0))
    unbiased = _reference(partial(_bn_unbiased, eps=eps), (x, gamma, torch.zeros_like(gamma)), dout)
    return [(frozen, "the mean and variance depend on x too: every row of a column changes them, which adds two "
                     "terms to dx"),
            (unbiased, "batch norm normalises with the biased variance, mean((x − mean)²) over N, not N − 1")]

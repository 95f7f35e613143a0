"""What the backprop-by-hand checkers share (notebook 04 and the field guide G4): run an answer with
autograd off and watched, and compare its gradients with autograd's.

``by_hand`` calls the student's function on copies of its inputs with autograd off, failing an
answer that reaches autograd, a backward operator, forward-mode AD or ``torch.func``'s
differentiating transforms, or the course's own backward formulas (``hooklab.backprop``,
``hooklab.backprop.losses``) anyway. The watch covers the thread that runs the answer: work handed
to another thread is not seen. ``compare`` judges returned gradients one by one and explains the
usual slips (a transposed matrix, a missing 1/N, a sign, float32); ``compare_chain`` judges a dict
of gradients of named steps in chain order and names the first wrong step. A passing answer's
largest difference is printed as the bound ``< 1e-12`` when it is that small: its digits are
float64 rounding, and they change with the CPU's instruction set.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from ..pytorch_internals import TorchDispatchMode, differentiating
from . import Outcome, compare_tensors, hint_for

D = torch.float64
SHOWN_AS_BOUND = 1e-12  # passing differences below this are rounding: printed as "< 1e-12"
ATOL, RTOL = 1e-10, 1e-8  # float64: far above rounding, far below any slip

Trap = tuple[tuple[torch.Tensor, ...], str]  # a known wrong result, and what to say when an answer gives it


def rand(*shape, seed):
    return torch.randn(*shape, dtype=D, generator=torch.Generator().manual_seed(seed))


def reference(fn, inputs, dout):
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
                isinstance(t, torch.Tensor) and t.requires_grad for t in tree_leaves((args, kwargs))):
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
            while frame is not None and frame.f_code is not by_hand.__code__:  # the answer's frames only
                module = self.files.get(frame.f_code.co_filename)
                if module and frame.f_code.co_name.endswith("_backward"):
                    outermost = f"{module}.{frame.f_code.co_qualname}"
                frame = frame.f_back
            if outermost:
                self.found = f"{outermost}, the course's own backward formula (writing it is the exercise)"
        return func(*args, **(kwargs or {}))


def by_hand(answer, names: list[str], *inputs):
    """Call ``answer`` on copies of ``inputs`` (tensors and dicts of tensors are cloned, anything else
    is passed as it is) with autograd off, watching for autograd, PyTorch's backward operators and the
    course's own formulas; returns ``(result, None)`` or ``(None, Outcome)`` when the answer used one
    of them or changed one of its inputs in place."""
    copies = [_copy(t) for t in inputs]
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
        if not _same(original, copy):
            return None, Outcome(False, f"your function changed its input {name} in place: compute new tensors "
                                        "instead (the caller still needs its inputs)")
    return got, None


def _copy(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def _same(original, copy) -> bool:
    if isinstance(original, torch.Tensor):
        return torch.equal(original, copy)
    if isinstance(original, dict):
        return isinstance(copy, dict) and original.keys() == copy.keys() and all(
            _same(v, copy[k]) for k, v in original.items())
    return True


def _matches(got: torch.Tensor, wrong: torch.Tensor) -> bool:
    return wrong.shape == got.shape and torch.allclose(got.detach().double(), wrong)


def one(name: str, got, expected: torch.Tensor, traps: Sequence[Trap] = (), whole: str | None = None
        ) -> Outcome | float:
    """One gradient: a failed Outcome naming the slip, or the largest difference. ``whole`` is the hint of
    a trap that the whole answer fell into, which explains this gradient before any other."""
    outcome = compare_tensors(got, expected, atol=ATOL, rtol=RTOL)
    if outcome.passed:
        return (got.detach().double() - expected).abs().max().item() if expected.numel() else 0.0
    if not isinstance(got, torch.Tensor):
        return Outcome(False, f"{name}: {outcome.detail}")
    hint = ""
    if got.dtype != expected.dtype and got.shape == expected.shape:
        hint = (f" (your {name} is {str(got.dtype).removeprefix('torch.')}, the inputs are float64: make new "
                "tensors with zeros_like(...) or dtype=x.dtype)")
    elif got.shape == expected.shape and (got.detach().double() - expected).abs().max().item() < 1e-5:
        hint = (" (off by about float32 rounding: part of your computation ran in float32; an integer "
                "tensor times a Python float is float32, so convert it to the inputs' dtype first)")
    elif whole:
        hint = f" ({whole})"
    else:
        hint = next((f" ({why})" for wrong, why in traps if len(wrong) == 1 and _matches(got, wrong[0])), "") \
            or shape_or_scale(name, got, expected)
    return Outcome(False, f"{name}: {outcome.detail}{hint}")


def compare(got, expected, names, traps: Sequence[Trap] = ()) -> Outcome | tuple[float, str]:
    """A failed Outcome, or the largest difference from ``expected`` and the gradient it is in.
    A trap of several tensors is about the whole answer; a trap of one tensor about the gradient
    that failed."""
    if isinstance(got, torch.Tensor):
        got = (got,)
    if not isinstance(got, tuple | list) or not all(isinstance(g, torch.Tensor) for g in got):
        kind = type(got).__name__ if not isinstance(got, tuple | list) else "a sequence holding non-tensors"
        return Outcome(False, f"return {len(expected)} tensor(s) ({', '.join(names)}), not {kind}")
    if len(got) != len(expected):
        return Outcome(False, f"returned {len(got)} tensor(s), expected {len(expected)}: ({', '.join(names)})")
    whole = next((why for wrong, why in traps if len(wrong) == len(got) > 1
                  and all(_matches(g, w) for g, w in zip(got, wrong, strict=True))), None)
    worst, worst_name = 0.0, names[0]
    for name, g, e in zip(names, got, expected, strict=True):
        result = one(name, g, e, traps, whole)
        if isinstance(result, Outcome):
            return result
        if result >= worst:
            worst, worst_name = result, name
    return worst, worst_name


def shape_or_scale(name: str, got: torch.Tensor, expected: torch.Tensor) -> str:
    """A hint for common slips: a transposed matrix, the wrong sign, and a result off by a constant
    factor (a missing or extra 1/N of a mean over N rows). Empty when none explains ``got``."""
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
    if abs(factor + 1) < 1e-6:
        return " (every entry has the wrong sign)"
    if factor < 1:
        return f" (every entry is {factor:.3g} × the right value, 1/{1 / factor:.3g}: an extra division, such as a 1/N)"
    return f" (every entry is {factor:.3g} × the right value: a missing division, such as the 1/N of a mean)"


def verdict(names, worst: float, worst_name: str, prefix: str = "", verb: str | None = None) -> Outcome:
    verb = verb or ("matches" if len(names) == 1 else "match")
    if worst < SHOWN_AS_BOUND:
        return Outcome(True, f"{prefix}{', '.join(names)} {verb} autograd; max |difference| < {SHOWN_AS_BOUND:.0e}")
    return Outcome(True, f"{prefix}{', '.join(names)} {verb} autograd; max |difference| {worst:.1e} (in {worst_name})")


def run(answer, fn, inputs: dict[str, torch.Tensor], answer_inputs: dict, dout, traps: Sequence[Trap] = ()):
    """Autograd's gradients of ``fn(*inputs)`` first, then the answer's from ``answer_inputs``; the
    answer returns one gradient per input, named ``d<input>``. A failed Outcome, or what
    ``compare`` found."""
    expected = reference(fn, tuple(inputs.values()), dout)
    got, failed = by_hand(answer, list(answer_inputs), *answer_inputs.values())
    return failed or compare(got, expected, [f"d{name}" for name in inputs], traps)


def check_cases(answer, cases, passed_prefix: str) -> Outcome:
    """``run`` on several cases ``(label, fn, inputs, answer_inputs, dout, traps)`` in turn: fails with
    the first case that fails (``with <label>: ...``), passes with the largest difference of all."""
    worst, worst_name, names = 0.0, "", []
    for label, fn, inputs, answer_inputs, dout, traps in cases:
        names = [f"d{name}" for name in inputs]
        compared = run(answer, fn, inputs, answer_inputs, dout, traps)
        if isinstance(compared, Outcome):
            return Outcome(False, f"with {label}: {compared.detail}")
        if compared[0] >= worst:
            worst, worst_name = compared
    return verdict(names, worst, worst_name, prefix=passed_prefix)


def compare_chain(got, expected: dict[str, torch.Tensor], lines: dict[str, str],
                  traps: dict[str, Sequence[Trap]]) -> Outcome | tuple[float, str]:
    """The gradients of named steps (``got``: a dict by step name, ``d`` prefixes allowed), judged in
    the order of ``expected`` (the chain, from the loss back): a failed Outcome naming the first wrong
    step, the steps before it that were right, and the forward line that made it; or the largest
    difference and the step it is in."""
    if not isinstance(got, dict):
        return Outcome(False, f"return a dict with one gradient per step ({', '.join(expected)}), not "
                              f"{type(got).__name__}")
    got = {(k[1:] if isinstance(k, str) and k not in expected and k[1:] in expected else k): v for k, v in got.items()}
    worst, worst_name, right = 0.0, "", []
    for name, e in expected.items():
        where = f"d{name} (the step {lines[name]})" if name in lines else f"d{name}"
        if name not in got:
            return Outcome(False, _after(right) + f"no entry for {name!r}: the dict needs one gradient per step, "
                                                  f"keyed {', '.join(repr(k) for k in expected)}")
        result = one(where, got[name], e, traps.get(name, ()))
        if isinstance(result, Outcome):
            return Outcome(False, _after(right) + f"first wrong: {result.detail}")
        right.append(f"d{name}")
        if result >= worst:
            worst, worst_name = result, f"d{name}"
    return worst, worst_name


def _after(right: list[str]) -> str:
    if not right:
        return ""
    if len(right) <= 3:
        return f"{', '.join(right)} right; "
    return f"{right[0]} … {right[-1]} ({len(right)} steps) right; "

"""Exercises and predictions of notebook 01: tensor hooks, to find where a gradient turns NaN, name
the tensor, and check the diagnosis by hand. (Clamping parameter gradients, the fused optimizer step, saved-tensor
hooks, the graph's own hooks and the storage puzzle are the guide's: ``g1.py``.)"""

from __future__ import annotations

import contextlib
import io
import math
import re
import warnings
from collections.abc import Iterable

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from ..hooks import Hooks
from . import Outcome, compare_tensors, exercise, is_handle, kind_of, not_a_handle, prediction


def _rounded(t: object) -> list | None:
    return [round(v, 4) for v in t.tolist()] if isinstance(t, torch.Tensor) else None


# ----- 1. A hook on a tensor ---------------------------------------------------------------------
@prediction(
    "01.a",
    "what a hook on b prints, and a.grad, for b = 2a and the loss b.mean()",
    why="the mean over 5 entries gives each entry of b the gradient 1/5 = 0.2: that is what the hook on b "
        "receives (and what b.retain_grad() keeps in b.grad). b = 2a, so the chain rule multiplies by 2 on the "
        "way to a: 0.4.",
    wrong=[
        ([0.4, 0.2], "swapped: which of a and b is next to the loss?"),
        ([0.2, 0.2], "a reaches the loss through b = 2 * a: what does the chain rule do to b's gradient on the "
                     "way to a?"),
        ([1.0, 2.0], "is the loss a sum over b's 5 entries, or a mean?"),
        ([1.0, 0.4], "your a.grad is right, your hook's entry is not: is the loss a sum over b's entries, or a "
                     "mean?"),
        ([0.4, 0.4], "the hook on b receives the gradient with respect to b: before or after the chain rule "
                     "goes on to a?"),
    ],
)
def _retained() -> list[float]:
    a = torch.ones(5, requires_grad=True)
    b = 2 * a
    b.retain_grad()
    seen = []
    with b.register_hook(lambda grad: seen.append(grad[0].item())):
        b.mean().backward()
    return [seen[0], a.grad[0].item()]


@prediction(
    "01.b",
    "what two show hooks print between ×2 and ÷2",
    why="a tensor a hook returns replaces the gradient, and hooks on one tensor run in the order they were "
        "registered, each receiving what the one before returned: 2v = [2, 4, 6] doubled is [4, 8, 12], then "
        "halved back to [2, 4, 6] (show returns None, which passes the gradient on unchanged).",
    wrong=[
        ([[2, 4, 6], [2, 4, 6]], "the first show runs after the doubling hook and receives its result: a tensor "
                                 "a hook returns replaces the gradient"),
        ([[4, 8, 12], [4, 8, 12]], "the halving hook runs between the two shows: the second sees [2, 4, 6]"),
        ([[2, 4, 6], [4, 8, 12]], "the hooks run in the order registered: double, show, halve, show"),
        ([[2, 4, 6], [1, 2, 3]], "the gradient of (v**2).sum() is 2v = [2, 4, 6] before any hook; the first "
                                 "show sees it doubled"),
        ([[4, 8, 12], [8, 16, 24]], "the third hook halves: what does the second show receive from it?"),
        ([[1, 2, 3], [1, 2, 3]], "a hook on v receives the gradient of the loss with respect to v, 2v = [2, 4, 6], "
                                 "not v"),
        ([[2, 4, 6], [8, 16, 24]], "does a hook that returns a tensor change what the next hook receives? Try the "
                                   "first show again"),
    ],
)
def _four_hooks() -> list[list[float]]:
    v = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    shown = []
    with Hooks() as hooks:
        hooks.add(v.register_hook(lambda grad: grad * 2))
        hooks.add(v.register_hook(lambda grad: shown.append(grad.tolist())))
        hooks.add(v.register_hook(lambda grad: grad / 2))
        hooks.add(v.register_hook(lambda grad: shown.append(grad.tolist())))
        (v**2).sum().backward()
    return shown


# ----- 2. Which gradient a hook receives ---------------------------------------------------------
@prediction(
    "01.c",
    "the first tensor whose gradient holds a NaN, for r = x.abs().sqrt() at x = [4, 0]",
    why="the sum gives r the gradient 1. The square root's backward divides it by 2√a, and 1 / 0 is ∞, not "
        "NaN: a receives [0.25, ∞]. The derivative of |x| is sign(x), 0 at x = 0, and 0 × ∞ is NaN: x is first.",
    wrong=[
        ("a", "a is where the first non-finite gradient appears: 1 / (2√a) at a = 0 is 1 / 0 = ∞, infinite but not "
              "NaN. The question asks for the first NaN: what does |x|'s derivative, 0 at x = 0, make of ∞?"),
        ("r", "r's gradient comes from the sum: 1 in every entry"),
        ("none", "a receives 1 / (2√0) = ∞, and |x|'s backward multiplies it by sign(0) = 0: what is 0 × ∞?"),
    ],
)
def _first_nan_abs_sqrt() -> str:
    x = torch.tensor([4.0, 0.0], requires_grad=True)
    a = x.abs()
    r = a.sqrt()
    arrived = []
    with Hooks() as hooks:
        for name, t in (("r", r), ("a", a), ("x", x)):
            hooks.add(t.register_hook(lambda grad, name=name: arrived.append((name, grad.isnan().any().item()))))
        r.sum().backward()
    return next((name for name, nan in arrived if nan), "none")


def _problem() -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor]:
    """The lesson's problem: embed, head, a batch whose row 2 is padding (zeros), and the targets."""
    torch.manual_seed(0)
    embed, head = nn.Linear(4, 8, bias=False), nn.Linear(8, 3)
    x, y = torch.randn(3, 4), torch.tensor([0, 2, 1])
    x[2] = 0.0
    return embed, head, x, y


def _steps(embed: nn.Module, head: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    h = embed(x)
    ms = h.pow(2).mean(dim=1, keepdim=True)
    rms = ms.sqrt()
    normed = h / (rms + 1e-6)
    return {"h": h, "ms": ms, "rms": rms, "normed": normed, "logits": head(normed)}


@prediction(
    "01.d",
    "the first tensor whose gradient holds a NaN, on the way back",
    why="backward runs from logits back to h, applying each operation's rule as written. The gradient arriving "
        "at rms is 0 in the padded row (−h / (rms + 1e-6)², with h = 0); the square root's rule divides it by "
        "2·√ms = 0, and 0 / 0 is NaN: ms is first.",
    wrong=[
        ("h", "h is the last tensor backward reaches, and its gradient does hold a NaN, but it got it from a "
              "tensor after it: in the padded row drms is 0, and what is 2·√ms there?"),
        ("rms", "the gradient arriving at rms is 0 in the padded row, not NaN: −h / (rms + 1e-6)² with h = 0. "
                "The NaN comes one operation later, through the square root"),
        ("normed", "normed's gradient comes from head, a Linear layer with finite weights: no NaN there"),
        ("logits", "logits' gradient is softmax minus one-hot, finite for any logits"),
    ],
)
def _first_nan() -> str:
    embed, head, x, y = _problem()
    steps, arrived = _steps(embed, head, x), []
    with Hooks() as hooks:
        for name, t in steps.items():
            hooks.add(t.register_hook(lambda grad, name=name: arrived.append((name, grad.isnan().any().item()))))
        nn.functional.cross_entropy(steps["logits"], y).backward()
    return next(name for name, nan in arrived if nan)


# ----- 3. Where a run goes bad, and 4. repairing --------------------------------------------------
def _lesson_problem() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The lesson's problem cell: its model and its 168 batches, three in four of them padded."""
    from ..data import digits

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 8, bias=False), nn.Linear(8, 10))
    data = digits()
    xs, ys = data.x_train[:1344].flatten(1).view(168, 8, 64).clone(), data.y_train[:1344].view(168, 8).clone()
    padded = torch.randperm(168)[:126]
    xs[padded, -1], ys[padded, -1] = 0.0, -100
    return model, xs, ys


_GRAD_STATES = ("None", "NaN", "zeros", "numbers")


def _state(g: torch.Tensor | None) -> str | None:
    """None (Python's: a guess of None or "None" matches it) if backward never filled ``g``, else what it holds."""
    return None if g is None else "NaN" if g.isnan().any() else "zeros" if (g == 0).all() else "numbers"


_HEAD_SLIPS = {  # a wrong head.weight.grad, and why (its truth: numbers)
    "None": "head comes after ms in forward, so backward reached it before the guard raised at ms",
    "NaN": "the NaN is made at ms, which backward reaches after head: head's gradient came from finite numbers",
    "zeros": "nothing writes zeros into .grad: zero_grad() set it to None, and backward reached head before ms",
}
_EMBED_SLIPS = {  # a wrong embed.weight.grad, and why (its truth: None)
    "numbers": "embed comes before ms in forward, so after it on the way back: does backward go on after a hook "
               "raised?",
    "NaN": "the NaN is made at ms, but the guard raises there: does backward go on to embed after a hook raised?",
    "zeros": "nothing writes zeros into .grad: zero_grad() set it to None, and backward stopped at ms, before embed",
}


def _half_slips() -> list[tuple[list, str]]:
    """Every wrong pair of the form asked, with a hint that says which half is wrong and why (a None written
    either way)."""
    slips = []
    for head in _GRAD_STATES:
        for embed in _GRAD_STATES:
            if head == "numbers" and embed == "None":
                continue
            said = [f"head.weight.grad: {'right' if head == 'numbers' else 'wrong: ' + _HEAD_SLIPS[head]}",
                    f"embed.weight.grad: {'right' if embed == 'None' else 'wrong: ' + _EMBED_SLIPS[embed]}"]
            slips.append(([None if head == "None" else head, None if embed == "None" else embed], ". ".join(said)))
    return slips


@prediction(
    "01.e",
    "head.weight.grad and embed.weight.grad after the guard raised at ms (zero_grad() had set both to None)",
    why="backward fills a parameter's .grad when it reaches the operation that used the parameter, and an error "
        "raised in a hook stops it where it is. head comes after ms in forward, so backward reached it first: its "
        "gradient holds finite numbers. embed comes before ms: backward never got there, and its .grad stays None. "
        "So after a caught error, skip optimizer.step(): it would update head from half a backward pass.",
    wrong=_half_slips(),
    form=lambda guess: None if isinstance(guess, list | tuple) and len(guess) == 2
    and all(g is None or g in _GRAD_STATES for g in guess) else 'a list of two of "None", "NaN", "zeros", '
                                                                '"numbers": [head.weight.grad, embed.weight.grad]',
)
def _grad_after_raise() -> list[str]:
    embed, head, x, y = _problem()
    steps = _steps(embed, head, x)
    with Hooks() as hooks:
        for handle in guard(steps):
            hooks.add(handle)
        with contextlib.suppress(FloatingPointError):
            nn.functional.cross_entropy(steps["logits"], y).backward()
    return [_state(head.weight.grad), _state(embed.weight.grad)]


@prediction(
    "01.f",
    "the padded row of the gradient at h, at step 0, with the repair hook on ms",
    why="h's gradient has two terms. The one through normed is dnormed / (rms + 1e-6), and dnormed's padded row "
        "is 0, since the loss ignores that row (01.2's given lines make it 0 there). The one through ms is "
        "dms · 2h / D: after the repair dms is a finite 0 there, and h is 0. So the padded row is 0: zeroing ms's "
        "NaN lost nothing.",
    wrong=[
        ("NaN", "your repair hook on ms turns the NaN into 0 before it goes on to h: what is left to make a NaN?"),
        ("huge", "the term through normed divides dnormed by 1e-6, but dnormed's padded row is 0, as in 01.2: the "
                 "loss ignores that row (label -100)"),
    ],
)
def _repaired_row() -> str:
    model, xs, ys = _lesson_problem()
    step = torch.nonzero((xs[:, -1] == 0).all(dim=1)).flatten()[0].item()
    steps, caught = _steps(model[0], model[1], xs[step]), {}
    steps["ms"].register_hook(repair_hook)
    steps["h"].register_hook(lambda grad: caught.__setitem__("h", grad[-1]))
    nn.functional.cross_entropy(steps["logits"], ys[step]).backward()
    row = caught["h"]
    return "NaN" if row.isnan().any() else "zeros" if (row == 0).all() else "huge" if row.norm() > 1e3 else "ordinary"


# ----- 01.1 to 01.4 ------------------------------------------------------------------------------
def _scale_case(scale_grad, factor: float, leaf: bool) -> Outcome | None:
    """The answer on a leaf or on an intermediate tensor: two backward passes with the hook, without
    zeroing in between (x.grad adds both up), then one without."""
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    w = torch.tensor([0.5, 2.0, -4.0])
    t = x if leaf else x * 2
    through = 1.0 if leaf else 2.0  # d t / d x
    seen = []  # registered before the answer's hook: what arrives at t, and a copy of it
    with Hooks() as watcher:
        watcher.add(t.register_hook(lambda g: seen.append((g, g.clone()))))
        handle = scale_grad(t, factor)
        bad = not_a_handle(handle, "scale_grad")
        if bad:
            return bad
        try:
            (t * w).sum().backward(retain_graph=True)
            once = x.grad.clone()
            (t * w).sum().backward(retain_graph=True)
        finally:
            handle.remove()
        with_hook = x.grad.clone()
        x.grad = None
        (t * w).sum().backward()
    where = "a parameter-like leaf" if leaf else "an intermediate tensor (x * 2)"
    want = factor * through * w
    if compare_tensors(once, want).passed and compare_tensors(with_hook, factor * (factor + 1) * through * w).passed:
        return Outcome(False, f"after two backward passes without zeroing, x.grad is {_rounded(with_hook)}, "
                              f"expected 2 × {factor:g} × {_rounded(through * w)} = {_rounded(2 * want)}: your hook "
                              "scaled x.grad, the running sum, so the first gradient was scaled twice. Scale the "
                              "gradient as it arrives: t.register_hook, returning grad * factor")
    if any(not torch.equal(g, copy) for g, copy in seen):
        return Outcome(False, "the hook changed the gradient it received in place: return a new tensor "
                              "(grad * factor), do not write into grad")
    if torch.equal(with_hook, 2 * through * w):
        return Outcome(False, f"on {where}, the gradient was not scaled: the hook must return the new gradient "
                              "(a hook that returns None leaves it as it was)")
    if compare_tensors(once, want).passed and not compare_tensors(with_hook, 2 * want).passed:
        return Outcome(False, f"after one backward x.grad is right, but after a second one, without zeroing, it "
                              f"is {_rounded(with_hook)}, expected {_rounded(2 * want)}: scale every gradient that "
                              "arrives, not only the first")
    if not compare_tensors(with_hook, 2 * want).passed:
        return Outcome(False, f"on {where} with factor {factor:g}, after two backward passes x.grad is "
                              f"{_rounded(with_hook)}, expected {_rounded(2 * want)}: return grad * factor")
    if not torch.equal(x.grad, through * w):
        return Outcome(False, "after handle.remove() the gradient is still scaled: return the handle of the hook")
    return None


@exercise("01.1", "scale the gradient arriving at a tensor")
def _scale(scale_grad) -> Outcome:
    """``scale_grad(t, factor)`` registers a hook on tensor ``t`` that returns its gradient times
    ``factor``, and returns the handle."""
    for factor, leaf in ((3.0, True), (-0.5, False)):
        wrong = _scale_case(scale_grad, factor, leaf)
        if wrong:
            return wrong
    return Outcome(True, "every gradient scaled, two backward passes, on a leaf and on an intermediate tensor, "
                         "and back to normal after remove()")


def _run_guard(guard, named: dict[str, torch.Tensor], loss: torch.Tensor,
               after=lambda hooks: None) -> tuple[Exception | None, str] | Outcome:
    """The answer's hooks on ``named`` (then ``after(hooks)``, which may add hooks of the check's own), one
    backward from ``loss``: what the answer raised (None if nothing) and what it printed; or an Outcome if it
    did not return a list of handles, one per tensor."""
    with Hooks() as hooks:
        handles = guard(dict(named))
        if is_handle(handles) or isinstance(handles, str | torch.Tensor) or not isinstance(handles, Iterable):
            return Outcome(False, f"return the list of handles, one per tensor, got {kind_of(handles)}")
        handles = list(handles)
        if len(handles) != len(named) or not all(is_handle(h) for h in handles):
            return Outcome(False, f"return the list of the {len(named)} handles, one per tensor, got "
                                  f"{[kind_of(h) for h in handles]}")
        for handle in handles:
            hooks.add(handle)
        after(hooks)
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                loss.backward()
            raised = None
        except Exception as e:  # any error the answer raises is the answer's
            raised = e
    return raised, printed.getvalue().strip()


def _guard_case(guard, padded: bool, repair: bool) -> tuple[Exception | None, nn.Module, str] | Outcome:
    """The lesson's model on a batch (padded or not), the answer's hooks on its five steps (after a repair
    hook on ms, if asked), one backward: what was raised, embed, and what the hooks printed."""
    embed, head, x, y = _problem()
    if not padded:
        x[2] = torch.tensor([0.5, -1.0, 1.5, 0.3])
    steps = _steps(embed, head, x)
    if repair:
        steps["ms"].register_hook(lambda grad: torch.nan_to_num(grad, nan=0.0))
    case = _run_guard(guard, steps, nn.functional.cross_entropy(steps["logits"], y))
    return case if isinstance(case, Outcome) else (case[0], embed, case[1])


def _named_in(raised: BaseException, names: Iterable[str]) -> list[str]:
    """The names the message mentions as words of their own: ``ms``, ``ms.grad``, ``'ms'`` and ``dms`` name
    ms; ``rms`` and ``msg`` do not."""
    return [name for name in names if _at(raised, name) is not None]


def _at(raised: BaseException, name: str) -> int | None:
    m = re.search(rf"(?<![A-Za-z0-9_])d?{re.escape(name)}(?![A-Za-z0-9_])", str(raised))
    return m.start() if m else None


def _names_first(raised: BaseException, name: str, names: Iterable[str]) -> bool:
    """Whether the message names ``name`` (``_named_in``'s rule: ``ms``, ``'ms'``, ``dms``, whole words only) and
    no other tensor of ``names``, the tensors the check passed in that run, before it. English words that are
    not among ``names`` do not count."""
    where = _at(raised, name)
    return where is not None and all((_at(raised, n) is None or _at(raised, n) > where) for n in names if n != name)


def _inf_first_case(guard) -> Outcome | None:
    """01.c's graph, r = x.abs().sqrt() at x = [4, 0]: the gradient at a is [0.25, inf], the NaN comes only at
    x. A guard that tests NaN alone raises at x, one tensor too late."""
    x = torch.tensor([4.0, 0.0], requires_grad=True)
    a = x.abs()
    r = a.sqrt()
    named, reached = {"r": r, "a": a, "x": x}, []

    def watch(hooks: Hooks) -> None:  # after the guard's: on a tensor, they run only if the guard's did not raise
        for name, t in named.items():
            hooks.add(t.register_hook(lambda grad, name=name: reached.append(name)))

    case = _run_guard(guard, named, r.sum(), after=watch)
    if isinstance(case, Outcome):
        return case
    raised = case[0]
    if raised is None or reached != ["r"]:
        where = "backward ran to the end" if raised is None else f"your hook raised {type(raised).__name__}: {raised}"
        return Outcome(False, f"on 01.c's r = x.abs().sqrt() at x = [4, 0], {where}. The gradient at a is "
                              "[0.25, inf]: the inf is made there, the NaN only at x. Test not "
                              "grad.isfinite().all(), False for NaN and ±inf, so that the guard stops backward at a")
    return None


def _finite_case(guard, values: list[float], shown: str, why: str) -> Outcome | None:
    """Backward through a finite gradient ``values`` (written ``shown``); a guard that raises on it fails with
    ``why``."""
    x = torch.ones(len(values), requires_grad=True)
    t = x * 1.0
    case = _run_guard(guard, {"t": t}, (t * torch.tensor(values)).sum())
    if isinstance(case, Outcome):
        return case
    if case[0] is not None:
        return Outcome(False, f"on the finite gradient {shown} your hook raised {type(case[0]).__name__}: "
                              f"{case[0]}. {why}")
    return None


def _overflow_case(guard) -> Outcome | None:
    """A finite gradient whose norm overflows float32: [1e20, 1e20] has norm √2·1e20, but its square 1e40 is
    beyond float32's largest, 3.4e38, so grad.norm() is inf. A guard that tests the norm raises on it."""
    why = ("Every entry is finite, but the norm squares them, and 1e40 overflows float32 to inf: "
           "torch.isfinite(grad.norm()) is False. Test the entries, grad.isfinite().all(), not the norm")
    return _finite_case(guard, [1e20, 1e20], "[1e20, 1e20]", why)


def _large_case(guard) -> Outcome | None:
    """A finite gradient near float32's largest (3.4e38): [1e35, -2]. A guard with a size threshold, such as
    grad.abs().max() > 1e30, raises on it."""
    why = ("float32 holds finite numbers up to 3.4e38, so 1e35 is finite: a size threshold such as "
           "grad.abs().max() > 1e30 tests something else. Test grad.isfinite().all()")
    return _finite_case(guard, [1e35, -2.0], "[1e35, -2]", why)


@exercise("01.3", "stop backward at the first bad gradient, by name")
def _guard(guard) -> Outcome:
    """``guard(named)`` registers a hook on each tensor of the dict ``named`` that raises ``FloatingPointError``
    naming the tensor first when a gradient arriving there holds a NaN or ±inf; returns the list of handles.
    The gradients stay as they were."""
    names = ["h", "ms", "rms", "normed", "logits"]
    # a clean batch: nothing raised, gradients unchanged
    embed, head, x, y = _problem()
    x[2] = torch.tensor([0.5, -1.0, 1.5, 0.3])
    nn.functional.cross_entropy(_steps(embed, head, x)["logits"], y).backward()
    plain = embed.weight.grad.clone()
    case = _guard_case(guard, padded=False, repair=False)
    if isinstance(case, Outcome):
        return case
    raised, embed, printed = case
    if raised is not None:
        return Outcome(False, f"on a batch with no padding, where every gradient is finite, backward raised "
                              f"{type(raised).__name__}: {raised}. Raise only for a NaN or ±inf")
    if not compare_tensors(embed.weight.grad, plain).passed:
        return Outcome(False, "with your hooks embed.weight.grad changed: a hook that only watches must return None")
    # the padded batch: stop at ms
    case = _guard_case(guard, padded=True, repair=False)
    if isinstance(case, Outcome):
        return case
    raised, embed, printed = case
    if raised is None and printed:
        return Outcome(False, f"on the padded batch your hook printed {printed.splitlines()[0]!r} but raised nothing, "
                              "so backward ran to the end and embed.weight.grad is NaN: raise FloatingPointError "
                              "instead of printing, so that backward stops there")
    if raised is None:
        return Outcome(False, "on the padded batch backward ran to the end, and embed.weight.grad is NaN: the "
                              "gradient at ms holds a NaN. A comparison with NaN is always False, so a test such "
                              "as grad.norm() > 1e9 misses it: test not grad.isfinite().all(), and raise")
    if not isinstance(raised, FloatingPointError):
        return Outcome(False, f"your hook raised {type(raised).__name__}: raise FloatingPointError, Python's "
                              "error for a floating-point problem, so the caller can tell it from any other")
    said = _named_in(raised, names)
    if not _names_first(raised, "ms", names):
        late = "ms" not in said and _names_first(raised, names[-1], names)
        if "ms" in said and len(said) < len(names):
            first = min(said, key=lambda n: _at(raised, n))
            return Outcome(False, f"the error says {str(raised)!r}: it names {first!r} before 'ms', the tensor "
                                  "whose gradient is bad. Name that tensor first; mention any other after it")
        return Outcome(False, f"the error says {str(raised)!r}, but the first bad gradient on the way back is at "
                              "'ms'" + (": every hook names the loop's last name? bind it with name=name" if late
                                        else f": it names {said}, so it does not say which tensor's gradient was "
                                             "bad. Name the tensor whose hook raised first in the message"
                                        if len(said) > 1 else f": it names {said[0]!r}, not the tensor whose hook "
                                        "raised" if said else ": put the tensor's name in the message"))
    if embed.weight.grad is not None:
        return Outcome(False, "the error names ms, but only after backward had finished: raise inside the hook, "
                              "so that backward stops there")
    # NaN at ms replaced by 0: every gradient finite, h's norm about 1.4e5 included
    case = _guard_case(guard, padded=True, repair=True)
    if isinstance(case, Outcome):
        return case
    if case[0] is not None:
        return Outcome(False, f"with the NaN at ms replaced by 0 every gradient is finite (the largest norm, at h, "
                              f"about 1.4e5), but backward raised {type(case[0]).__name__}: {case[0]}. Raise for "
                              "NaN or ±inf only, however large a finite gradient is")
    wrong = _inf_first_case(guard) or _overflow_case(guard) or _large_case(guard)
    if wrong:
        return wrong
    # after remove(), nothing is left
    embed, head, x, y = _problem()
    steps = _steps(embed, head, x)
    for handle in guard(dict(steps)):
        handle.remove()
    try:
        nn.functional.cross_entropy(steps["logits"], y).backward()
    except Exception:
        return Outcome(False, "after handle.remove() on every handle, backward still raises: return the handles "
                              "of your hooks")
    return Outcome(True, "clean batch untouched; stopped at ms on the NaN, at a on an inf (01.c), with the name "
                         "first in the error; silent on a finite gradient of norm 1.4e5, on [1e20, 1e20], whose "
                         "norm overflows, and on [1e35, -2]")


def _by_hand_case(by_hand) -> tuple[dict, tuple, object] | Outcome:
    """A batch like the lesson's (row 2 padded: zeros, label -100), in float64: the gradients hooks caught at
    logits, normed, rms, ms and h, the forward values (logits, y, head's weight, h, rms), and the answer's gradients."""
    torch.manual_seed(7)  # on the checker's own random stream (see ``exercise``)
    embed, head = nn.Linear(4, 6, bias=False).double(), nn.Linear(6, 3).double()
    x = torch.randn(4, 4, dtype=torch.float64)
    x[2] = 0.0
    steps, y = _steps(embed, head, x), torch.tensor([0, 2, -100, 1])
    caught = {}
    with Hooks() as hooks:
        for name in ("logits", "normed", "rms", "ms", "h"):
            hooks.add(steps[name].register_hook(lambda grad, name=name: caught.__setitem__(name, grad)))
        nn.functional.cross_entropy(steps["logits"], y).backward()
    h, rms, logits, w = steps["h"].detach(), steps["rms"].detach(), steps["logits"].detach(), head.weight.detach()
    graphs = []  # anything autograd saves for a backward while the answer runs: the answer built a graph
    with saved_tensors_hooks(lambda t: graphs.append(1) or t.detach(), lambda t: t):
        mine = by_hand(logits, y, w, h, rms)
    if graphs or (isinstance(mine, dict) and any(isinstance(d, torch.Tensor) and d.requires_grad
                                                  for d in mine.values())):
        return Outcome(False, "by_hand asked autograd (requires_grad_, backward or torch.autograd.grad): the point "
                              "is to derive them yourself, with the chain rule, from dnormed, h and rms; the hooks "
                              "are what your derivation is compared with")
    return caught, (logits, y, w, h, rms), mine


def _close(mine: torch.Tensor, want: torch.Tensor) -> bool:
    """The same values, whatever the form that computed them: float64 rounding (relative 1e-8, and 1e-10 of the
    largest entry for entries that cancel near 0) passes, a slip such as a missing 1e-6 does not."""
    return mine.shape == want.shape and torch.allclose(mine, want, rtol=1e-8, atol=1e-10 * float(want.abs().max()))


def _head_slip(mine: dict, caught: dict, logits, y, w) -> str | None:
    """What is wrong with the answer's gradients at logits and normed, if anything (the lesson gives both)."""
    dlogits, dnormed = mine["logits"], mine["normed"]
    real, want = y != -100, caught["logits"]
    n = int(real.sum())
    if dlogits.shape != logits.shape:
        return f"the gradient at logits has the shape {tuple(dlogits.shape)}, logits has {tuple(logits.shape)}"
    if _close(dlogits[real], want[real] * n):
        return (f"the gradient at logits is {n} times too large: cross_entropy takes the mean over the {n} rows "
                "it keeps, so divide softmax − one_hot by their number, (y != -100).sum()")
    if _close(dlogits[real], want[real] * n / len(y)):
        return (f"the gradient at logits: you divided by len(y) = {len(y)}, but the loss is the mean over the {n} "
                "rows it keeps (the label -100 leaves a row out): divide by (y != -100).sum()")
    if _close(dlogits[real], -want[real]):
        return "the gradient at logits has the wrong sign: it is (softmax − one_hot) / n, not one_hot − softmax"
    if not _close(dlogits[real], want[real]):
        return ("the gradient at logits differs from what the hook caught: for the mean cross-entropy it is "
                "(logits.softmax(dim=1) − one_hot(y)) / n, with n the number of rows the loss keeps")
    if not (dlogits[~real] == 0).all():
        return ("the gradient at logits is not 0 in the padded row: the loss leaves that row out (label -100), "
                "so nothing flows back from it. Multiply by the mask of kept rows, y != -100")
    if dnormed.shape != caught["normed"].shape:
        return (f"the gradient at normed has the shape {tuple(dnormed.shape)}, normed has "
                f"{tuple(caught['normed'].shape)}: logits = normed @ wᵀ + b, so dnormed = dlogits @ w")
    if not _close(dnormed, caught["normed"]):
        return "the gradient at normed differs from what the hook caught: logits = normed @ wᵀ + b, so dnormed = " \
               "dlogits @ w"
    return None


def _cmp(name: str, mine: torch.Tensor, caught: torch.Tensor) -> str:
    """Karpathy's cmp line, over every row: entries that are not numbers on both sides are equal."""
    both = mine.isfinite() & caught.isfinite()
    diff = (mine[both] - caught[both]).abs().max().item()
    return f"{name:<7}| close: True | max diff: {'below 1e-12' if diff < 1e-12 else f'{diff:.0e}'}"


def _drms_slip(d: torch.Tensor, want: torch.Tensor, dnormed, h, rms, real) -> str | None:
    if d.shape != want.shape:
        return (f"the gradient at rms has the shape {tuple(d.shape)}, rms has {tuple(want.shape)}: rms is "
                "broadcast over its row, each row's rms divides every entry of the row, so add up over the row "
                "(.sum(dim=1, keepdim=True))")
    if torch.allclose(d[real], -want[real], rtol=1e-4):
        return "the gradient at rms has the wrong sign: the derivative of h / (rms + 1e-6) with respect to rms is " \
               "−h / (rms + 1e-6)²"
    if _close(d[real], (dnormed * -h / rms**2).sum(dim=1, keepdim=True)[real]):
        return "the gradient at rms: close, but you left out the 1e-6: the derivative of h / (rms + 1e-6) with " \
               "respect to rms is −h / (rms + 1e-6)², not −h / rms² (float64 tells them apart)"
    if not _close(d, want):
        return "the gradient at rms differs from what the hook caught: normed = h / (rms + 1e-6), so each entry " \
               "of the row gives dnormed · (−h / (rms + 1e-6)²), and rms gets their sum"
    return None


def _dms_slip(dms: torch.Tensor, drms: torch.Tensor, want: torch.Tensor, rms, real) -> str | None:
    """The rows that are not padding first, then the padded one, which must be what autograd computes there: a
    guard (torch.where(rms > 0, ..., 0), a clamp) is another problem's answer. The message does not say what
    autograd computes there: prediction 01.d asks it next."""
    if dms.shape != want.shape:
        return f"the gradient at ms has the shape {tuple(dms.shape)}, ms has {tuple(want.shape)}: rms = √ms, one " \
               "entry for one entry"
    if _close(dms[real], drms[real]):
        return "your gradient at ms is the one at rms: ms reaches rms through the square root, so multiply by its " \
               "derivative, 1 / (2√ms) = 1 / (2 rms)"
    for said, slip in {"(2 · (rms + 1e-6))": drms / (2 * (rms + 1e-6)),
                       "(2 · √(ms + 1e-6))": drms / (2 * (rms**2 + 1e-6).sqrt())}.items():
        if _close(dms[real], slip[real]):
            return f"the gradient at ms: close, but the 1e-6 is in the wrong place: you divided by {said}. The " \
                   "1e-6 belongs to normed's line only. The square root's derivative is 1 / (2√ms) = 1 / (2 rms), " \
                   "with no 1e-6"
    if not _close(dms[real], want[real]):
        diff = (dms[real] - want[real]).abs().max().item()
        return f"in the rows that are not padding, your gradient at ms differs from what the hook caught by up " \
               f"to {diff:.1e}: the square root's derivative is 1 / (2√ms) = 1 / (2 rms)"
    if not torch.allclose(dms[~real], want[~real], equal_nan=True):
        return "in the padded row, where h is 0, your gradient at ms is not what autograd computes there: write " \
               "rms = √ms's line as the other rows have it, drms / (2 rms), with no guard (torch.where, a clamp). " \
               "What autograd makes of that row is the next prediction's question"
    return None


def _dh_slip(dh: torch.Tensor, dms: torch.Tensor, dnormed, want: torch.Tensor, h, rms, real) -> str | None:
    if dh.shape != h.shape:
        return f"the gradient at h has the shape {tuple(dh.shape)}, h has {tuple(h.shape)}"
    direct, through_ms = dnormed / (rms + 1e-6), dms * 2 * h / h.shape[1]
    if _close(dh[real], direct[real]):
        return "the gradient at h: you followed only the path through normed. h is also used by ms, the mean of " \
               "h² over the row: add that path's term, dms · 2h / (entries in a row)"
    if _close(dh[real], (direct + dms * 2 * h / 8)[real]):
        return f"the gradient at h: you divided by 8, the lesson's row length, but the check's rows have " \
               f"{h.shape[1]} entries: ms is the mean over a row, so divide by h.shape[1]"
    if _close(dh[real], through_ms[real]):
        return "the gradient at h: you followed only the path through ms. normed = h / (rms + 1e-6) uses h " \
               "directly too: add dnormed / (rms + 1e-6)"
    if not _close(dh[real], want[real]):
        diff = (dh[real] - want[real]).abs().max().item()
        return f"in the rows that are not padding, your gradient at h differs from what the hook caught by up to " \
               f"{diff:.1e}: two paths add up, dnormed / (rms + 1e-6) and dms · 2h / (entries in a row), since ms " \
               "is the mean of h²"
    if not torch.allclose(dh[~real], want[~real], equal_nan=True):
        return "in the padded row, where h is 0, your gradient at h is not what autograd computes there: normed = " \
               "h / (rms + 1e-6) passes dnormed / (rms + 1e-6) to h, and ms's path adds dms · 2h / (entries in a " \
               "row). Derive that row term by term, as the others, with no guard"
    return None


@exercise("01.2", "derive the gradients from normed back to h by hand")
def _by_hand(by_hand) -> Outcome:
    """``by_hand(logits, y, w, h, rms)`` returns the gradients of the mean cross-entropy at ``logits``,
    ``normed``, ``rms``, ``ms`` and ``h``, derived by the chain rule (``w`` is head's weight,
    ``normed = h / (rms + 1e-6)``, ``rms = √ms``, ``ms`` the mean of ``h²`` over a row). Each is compared by
    value, in backward's order and Karpathy's ``cmp`` style, with what a hook caught there, on every row: the
    batch is the lesson's case, a padded row (h = 0, label -100) that the loss leaves out, so the given lines mask
    it and divide by the rows kept. The padded row must be what autograd computes, line by line: a guard there
    answers another problem. No message says what autograd makes of that row: prediction 01.d asks it next."""
    case = _by_hand_case(by_hand)
    if isinstance(case, Outcome):
        return case
    caught, (logits, y, w, h, rms), mine = case
    names = ["h", "logits", "ms", "normed", "rms"]
    if not isinstance(mine, dict) or sorted(mine) != names:
        keys = sorted(mine) if isinstance(mine, dict) else None
        return Outcome(False, f"by_hand returned {kind_of(mine) if keys is None else f'a dict with keys {keys}'}: "
                              'return a dict {"logits": dlogits, "normed": dnormed, "rms": drms, "ms": dms, '
                              '"h": dh}')
    for name in ("logits", "normed", "rms", "ms", "h"):
        if not isinstance(mine[name], torch.Tensor):
            return Outcome(False, f'by_hand(...)["{name}"] is {kind_of(mine[name])}: return a tensor shaped like '
                                  f"{name}")
    real = y != -100
    dnormed = caught["normed"]
    slip = (_head_slip(mine, caught, logits, y, w)
            or _drms_slip(mine["rms"], caught["rms"], dnormed, h, rms, real)
            or _dms_slip(mine["ms"], mine["rms"], caught["ms"], rms, real)
            or _dh_slip(mine["h"], mine["ms"], dnormed, caught["h"], h, rms, real))
    if slip:
        return Outcome(False, slip)
    lines = [_cmp(name, mine[name], caught[name]) for name in ("logits", "normed", "rms", "ms", "h")]
    return Outcome(True, f"against the hooks, in float64, on all {len(y)} rows, the padded one included:\n"
                   + "\n".join(lines))


@exercise("01.4", "repair a gradient in backward: non-finite entries to 0")
def _repair(repair) -> Outcome:
    """``repair(t)`` registers a hook on tensor ``t`` that returns a new gradient, its NaN and ±inf entries
    replaced by 0 and every finite entry unchanged, and returns the handle."""
    x = torch.ones(6, requires_grad=True)
    t = x * 1.0
    arriving = torch.tensor([1.5, math.nan, math.inf, -math.inf, -2.0, 1e5])
    want = torch.tensor([1.5, 0.0, 0.0, 0.0, -2.0, 1e5])
    seen = []
    with Hooks() as watcher:
        watcher.add(t.register_hook(lambda g: seen.append((g, g.clone()))))
        handle = repair(t)
        bad = not_a_handle(handle, "repair")
        if bad:
            return bad
        try:
            (t * arriving).sum().backward(retain_graph=True)
        finally:
            handle.remove()
        got = x.grad.clone()
        x.grad = None
        (t * arriving).sum().backward()
    if any(not (torch.equal(g.isnan(), copy.isnan()) and torch.equal(g.nan_to_num(), copy.nan_to_num()))
           for g, copy in seen):
        return Outcome(False, "your hook changed the gradient it received in place: return a new tensor "
                              "(torch.where or torch.nan_to_num return one), do not write into grad")
    if got[2:4].isnan().any():
        return Outcome(False, f"x.grad is {got.tolist()}: NaN and ±inf became NaN. Multiplying by a mask "
                              "does not zero them, since NaN × 0 and inf × 0 are NaN: pick entries instead, "
                              "torch.where(grad.isfinite(), grad, 0.0), or use torch.nan_to_num")
    if got.isnan().any():
        return Outcome(False, f"a NaN got through: x.grad is {got.tolist()}. Return the repaired gradient from "
                              "the hook (a hook that returns None leaves it as it was)")
    if got[2:4].isinf().any():
        return Outcome(False, f"x.grad is {got.tolist()}: NaN became 0, but ±inf got through. Replace every "
                              "non-finite entry: grad.isfinite() is False for NaN and ±inf")
    if got.abs().max() > 1e30:
        return Outcome(False, f"x.grad is {got.tolist()}: the infinities became the largest float, not 0. "
                              "torch.nan_to_num replaces ±inf by ±3.4e38 unless you pass posinf=0.0, neginf=0.0")
    if not torch.equal(got[[0, 4, 5]], want[[0, 4, 5]]):
        return Outcome(False, f"x.grad is {got.tolist()}, expected {want.tolist()}: replace only the non-finite "
                              "entries; the finite ones, 1e5 included, stay as they arrive")
    if not torch.equal(got, want):
        return Outcome(False, f"x.grad is {got.tolist()}, expected {want.tolist()}: replace NaN and ±inf by 0")
    if not x.grad.isnan().any():
        return Outcome(False, "after handle.remove() the gradient is still repaired: return the handle of your "
                              "hook, so the caller can take it out")
    return Outcome(True, f"NaN and ±inf to 0, finite entries unchanged: {got.tolist()}; a new tensor; and "
                         "gone after remove()")


# ----- anomaly mode, read for the lesson ----------------------------------------------------------
def show_anomaly(run) -> None:
    """Call ``run()`` (a forward pass and its backward) in anomaly mode and print what anomaly mode says: the
    error backward raised, then each warning's first line and, for a traceback, its last two source lines (the
    forward line that made the bad value last), without file paths and line numbers, which change from
    machine to machine."""
    with warnings.catch_warnings(record=True) as warned, torch.autograd.detect_anomaly():
        warnings.simplefilter("always")  # keep each warning, to print it below
        try:
            run()
        except RuntimeError as e:
            print(f"anomaly mode raised RuntimeError: {e}")
    for w in warned:
        lines = str(w.message).splitlines()
        code = [line.strip() for line in lines if line.startswith("    ")]  # a traceback's source lines
        print("it warned:", lines[0], *code[-2:], sep="\n    ")


# ----- the lesson's training run and its figure --------------------------------------------------
def plot_steps(series: dict, title: str, limit: float | None = None) -> None:
    """One panel per series, a point per training step. A series may be a dict of named series: each gets
    its own colour and a label (gradient norms, on a log scale). A NaN is drawn as a red bar; ``None`` (a
    gradient backward never reached) is not drawn. With ``limit`` (the parameters' limit), a run's
    embed.weight gets a panel of its own, the only one where the limit is drawn, dashed."""
    import matplotlib.pyplot as plt

    if limit is not None and "embed.weight" in series.get("gradient norms", {}):
        tensors = {k: v for k, v in series["gradient norms"].items() if k != "embed.weight"}
        series = {**{k: v for k, v in series.items() if k != "gradient norms"},
                  "gradient norm at forward's tensors": tensors,
                  "embed.weight's gradient norm": series["gradient norms"]["embed.weight"]}

    _, axes = plt.subplots(1, len(series), figsize=(9, 2.6), layout="constrained", squeeze=False,
                           width_ratios=[1 if isinstance(v, list) else 2 for v in series.values()])
    for ax, (name, values) in zip(axes[0], series.items(), strict=True):
        lines = values if isinstance(values, dict) else {None: values}
        nan = sorted({i for vs in lines.values() for i, v in enumerate(vs) if v is not None and math.isnan(v)})
        for label, vs in lines.items():
            finite = [(i, v) for i, v in enumerate(vs) if v is not None and not math.isnan(v)]
            ax.plot(*zip(*finite, strict=True), ".", markersize=3, label=label,
                    color=None if label else "tab:blue")
        for i in nan:
            ax.axvline(i, color="tab:red", alpha=0.3)
        if "norm" in name:
            ax.set_yscale("log")
            if limit is not None and not isinstance(values, dict):
                ax.axhline(limit, color="grey", linestyle="--")
                name += f"\n(dashed: the parameters' limit {limit:g})"
        if isinstance(values, dict):
            ax.legend(loc="upper left", bbox_to_anchor=(1, 1), fontsize="small", markerscale=3)
        ax.set(xlabel="step", title=name + (f" (red: NaN at {len(nan)} steps)" if nan else ""))
    plt.suptitle(title)
    plt.show()


def _ghost(x: torch.Tensor, embed: nn.Module) -> torch.Tensor:
    """``x`` with its last image replaced by a ghost: the part of the image that embed's 8 rows see is dimmed
    × 1e-3, the rest kept, so that h is 1e-3 of what it was in that row, though the image is not faint."""
    w = embed.weight.detach().double()
    x = x.clone()
    seen = (torch.linalg.pinv(w) @ (w @ x[-1].double())).float()
    x[-1] -= (1 - 1e-3) * seen
    return x


def train(model: nn.Module, xs: torch.Tensor, ys: torch.Tensor, run, guard=None, finite_check: bool = False,
          param_limit: float | None = None, ghost_at: int | None = None, show_skips: int = 5,
          test: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """One SGD step a batch (lr 0.5) on a copy of ``model``, with ``run(x, net)`` as the forward pass.
    ``guard(named)``: its hooks go on the named tensors of each batch and come off after backward; with
    ``param_limit``, ``guard`` also goes on the parameters (embed.weight, head.weight, head.bias), and after
    it a hook that raises when a parameter's gradient norm is above that limit. ``finite_check``:
    ``clip_grad_norm_(..., error_if_nonfinite=True)`` before each update.
    ``ghost_at``: at that step the batch's last image becomes one that embed maps to (almost) 0. A step whose
    backward or check raises is skipped, with a line saying why for the first ``show_skips`` of them.
    Returns each step's loss and, under "gradient norms", each tensor's gradient norm at each step (caught by
    hooks of its own; None where backward stopped before it), embed.weight's included. With ``test`` (images,
    labels), the line it prints gives the trained copy's loss and accuracy on them instead of the training loss."""
    import copy

    net = copy.deepcopy(model)
    params = {"embed.weight": net[0].weight, "head.weight": net[1].weight, "head.bias": net[1].bias}
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    losses, norms, skipped = [], {}, 0
    for step, (xb, yb) in enumerate(zip(xs, ys, strict=True)):
        optimizer.zero_grad()
        steps = run(_ghost(xb, net[0]) if step == ghost_at else xb, net)
        loss = nn.functional.cross_entropy(steps["logits"], yb)
        seen = {}
        try:
            with Hooks() as hooks:  # removes every hook when the block ends, on an error too
                for name, t in [*steps.items(), ("embed.weight", params["embed.weight"])]:
                    hooks.add(t.register_hook(
                        lambda grad, name=name, seen=seen: seen.__setitem__(name, grad.norm().item())))
                for handle in guard(steps) if guard else []:
                    hooks.add(handle)
                for handle in guard(params) if guard and param_limit is not None else []:
                    hooks.add(handle)
                for name, p in params.items() if param_limit is not None else []:
                    hooks.add(p.register_hook(lambda grad, name=name: _limit(grad, name, param_limit)))
                loss.backward()
            if finite_check:
                nn.utils.clip_grad_norm_(net.parameters(), torch.inf, error_if_nonfinite=True)
            optimizer.step()
        except (FloatingPointError, RuntimeError) as e:
            skipped += 1
            if skipped <= show_skips:
                print(f"step {step}: {type(e).__name__}: {str(e).split(', so')[0]}; step skipped")
        losses.append(loss.item())
        for name in [*steps, "embed.weight"]:
            norms.setdefault(name, []).append(seen.get(name))
    last = [v for v in losses[-20:] if not math.isnan(v)]
    nan_weights = f"NaN weights in embed: {net[0].weight.isnan().sum().item()} of {net[0].weight.numel()}"
    if test is not None:
        print(f"{skipped:>3} of {len(losses)} steps skipped | {evaluate(net, run, *test)} | {nan_weights}")
    else:
        print(f"{len(losses)} steps, {skipped} skipped | mean loss of the last 20: "
              f"{sum(last) / len(last) if last else math.nan:.3f} | {nan_weights}")
    return {"loss": losses, "gradient norms": norms}


def evaluate(net: nn.Module, run, x: torch.Tensor, y: torch.Tensor) -> str:
    """``net``'s loss and accuracy on held-out images ``x`` and labels ``y``, with ``run(x, net)`` as the forward
    pass, as one short line."""
    logits = run(x, net)["logits"].detach()  # no backward: any hook run registers is never called
    loss = nn.functional.cross_entropy(logits, y).item()
    return f"test loss {loss:.3f}, accuracy {(logits.argmax(dim=1) == y).float().mean().item():.1%}"


# ----- worked answers the lesson falls back on ---------------------------------------------------
def yours_or_worked(names: dict, *wanted: str):
    """``hooklab.exercises.yours_or_worked`` for this lesson: ``"by_hand"`` (01.2), ``"guard"`` (01.3) and
    ``"repair"`` (01.4), the student's once passed, else the worked answers below."""
    from . import yours_or_worked as pick

    return pick(names, {"by_hand": ("01.2", by_hand), "guard": ("01.3", guard), "repair": ("01.4", repair)},
                *wanted)


def guard(named: dict[str, torch.Tensor]) -> list:
    """A worked answer to 01.3, for the lesson's next cells while the student's own has not passed
    (``train`` calls it with the named tensors of each batch)."""
    def hook(grad: torch.Tensor, name: str) -> None:
        if not grad.isfinite().all():
            raise FloatingPointError(f"gradient at {name}: norm {grad.norm().item():.3g}")

    return [t.register_hook(lambda grad, name=name: hook(grad, name)) for name, t in named.items()]


def _limit(grad: torch.Tensor, name: str, limit: float) -> None:
    """``train``'s norm limit on the parameters (the guide's ghost input): raise when the norm is above it."""
    if grad.norm() > limit:
        raise FloatingPointError(f"gradient at {name}: norm {grad.norm().item():.3g}")


def repair_hook(grad: torch.Tensor) -> torch.Tensor:
    """The hook of the worked answer to 01.4: non-finite entries to 0, as a new tensor."""
    return torch.where(grad.isfinite(), grad, torch.zeros_like(grad))


def repair(t: torch.Tensor):
    """A worked answer to 01.4 (see ``guard``)."""
    return t.register_hook(repair_hook)


def by_hand(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor, h: torch.Tensor,
            rms: torch.Tensor) -> dict[str, torch.Tensor]:
    """A worked answer to 01.2 (see ``guard``)."""
    real = (y != -100).unsqueeze(1)  # the rows the loss keeps: a padded row has the label -100
    onehot = nn.functional.one_hot(y.clamp(min=0), logits.shape[1])  # -100 becomes class 0, masked next
    dlogits = (logits.softmax(dim=1) - onehot) * real / real.sum()  # 0 in a padded row; mean over kept rows
    dnormed = dlogits @ w
    drms = (dnormed * -h / (rms + 1e-6) ** 2).sum(dim=1, keepdim=True)
    dms = drms / (2 * rms)
    dh = dnormed / (rms + 1e-6) + dms * 2 * h / h.shape[1]
    return {"logits": dlogits, "normed": dnormed, "rms": drms, "ms": dms, "h": dh}

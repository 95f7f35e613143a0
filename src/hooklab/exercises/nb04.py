"""Exercises and predictions of notebook 04: backprop by hand, from a 2-2-2 network to a CNN trained
on real digits with the student's own backward pass.

Predictions 04.a-04.e compute their truth with torch. Exercises, in the order the lesson asks them:

* 04.1 a linear layer of the 2-2-2 network (a bias shared by both units): three gradients;
* 04.2 ``keep_grads``: a tensor hook on every step of a forward, keeping each step's gradient by name;
* 04.3 cross-entropy in eight atomic steps, 04.4 its fused form;
* 04.5 batch norm in seven atomic steps (also the field guide's G4.6, registered in g4.py), 04.6 its fused form;
* 04.7 ``judged_alone``: a second hook hands each step the student's own gradient, so each step is checked on its own;
* 04.8 a convolution (via ``unfold`` / ``fold`` or any other way), 04.9 max pooling;
* 04.10 every layer whose backward formula disagrees with what its hooks recorded;
* 04.11 the whole CNN for one epoch of training, compared with autograd at every step.

The atomic exercises (04.3, 04.5) are judged **in chain order**, from the loss back, against the
gradients autograd gave each intermediate, kept by a tensor hook on it (in the order backward
produces them); the message names the first wrong step and the forward line that made it, after the
idea of the ``cmp`` helper of Karpathy's makemore part 4. The fused exercises (04.4, 04.6) are
compared with that chain. Every answer runs with autograd off and watched (``_by_hand``): autograd,
PyTorch's backward operators and the course's own formulas in ``hooklab.backprop`` fail it with a
message saying so.
"""

from __future__ import annotations

import contextlib
import copy
import re
import warnings
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..models import TinySigmoidNet
from . import Outcome, exercise, kind_of, prediction
from ._by_hand import (
    SHOWN_AS_BOUND,
    D,
    Trap,
    by_hand,
    check_cases,
    compare,
    compare_chain,
    one,
    rand,
    reference,
    verdict,
)

# ----- the 2-2-2 network (04.a, 04.1) -----------------------------------------------------------------
X222 = torch.tensor([[0.05, 0.1]], dtype=D)  # the 2-2-2 network's input
W1_222, B1_222 = torch.tensor([[0.15, 0.20], [0.25, 0.30]], dtype=D), torch.tensor([0.35], dtype=D)
W2_222, B2_222 = torch.tensor([[0.40, 0.45], [0.50, 0.55]], dtype=D), torch.tensor([0.60], dtype=D)
BATCH_222 = [[0.05, 0.1], [0.5, -0.3]]  # lesson 03's batch of two inputs, the first the classic one


def _bias_form(guess) -> str | None:
    if isinstance(guess, list | tuple | torch.Tensor) and len(guess) == 2:
        return "fc1's bias is one number shared by both units, shape (1,): its gradient is one number too"
    if isinstance(guess, torch.Tensor):
        return ("write a number, not a tensor: the question asks for the value, like 0.5 (a tensor's .item() gives "
                "its number)")
    if isinstance(guess, list | tuple) and len(guess) == 1:
        return f"write a number, not a {type(guess).__name__}: like 0.5, without brackets"
    return None


@prediction(
    "04.a", "fc1.bias.grad for a batch of two inputs, the bias shared by both units",
    why="z1 = a W1ᵀ + b puts the one shared bias in all four entries of z1 (two rows × two units), each with "
        "slope 1: its gradient sums all four entries of dz1, 0.0392 + 0.0435 + 0.0393 + 0.0436 = 0.1656.",
    wrong=[
        (0.0827, "that is one row's sum: a parameter's gradient also sums over the batch's rows, each row adds "
                 "its own dz1"),
        (0.0414, "that is the mean of dz1's four entries; the bias is added once to each entry, so each passes its "
                 "whole gradient: the sum, not the mean"),
        (1.0, "the bias's slope is 1 in each entry, but its gradient is that slope times the gradient arriving "
              "there, dz1, summed over every entry it enters"),
    ],
    rel=0.05,  # 0.16 or 0.17, read off the four printed entries, is the sum
    form=_bias_form,
)  # fmt: skip
def _shared_bias() -> float:
    net = TinySigmoidNet()
    net(torch.tensor(BATCH_222)).backward(torch.ones(2, 2))
    return net.fc1.bias.grad.item()


_LAYER_NAMES = ["da", "dw", "db"]


@exercise("04.1", "a linear layer with a shared bias: three gradients")
def _layer_grads(linear_backward) -> Outcome:
    """``linear_backward(a, w, dz) -> (da, dw, db)`` for ``z = a @ w.T + b`` with one bias of shape (1,)
    shared by both units; ``dz`` is the gradient arriving at ``z``. Tried on layer 2 of the 2-2-2
    network (from what its sigmoid passes back from ``[[1, 1]]``), then on layer 1, then on a batch of
    3 rows."""
    z1 = X222 @ W1_222.T + B1_222
    s1 = torch.sigmoid(z1)
    s2 = torch.sigmoid(s1 @ W2_222.T + B2_222)
    dz2 = s2 * (1 - s2)  # what s2 passes back from [[1, 1]] (lesson 03)
    dz1 = (dz2 @ W2_222) * s1 * (1 - s1)
    cases = [("layer 2 of the 2-2-2 network", s1, W2_222, B2_222, dz2),
             ("layer 1 (from what layer 2 passes back)", X222, W1_222, B1_222, dz1),
             ("a batch of 3 rows", rand(3, 2, seed=41), W1_222, B1_222, rand(3, 2, seed=42))]
    worst, worst_name = 0.0, ""
    for label, a, w, b, dz in cases:
        leaves = [t.clone().requires_grad_(True) for t in (a, w, b)]
        (leaves[0] @ leaves[1].T + leaves[2]).backward(dz)
        expected = tuple(t.grad for t in leaves)
        traps = _layer_traps(a, dz, w)
        got, failed = by_hand(linear_backward, ["a", "w", "dz"], a, w, dz)
        compared = failed or compare(got, expected, _LAYER_NAMES, traps)
        if isinstance(compared, Outcome):
            detail = _each(got, expected, traps) or compared.detail
            if _kept_dims(got, expected):  # dz.sum((0, 1), keepdim=True): the right number, shape (1, 1)
                detail = re.sub(r"db: shape \(1, 1\), expected \(1,\) \([^)]*\)", KEEPDIM, detail)
            if "db: shape (), expected (1,)" in detail:  # dz.sum(): the right number, a shape () tensor
                detail += (" (the shared bias is a tensor of shape (1,), and its gradient keeps that shape: sum, "
                           "then reshape(1))")
            return Outcome(False, f"with {label}: {detail}")
        if compared[0] >= worst:
            worst, worst_name = compared
    return verdict(_LAYER_NAMES, worst, worst_name, prefix="on both layers of the 2-2-2 network and a batch: ")


KEEPDIM = ("db: shape (1, 1), expected (1,): the right number, but keepdim=True keeps both summed dimensions as "
           "1s; the forward's b has shape (1,), and its gradient has b's shape: sum without keepdim, then reshape(1)")


def _kept_dims(got, expected) -> bool:
    """Whether the answer's db is the right number kept as a (1, 1) tensor (a sum with keepdim=True)."""
    if not isinstance(got, tuple | list) or len(got) != 3 or not isinstance(got[2], torch.Tensor):
        return False
    db = got[2]
    return tuple(db.shape) == (1, 1) and torch.allclose(db.reshape(1).to(expected[2].dtype), expected[2])


def _layer_traps(a, dz, w) -> list[Trap]:
    return [((dz @ w.T,), "z_j = Σ_i a_i W_ji, so ∂z_j/∂a_i = W_ji and da = dz @ w, not dz @ w.T"),
            ((dz.sum(0),), "your db has one entry per unit, as an nn.Linear's would; this network's bias is one "
                           "number shared by both units, shape (1,), so its gradient sums every entry of dz"),
            ((dz.mean().reshape(1),), "the shared bias enters every entry of z once: its gradient is the sum of "
                                      "dz, not the mean"),
            ((dz[:1].sum().reshape(1),), "db holds the first row only: a parameter's gradient sums over every row "
                                         "of the batch"),
            ((dz,), "db must have the bias's shape (1,): sum dz over every entry")]


def _each(got, expected, traps) -> str:
    """One verdict per gradient, like ``cmp``: ``da ok; dw: max |difference| ... (hint); db ok``.
    Empty when ``got`` is not three tensors (``compare`` explains that)."""
    if not isinstance(got, tuple | list) or len(got) != 3 or not all(isinstance(g, torch.Tensor) for g in got):
        return ""
    verdicts = []
    for name, g, e in zip(_LAYER_NAMES, got, expected, strict=True):
        result = one(name, g, e, traps if name in ("da", "db") else ())
        verdicts.append(result.detail if isinstance(result, Outcome) else f"{name} ok")
    return "; ".join(verdicts)


# ----- keep_grads (04.2): a tensor hook on every step ---------------------------------------------------
@exercise("04.2", "keep_grads: a tensor hook on every step, each gradient by name")
def _keep_grads(keep_grads) -> Outcome:
    """``keep_grads(steps) -> dict``: a tensor hook on each tensor of ``steps`` ({name: tensor}), so that
    backward fills the returned dict with each step's gradient by name, in the order it reaches them.
    Tried on cross-entropy's eight steps (``ce_steps``), against the gradients of hooks of our own."""
    logits, target = (rand(5, 4, seed=81) * 2).requires_grad_(True), torch.tensor([0, 3, 1, 1, 2])
    _, expected = _retained(lambda: ce_steps(logits, target), ("loss", *CE_CHAIN), lambda t: t["loss"].backward())
    mine = logits.detach().clone().requires_grad_(True)
    t = ce_steps(mine, target)
    kept = keep_grads(t)
    if kept is t:
        return Outcome(False, "you returned the steps you were given: return a new dict, which your hooks fill")
    if not isinstance(kept, dict):
        return Outcome(False, f"return the dict your hooks fill, not {type(kept).__name__}")
    if kept and all(value is None for value in kept.values()):
        return Outcome(False, "your dict holds None for every step: .grad is read when you build the dict, before "
                              "backward ran (and retain_grad is not a hook); a hook stores each gradient as it arrives")
    if kept:
        return Outcome(False, f"before backward ran, your dict already held {sorted(kept)}: let each hook add its "
                              "entry when its gradient arrives (the dict then lists the steps in the order "
                              "backward reached them)")
    t["loss"].backward()
    if not kept:
        return Outcome(False, "backward ran, but your dict is still empty: register a hook on each step with "
                              "value.register_hook(fn); autograd calls fn(grad) when that step's gradient is "
                              "ready: store grad in the dict there")
    if list(kept) == [list(t)[-1]] and torch.equal(kept[list(t)[-1]], expected["logits"]):
        return Outcome(False, f"only '{list(t)[-1]}' was kept, holding the last gradient backward made (dlogits): "
                              "each hook looked up `name` when it ran, after the loop had ended. Bind it when you "
                              "register: lambda grad, name=name: ...")
    if missing := [name for name in expected if name not in kept]:
        return Outcome(False, f"no gradient kept for {missing}: register a hook on every step")
    if extra := [name for name in kept if name not in expected]:
        return Outcome(False, f"your dict has keys {extra} that are not step names: key each gradient by its name")
    if not torch.equal(mine.grad, expected["logits"]):
        return Outcome(False, "your hooks changed the gradients: a hook that returns a tensor replaces the gradient; "
                              "store it and return None")
    worst, worst_name = 0.0, ""
    for name, grad in expected.items():
        got = kept[name]
        if not isinstance(got, torch.Tensor) or got.shape != grad.shape or not torch.allclose(got, grad):
            value = t[name]
            said = (" (that is the step's value: the hook receives the gradient)"
                    if isinstance(got, torch.Tensor) and got.shape == value.shape and torch.equal(got, value) else "")
            return Outcome(False, f"what you kept for '{name}' is not its gradient{said}")
        if (diff := float((got - grad).abs().max())) >= worst:
            worst, worst_name = diff, name
    return verdict(["every step's gradient"], worst, worst_name, verb="matches",
                   prefix="on cross-entropy's eight steps, in the order backward reached them: ")


# ----- cross-entropy: atomic steps (04.b, 04.3) and fused (04.4) ---------------------------------------
def ce_steps(logits, target, extra=0.0):
    """Cross-entropy in eight named steps, as notebook 04 writes it; the dict keeps every result.
    ``extra`` is added to ``counts_sum``: a softmax with one more class pinned at each row's maximum,
    whose loss depends on ``logit_maxes`` (04.3's check of the route back to the maximum)."""
    t = {"logits": logits}
    t["logit_maxes"] = logits.max(1, keepdim=True).values
    t["norm_logits"] = logits - t["logit_maxes"]
    t["counts"] = t["norm_logits"].exp()
    t["counts_sum"] = t["counts"].sum(1, keepdim=True) + extra
    t["counts_sum_inv"] = t["counts_sum"] ** -1
    t["probs"] = t["counts"] * t["counts_sum_inv"]
    t["logprobs"] = t["probs"].log()
    t["loss"] = -t["logprobs"][torch.arange(len(target)), target].mean()
    return t


CE_CHAIN = ("logprobs", "probs", "counts_sum_inv", "counts_sum", "counts", "norm_logits", "logit_maxes", "logits")
CE_LINES = {
    "logprobs": "loss = -logprobs[range(N), target].mean()",
    "probs": "logprobs = probs.log()",
    "counts_sum_inv": "probs = counts * counts_sum_inv",
    "counts_sum": "counts_sum_inv = counts_sum ** -1",
    "counts": "probs = counts * counts_sum_inv, and counts_sum = counts.sum(1, keepdim=True)",
    "norm_logits": "counts = norm_logits.exp()",
    "logit_maxes": "norm_logits = logits - logit_maxes",
    "logits": "norm_logits = logits - logit_maxes, and logit_maxes = logits.max(1, keepdim=True).values",
}


def _retained(steps, names, start):
    """Run ``steps`` (a dict-building forward) with every named intermediate kept by a tensor hook,
    backward from ``start(t)``; returns (t detached, {name: gradient}) in the order of ``names``."""
    t, kept = steps(), {}
    for name, value in t.items():
        if value.requires_grad:
            value.register_hook(lambda grad, name=name: kept.__setitem__(name, grad))
    start(t)
    grads = {name: kept[name].detach().clone() for name in names}
    return {k: v.detach().clone() for k, v in t.items()}, grads


def _ce_case(n, classes, seed, largest=None, extra=0.0):
    """A batch of ``n`` rows of ``classes`` logits and its targets (at most ``largest``), through
    ``ce_steps`` with every step retained: (the steps' values, target, each step's gradient)."""
    logits = (rand(n, classes, seed=seed) * 2).requires_grad_(True)
    target = torch.randint(0, classes if largest is None else largest + 1, (n,),
                           generator=torch.Generator().manual_seed(seed + 1))
    t, grads = _retained(lambda: ce_steps(logits, target, extra), CE_CHAIN, lambda t: t["loss"].backward())
    return t, target, grads


def _ce_traps(t, target, grads) -> dict[str, list[Trap]]:
    n = len(target)
    onehot = F.one_hot(target, t["logits"].shape[1]).to(D)
    return {
        "logprobs": [((-onehot,), "the loss is a mean over the N rows: each target entry gets −1/N"),
                     ((torch.full_like(onehot, -1 / n),), "only each row's target entry enters the loss: the "
                                                          "other entries of logprobs get 0")],
        "probs": [((grads["logprobs"] * t["probs"],), "d/dp log p = 1/p: divide by probs"),
                  ((grads["logprobs"] / t["logits"].softmax(1),), PROBS_RECOMPUTED)],
        "norm_logits": [((grads["counts"],), "d/dz exp(z) = exp(z): multiply dcounts by counts")],
        "counts_sum_inv": [((t["counts"] * grads["probs"],), "counts_sum_inv has shape (N, 1) and is broadcast "
                                                             "across each row: its gradient sums over the row "
                                                             "(keepdim=True)")],
        "counts_sum": [((-t["counts"].sum(1, keepdim=True) ** -2 * grads["counts_sum_inv"],), COUNTS_NOT_SUM)],
        "counts": [((t["counts_sum_inv"] * grads["probs"],), "counts is used twice, in probs and in counts_sum: "
                                                             "add the gradient that comes back through counts_sum"),
                   ((grads["counts_sum"].expand_as(t["counts"]),), "counts is used twice, in probs and in "
                                                                   "counts_sum: add the direct path through probs")],
        "logit_maxes": [((-grads["logit_maxes"],), "logit_maxes enters with a minus sign"),
                        ((torch.zeros_like(grads["logit_maxes"]),), MAXES_ZEROED)],
        "logits": [((grads["norm_logits"],), MAXES_DROPPED),
                   ((grads["norm_logits"] + grads["logit_maxes"] / t["logits"].shape[1],),
                    "logits.max picks one entry per row: route dlogit_maxes to each row's maximum only "
                    "(one_hot of argmax), not spread over the row")],
    }


ROUTE = ("in the exact cross-entropy dlogit_maxes is 0 up to rounding, so the check also runs your steps with "
         "counts_sum = counts.sum(1, keepdim=True) + 1 (one more class, pinned at each row's maximum), where the "
         "loss does depend on logit_maxes")
PROBS_RECOMPUTED = ("you divided by a probs you recomputed (counts / counts.sum(1), or a softmax), not by "
                    "t['probs']: the check also runs a changed forward, where counts_sum = counts.sum(1) + 1 and "
                    "probs is no longer the softmax of the logits. Read every forward value from t")
COUNTS_NOT_SUM = ("computed from t['counts'] rather than t['counts_sum']: the check also runs a case where "
                  "counts_sum is not counts.sum(1) (it is counts.sum(1) + 1) — read every value from t")
MAXES_ZEROED = f"dlogit_maxes is −Σ dnorm_logits over the row, not zeros: {ROUTE}"
MAXES_DROPPED = (f"dlogits lacks the path through logit_maxes = logits.max(1): route dlogit_maxes to each row's "
                 f"maximum (one_hot of argmax) and add it; {ROUTE}")


class Zero:
    """The truth of a prediction whose answer is 0, computed in float32: it matches any number within
    ``Zero.ATOL`` of 0 (a row of ten float32 probabilities sums to 1 only up to ~1e-7, so a guess read
    off a printed sum, like 1.5e-08, is right), and nothing farther (1/N = 0.03 and 1 are wrong)."""

    ATOL = 1e-5

    def __init__(self, measured: float) -> None:
        if abs(measured) > self.ATOL:
            raise AssertionError(f"expected 0 up to float32 rounding, torch gave {measured}")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Zero):
            return True
        return isinstance(other, int | float) and not isinstance(other, bool) and abs(other) <= self.ATOL

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "0.0"


class Small:
    """A wrong guess near 0 but not within float32 rounding of it (1e-5 < |guess| < 0.02)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int | float) and not isinstance(other, bool) and 1e-5 < abs(other) < 0.02

    __hash__ = None  # type: ignore[assignment]


@prediction(
    "04.b", "what each row of dlogits sums to",
    why="adding the same number to every logit of a row changes no probability, so it changes no loss: the "
        "loss has no slope in that direction, and that slope is the row's sum.",
    wrong=[(1.0, "add the same number to every logit of a row: does any probability change? The row's sum is "
                 "the loss's slope in that direction"),
           (-1.0, "add the same number to every logit of a row: does any probability change? The row's sum is "
                  "the loss's slope in that direction"),
           (1 / 32, "the 1/N of the mean scales every entry of a row, and scaling 0 gives 0: what does a row sum "
                    "to before the 1/N?"),
           ("0", "write a number, not a string: 0, without quotes"),
           (Small(), "close, but the sum is exactly 0 in exact arithmetic, and 0 up to float32 rounding (about "
                     "1e-7) as printed: shifting a row changes no probability, whatever the logits")],
)  # fmt: skip
def _row_sums() -> Zero:
    logits = (rand(8, 10, seed=71) * 2).float().requires_grad_(True)
    target = torch.arange(8) % 10
    F.cross_entropy(logits, target).backward()
    return Zero(float(logits.grad.sum(1).abs().max()))


def _recomputes(got, t, target) -> bool:
    """Whether 04.3's answer matches the chain of the plain cross-entropy of ``t["logits"]``: its forward
    recomputed from the logits, not read from ``t``."""
    logits = t["logits"].clone().requires_grad_(True)
    _, plain = _retained(lambda: ce_steps(logits, target), CE_CHAIN, lambda t: t["loss"].backward())
    return not isinstance(compare_chain(got, plain, CE_LINES, {}), Outcome)


@exercise("04.3", "cross-entropy in eight atomic steps, checked in chain order")
def _ce_chain(ce_backward_steps) -> Outcome:
    """``ce_backward_steps(t, target) -> {step: gradient}`` for the steps of ``ce_steps`` (``t`` holds
    each step's value). Judged in chain order from the loss, on a batch of 8 rows of 10 classes, then
    5 rows of 4, against the gradients autograd gives each step, kept by a tensor hook on it."""
    worst, worst_name = 0.0, ""
    for n, classes, seed, extra in ((8, 10, 61, 0.0), (5, 4, 63, 0.0), (6, 5, 67, 1.0)):
        t, target, grads = _ce_case(n, classes, seed, extra=extra)
        label = f"{n} rows of {classes} classes" + (", where counts_sum = counts.sum(1) + 1" if extra else "")
        try:
            got, failed = by_hand(ce_backward_steps, ["t", "target"], t, target)
        except RuntimeError as error:  # name the input it raised on; a size mismatch: often 10 classes written in
            if isinstance(error, NotImplementedError):
                raise
            tip = (". The check tries other numbers of classes than 10: read them from t (t['probs'].shape[1])"
                   if "size of tensor" in str(error) else "")
            return Outcome(False, f"with {label}: your code raised RuntimeError: {error}{tip}")
        result = failed or compare_chain(got, grads, CE_LINES, _ce_traps(t, target, grads))
        if isinstance(result, Outcome) and extra and not failed and _recomputes(got, t, target):
            result = Outcome(False, f"{result.detail}. Use the values in t, not a recomputed forward: the check feeds "
                                    "in a changed forward (counts_sum = counts.sum(1) + 1)")
        if isinstance(result, Outcome):
            return Outcome(False, f"with {label}: {result.detail}")
        if result[0] >= worst:
            worst, worst_name = result
    return verdict(["every step"], worst, worst_name, verb="matches",
                   prefix="dlogprobs … dlogits, in chain order, with 8 rows of 10 classes, 5 of 4, and 6 of 5 with "
                          "counts_sum = counts.sum(1) + 1 (a softmax with one more class, pinned at each row's "
                          "maximum, so that dlogit_maxes is not 0): ")


@exercise("04.4", "cross-entropy fused: dlogits in one expression")
def _ce_fused(ce_backward) -> Outcome:
    """``ce_backward(logits, target) -> dlogits`` for ``F.cross_entropy(logits, target)`` (class
    indices, mean over the batch), compared with the chain of 04.3's eight steps. In the second case
    the largest class never occurs among the targets."""
    worst, worst_name = 0.0, ""
    for n, classes, seed, largest in ((8, 10, 61, None), (5, 4, 65, 2)):
        t, target, grads = _ce_case(n, classes, seed, largest)
        probs, onehot = t["probs"], F.one_hot(target, classes).to(D)
        traps = [(((probs - onehot),), "the loss is the mean over the N rows: divide by N"),
                 ((probs / n,), "subtract the one-hot target: the correct class's entry is (p − 1)/N"),
                 (((probs - 1) / n,), "subtract 1 only at each row's correct class, not everywhere"),
                 (((probs + onehot) / n,), "a sign slip at the correct class: the loss is −log p_y, so its entry is "
                                           "(p_y − 1)/N: subtract the one-hot target"),
                 (((probs - 1) * onehot / n,), "every logit is in the softmax's denominator, so the wrong classes "
                                               "get p_j/N too, not 0")]
        try:
            got, failed = by_hand(ce_backward, ["logits", "target"], t["logits"], target)
        except RuntimeError as error:
            if "size of tensor a" not in str(error):
                raise
            return Outcome(False, f"your code raised RuntimeError: {error}. The targets here never include class "
                                  f"{classes - 1}, and F.one_hot infers the number of classes from the largest "
                                  "target: pass num_classes=logits.shape[1]")
        compared = failed or compare(got, (grads["logits"],), ["dlogits"], traps)
        if isinstance(compared, Outcome):
            return Outcome(False, f"with {n} rows of {classes} classes: {compared.detail}")
        if compared[0] >= worst:
            worst, worst_name = compared
    return verdict(["dlogits"], worst, worst_name, verb="equals the chain of eight steps, as computed by",
                   prefix="with 8 rows of 10 classes and 5 of 4: ")


# ----- batch norm: atomic steps (04.5, G4.6), each checked on its own (04.c), and fused (04.6) ----------------------
def bn_steps(x, gamma, beta, eps=1e-5):
    """Batch norm in training mode in seven named steps over the rows of ``x`` (N, C), as notebook 04
    writes it; the dict keeps every result."""
    t = {"x": x}
    t["mean"] = x.mean(0, keepdim=True)
    t["diff"] = x - t["mean"]
    t["diff2"] = t["diff"] ** 2
    t["var"] = t["diff2"].mean(0, keepdim=True)
    t["inv_std"] = (t["var"] + eps) ** -0.5
    t["x_hat"] = t["diff"] * t["inv_std"]
    t["y"] = gamma * t["x_hat"] + beta
    return t


BN_CHAIN = ("x_hat", "gamma", "beta", "inv_std", "var", "diff2", "diff", "mean", "x")
BN_LINES = {
    "x_hat": "y = gamma * x_hat + beta",
    "gamma": "y = gamma * x_hat + beta",
    "beta": "y = gamma * x_hat + beta",
    "inv_std": "x_hat = diff * inv_std",
    "var": "inv_std = (var + eps) ** -0.5",
    "diff2": "var = diff2.mean(0, keepdim=True)",
    "diff": "x_hat = diff * inv_std, and diff2 = diff ** 2",
    "mean": "diff = x - mean",
    "x": "diff = x - mean, and mean = x.mean(0, keepdim=True)",
}
EPS = 1e-5
BN_STEPS_EPS = 0.5  # G4.6's cases: an eps large enough that a dvar without it is plainly wrong


def _bn_case(n, c, seed, eps=EPS):
    x, gamma, beta = rand(n, c, seed=seed) * 2 + 1, rand(c, seed=seed + 1) * 0.5 + 1, rand(c, seed=seed + 2)
    dout = rand(n, c, seed=seed + 3)
    leaves = [v.clone().requires_grad_(True) for v in (x, gamma, beta)]
    t, grads = _retained(lambda: bn_steps(*leaves, eps), ("x_hat", "inv_std", "var", "diff2", "diff", "mean"),
                         lambda t: t["y"].backward(dout))  # fmt: skip
    grads.update(x=leaves[0].grad, gamma=leaves[1].grad, beta=leaves[2].grad)
    return t, x, gamma, dout, {name: grads[name] for name in BN_CHAIN}


def _bn_step_traps(t, dout, grads) -> dict[str, list[Trap]]:
    n = len(dout)
    return {
        "x_hat": [((dout,), "your dx_hat has no γ: y = γ·x_hat + β, so dx_hat = dout·γ")],
        "gamma": [((dout.sum(0),), "that is dbeta: gamma multiplies x_hat, so dgamma = Σ dout·x_hat over the rows"),
                  (((dout * t["diff"]).sum(0),), "γ multiplies x_hat, not diff: dgamma = Σ dout·x_hat over the rows")],
        "beta": [(((dout * t["x_hat"]).sum(0),), "that is dgamma: beta is added, so dbeta = Σ dout over the rows")],
        "inv_std": [((t["diff"] * grads["x_hat"],), "inv_std has shape (1, C) and is broadcast over the rows: its "
                                                    "gradient sums over them (keepdim=True)")],
        "var": [((0.5 * t["inv_std"] ** 3 * grads["inv_std"],), "a sign slip: d/dv (v + eps)^(-1/2) = "
                                                                 "-1/2 (v + eps)^(-3/2)"),
                ((-0.5 * t["inv_std"] * grads["inv_std"],), "d/dv (v + eps)^(-1/2) = -1/2 (v + eps)^(-3/2): that is "
                                                            "inv_std ** 3, not inv_std"),
                ((-0.5 * t["var"] ** -1.5 * grads["inv_std"],),
                 f"your dvar drops eps: eps is not passed in, but t's inv_std = (var + eps)^(-1/2) holds it (here "
                 f"eps = {BN_STEPS_EPS}, large enough to show): write (var + eps)^(-3/2) as inv_std ** 3")],
        "diff2": [((grads["var"].expand_as(t["diff2"]),), "var is the mean over the N rows: each row of diff2 "
                                                          "counts 1/N"),
                  (((grads["var"] / (n - 1)).expand_as(t["diff2"]),),
                   "1/(N − 1) is Bessel's correction, the unbiased variance of x.var(0); batch norm in training "
                   "divides by N (var = diff2.mean(0)): each row of diff2 counts 1/N")],
        "diff": [((t["inv_std"] * grads["x_hat"],), "diff is used twice, in x_hat and in diff2: add the gradient "
                                                    "that comes back through diff2 (the path of the variance)"),
                 ((2 * t["diff"] * grads["diff2"],), "diff is used twice, in diff2 and in x_hat: add the direct "
                                                     "path through x_hat"),
                 ((t["inv_std"] * grads["x_hat"] + t["diff"] * grads["diff2"],), "the path through diff2 lost its "
                                                                                  "2: d(diff²)/d diff = 2·diff")],
        "mean": [((grads["diff"].sum(0, keepdim=True),), "mean enters diff = x − mean with a minus sign")],
        "x": [((grads["diff"] + grads["mean"],), "mean = x.mean(0): each of the N rows contributes 1/N to the mean, "
                                                 "so dx gets dmean/N"),
              ((grads["diff"],), "x is used twice, in diff and in mean: add the gradient that comes back through "
                                 "the mean"),
              ((grads["diff"] + grads["mean"] * n,), "mean = x.mean(0): multiply dmean by 1/N, not by N")],
    }


JUDGED_ALONE_AFTER = ("inv_std", "var", "diff2", "diff", "mean", "x")  # the steps after x_hat, from y back


def two_slips(t, gamma, dout):
    """04.c's chain: two independent slips. ``d["x_hat"]`` forgets γ, and ``d["x"]`` forgets the path through
    the mean (``d["x"] = d["diff"]``); every other step is derived rightly from the gradients before it."""
    d = bn_backward_steps(t, torch.ones_like(gamma), dout)
    return {**d, "x": d["diff"]}


@prediction(
    "04.c", "with a second hook handing on your gradient, which rows fail for a chain with two slips",
    why="x_hat's and x's: the second hook hands each step your gradient, so each row compares your step with "
        "autograd's rule applied to your gradient of the step after it. Only the two steps whose own rule slipped "
        "disagree; inv_std … mean are computed rightly from your wrong d['x_hat'], and agree.",
    wrong=[
        (frozenset(["x_hat", *JUDGED_ALONE_AFTER]),
         "that is what a comparison with autograd's own gradients gives (bn_grads): every step after the first slip "
         "inherits it. Here a hook hands each step your gradient, so a step computed rightly from a wrong gradient "
         "agrees with autograd's rule applied to that same gradient"),
        (frozenset(["x_hat"]), "x_hat's row fails, but the first False is not the only one here: x's row compares "
                               "your d['x'] with autograd's rule applied to your d['diff'] and d['mean']. Does "
                               "dropping the mean's path show?"),
        (frozenset(["x"]), "x's row fails; and x_hat's own row compares your d['x_hat'] (no γ) with what autograd's "
                           "rule hands x_hat from y, dout·γ"),
        (frozenset(JUDGED_ALONE_AFTER), "x_hat's own row compares your d['x_hat'] (no γ) with what autograd's rule "
                                        "hands x_hat from y, dout·γ: that row fails. And inv_std … mean, computed "
                                        "rightly from it?"),
        (frozenset(["x_hat", "inv_std", "x"]), "inv_std's row compares your d['inv_std'], computed rightly from your "
                                               "d['x_hat'], with autograd's rule applied to that same d['x_hat']: "
                                               "they agree"),
        (frozenset(["x_hat", "mean", "x"]), "d['mean'] is computed rightly from your d['diff']: its row agrees. Only "
                                            "x's own formula drops the mean's path"),
        (frozenset(["x_hat", "gamma", "beta"]), "dgamma = Σ dout·x_hat and dbeta = Σ dout use dout, not d['x_hat']: "
                                                "forgetting γ in d['x_hat'] leaves them right"),
        (frozenset(), "x_hat's own row compares your d['x_hat'] (no γ) with what autograd's rule hands x_hat from y: "
                      "dout·γ"),
    ],
)  # fmt: skip
def _judged_alone() -> frozenset:
    """The experiment of the lesson's cell: keep_grads, then a hook per step returning ``two_slips``'s chain."""
    t, x, gamma, dout, _ = _bn_case(16, 3, 91)
    slipped = two_slips(t, gamma, dout)
    leaves = [v.clone().requires_grad_(True) for v in (x, gamma, rand(3, seed=93))]
    steps = {**bn_steps(*leaves), "gamma": leaves[1], "beta": leaves[2]}
    arrived = keep_grads(steps)
    for name, value in steps.items():
        if name in slipped:
            value.register_hook(lambda grad, name=name: slipped[name])
    steps["y"].backward(dout)
    return frozenset(name for name, got in arrived.items() if name in slipped
                     and not torch.allclose(slipped[name], got))


def _fresh_bn_steps(x, gamma, beta):
    """bn_steps on new leaves, plus ``gamma`` and ``beta``: a forward whose graph no backward has used yet."""
    leaves = [v.clone().requires_grad_(True) for v in (x, gamma, beta)]
    return {**bn_steps(*leaves), "gamma": leaves[1], "beta": leaves[2]}


def _hands_on(value: torch.Tensor) -> bool:
    """Whether a hook still on ``value`` returns a gradient (replaces what arrives): called on zeros."""
    hooks = getattr(value, "_backward_hooks", None) or {}
    return any(hook(torch.zeros_like(value)) is not None for hook in list(hooks.values()))


@exercise("04.7", "a second hook that hands on your gradient: each step checked on its own")
def _judge_alone(judged_alone) -> Outcome:
    """``judged_alone(steps, d, dout) -> {step: gradient that arrived}``: keep_grads on ``steps`` first, then
    on each step of ``d`` a hook returning ``d[name]``, then ``steps["y"].backward(dout)``; the hooks that
    return a gradient are gone afterwards. Tried with a chain whose d['x_hat'] forgot γ."""
    t, x, gamma, dout, _ = _bn_case(16, 3, 91)
    beta = rand(3, seed=93)
    d = bn_backward_steps(t, torch.ones_like(gamma), dout)  # d['x_hat'] forgot γ; every later step right from it
    expected = judged_alone_reference(_fresh_bn_steps(x, gamma, beta), d, dout)
    own_steps = _fresh_bn_steps(x, gamma, beta)
    own = keep_grads(own_steps)
    own_steps["y"].backward(dout)  # autograd's own gradients, with no hook handing anything on
    steps = _fresh_bn_steps(x, gamma, beta)
    try:
        got = judged_alone(steps, d, dout)
    except RuntimeError as error:
        if "hook" in str(error) and ("size" in str(error) or "shape" in str(error)):
            return Outcome(False, "a hook returned a gradient of another step's shape: each hook looked `name` up "
                                  "when it ran, after the loop had ended. Bind it when you register: "
                                  "lambda grad, name=name: d[name]")
        raise
    if not isinstance(got, dict):
        return Outcome(False, f"return the dict keep_grads filled (what arrived at each step), not {kind_of(got)}")
    got = dict(got)  # a copy: probing the hooks below may write into the student's dict
    if missing := [name for name in d if name not in got]:
        return Outcome(False, f"no gradient arrived for {missing}: call keep_grads(steps) and run "
                              "steps['y'].backward(dout) inside your function, then return keep_grads's dict")
    if all(torch.equal(got[name], d[name]) for name in d):
        return Outcome(False, "what arrived at each step is your own gradient: your hook ran before keep_grads's, "
                              "so keep_grads recorded the gradient yours handed on. Hooks on one tensor run in "
                              "the order they were registered: call keep_grads(steps) first, then add yours")
    after = [name for name in JUDGED_ALONE_AFTER if not torch.allclose(got[name], expected[name])]
    if after and all(torch.allclose(got[name], own[name]) for name in after):
        return Outcome(False, f"at {after[0]!r} arrived autograd's own gradient, not what your gradient of the step "
                              "before gives: your second hook returns nothing (None), which leaves autograd's "
                              "gradient as it is. Return d[name] from it: a hook's return value replaces the gradient")
    worst, worst_name = 0.0, ""
    for name in d:
        if got[name].shape != expected[name].shape or not torch.allclose(got[name], expected[name]):
            return Outcome(False, f"what your dict holds for {name!r} is not what arrived there from your gradient "
                                  "of the step before it")
        if (diff := float((got[name] - expected[name]).abs().max())) >= worst:
            worst, worst_name = diff, name
    if kept := [name for name in d if _hands_on(steps[name])]:
        return Outcome(False, f"after your function returned, a hook still hands on your gradient at {kept[0]!r} "
                              f"({len(kept)} steps in all): any later backward through these steps gets yours, not "
                              "autograd's. Add each handle to a hooklab.Hooks() (handles.add(...)) and run backward "
                              "inside its with block, so the hooks go when it ends")
    return verdict(["what arrived at every step"], worst, worst_name, verb="matches",
                   prefix="each step met the gradient your chain handed it (d['x_hat'] without γ): ")


@exercise("04.5", "batch norm in seven atomic steps, checked in chain order")
def _bn_chain(bn_backward_steps) -> Outcome:
    """``bn_backward_steps(t, gamma, dout) -> {step: gradient}`` for the steps of ``bn_steps`` plus
    ``gamma`` and ``beta`` (``t`` holds each step's value, ``dout`` arrives at ``y``). Judged in chain
    order from ``y``, with x of shape (6, 4), then (3, 5)."""
    worst, worst_name = 0.0, ""
    for (n, c), seed in (((6, 4), 51), ((3, 5), 55)):
        t, _, gamma, dout, grads = _bn_case(n, c, seed, BN_STEPS_EPS)
        got, failed = by_hand(bn_backward_steps, ["t", "gamma", "dout"], t, gamma, dout)
        result = failed or compare_chain(got, grads, BN_LINES, _bn_step_traps(t, dout, grads))
        if isinstance(result, Outcome):
            return Outcome(False, f"with x of shape {(n, c)}: {result.detail}")
        if result[0] >= worst:
            worst, worst_name = result
    return verdict(["every step"], worst, worst_name, verb="matches",
                   prefix="dx_hat … dx, in chain order, with x of shapes (6, 4) and (3, 5): ")


def _bn_by_paths(x, gamma, dout, eps, var=None, mean_n=True, var_n=True, frozen=False, paths=("mean", "var")):
    """dx of batch norm from its three paths (direct, through the variance, through the mean), with the
    slips 04.6 names: ``var`` another variance (``x.var(0)``), ``mean_n`` / ``var_n`` False for a
    missing 1/N on that path, ``frozen`` for the statistics treated as constants, ``paths`` without
    ``"mean"`` or ``"var"`` for that path dropped."""
    n = len(x)
    mean = x.mean(0)
    var = x.var(0, unbiased=False) if var is None else var
    inv_std = (var + eps) ** -0.5
    dx_hat = dout * gamma
    direct = dx_hat * inv_std
    if frozen:
        return direct
    dvar = (dx_hat * (x - mean)).sum(0) * -0.5 * inv_std**3
    dmean = -(dx_hat * inv_std).sum(0)
    through_var = dvar * 2 * (x - mean) / (n if var_n else 1) if "var" in paths else 0
    through_mean = dmean / (n if mean_n else 1) if "mean" in paths else 0
    return direct + through_var + through_mean


def _bn_unbiased(x, gamma, beta, eps):
    return (x - x.mean(0)) / (x.var(0, unbiased=True) + eps).sqrt() * gamma + beta


def _bn_bessel_factor(x, gamma, dout, eps):
    """dx by the fused formula of Karpathy's makemore part 4, with its n/(n − 1) factor kept on a variance
    that divides by N."""
    n = len(x)
    inv_std = (x.var(0, unbiased=False) + eps) ** -0.5
    x_hat, g = (x - x.mean(0)) * inv_std, dout * gamma
    return inv_std / n * (n * g - g.sum(0) - n / (n - 1) * x_hat * (g * x_hat).sum(0))


def _bn_traps(x, gamma, dout, eps) -> list[Trap]:
    n = len(x)
    unbiased_var = x.var(0, unbiased=True)
    x_hat_unbiased = (x - x.mean(0)) * (unbiased_var + eps) ** -0.5
    bessel = (f"x.var(0) divides by N − 1 (Bessel's correction); batch norm's v = mean((x − μ)²) divides by N = "
              f"{n}: use x.var(0, unbiased=False)")
    x_hat = (x - x.mean(0)) * (x.var(0, unbiased=False) + eps) ** -0.5
    no_gamma = ("your dx has no γ: the normalised input x̂ is multiplied by the weight γ before the next layer, so "
                "every path from the loss to x starts at dx̂ = dout·γ")
    return [
        ((_bn_by_paths(x, gamma, dout, eps) / gamma,), no_gamma),
        ((_bn_by_paths(x, gamma, dout, eps) / gamma + (gamma - 1) * dout * (x.var(0, unbiased=False) + eps) ** -0.5,),
         "γ multiplies all three paths, not only the direct one: each starts at dx̂ = dout·γ"),
        ((2 * _bn_by_paths(x, gamma, dout, eps, paths=("mean",)) - _bn_by_paths(x, gamma, dout, eps),),
         "a sign slip in the variance's term: inv_std = (v + eps)^(−1/2) falls as v grows, so that term is "
         "−γ·inv_std·x̂·mean(dout·x̂)"),
        ((dout.sum(0),), "that is dbeta: γ multiplies x̂, so dgamma = Σ dout·x̂ over the rows"),
        (((dout * x_hat).sum(0),), "that is dgamma: β is added, so dbeta = Σ dout over the rows"),
        (((dout * x).sum(0),), "γ multiplies the normalised x̂, not x: dgamma = Σ dout·x̂ over the rows"),
        ((_bn_by_paths(x, gamma, dout, eps, frozen=True), (dout * (x - x.mean(0)) * (x.var(0, unbiased=False) + eps)
          ** -0.5).sum(0), dout.sum(0)), "the mean and the variance depend on x too: every row of a column changes "
                                         "them, which adds two paths to dx"),
        ((_bn_by_paths(x, gamma, dout, eps, frozen=True),), "the mean and the variance depend on x too: every row of "
                                                            "a column changes them, which adds two paths to dx"),
        ((_bn_by_paths(x, gamma, dout, eps, paths=("var",)),),
         "dx lacks the path through the mean μ: every x of a column moves μ by 1/N, and μ moves every x̂ of the "
         "column, which adds −γ·inv_std·mean(dout) to each row (the −mean(dout) term of the fused form)"),
        ((_bn_by_paths(x, gamma, dout, eps, paths=("mean",)),),
         "dx lacks the path through the variance v: every x of a column moves v, and v scales every x̂ of the "
         "column, which adds −γ·inv_std·x̂·mean(dout·x̂) to each row (the x̂·mean(dout·x̂) term of the fused form)"),
        ((_bn_by_paths(x, gamma, dout, eps, var=unbiased_var),), bessel),
        (((dout * x_hat_unbiased).sum(0),), bessel),
        (reference(partial(_bn_unbiased, eps=eps), (x, gamma, torch.zeros_like(gamma)), dout)[:1], bessel),
        ((_bn_bessel_factor(x, gamma, dout, eps),),
         f"the factor n/(n − 1) on the variance's term is Bessel's correction, for a variance that divides by N − 1 "
         f"(as in makemore's batch norm); batch norm's v = mean((x − μ)²) divides by N = {n}: drop the factor"),
        ((_bn_by_paths(x, gamma, dout, eps, mean_n=False),), "the path through μ lost its 1/N: μ = mean(x) over the "
                                                             "N rows, so ∂μ/∂x = 1/N"),
        ((_bn_by_paths(x, gamma, dout, eps, var_n=False),), "the path through v lost its 1/N: v = mean((x − μ)²) "
                                                            "over the N rows, so ∂v/∂x = 2(x − μ)/N"),
        ((_bn_by_paths(x, gamma, dout, eps, mean_n=False, var_n=False),), "the paths through μ and v both lost their "
                                                                          "1/N: both are means over the N rows"),
        ((_bn_by_paths(x, gamma, dout, 0.0), (dout * (x - x.mean(0)) * x.var(0, unbiased=False) ** -0.5).sum(0),
          dout.sum(0)), f"your gradients ignore eps: inv_std = (v + eps)^(−1/2), and here eps = {eps}, large enough "
                        "to show"),
        ((_bn_by_paths(x, gamma, dout, 0.0),), f"your dx ignores eps: inv_std = (v + eps)^(−1/2), and here eps = "
                                               f"{eps}, large enough to show"),
    ]


def _ignores_eps(got, x, gamma, dout, eps) -> bool:
    """Whether the answer's dx is the right formula with eps left out (to float64 rounding)."""
    if not isinstance(got, tuple | list) or not got or not isinstance(got[0], torch.Tensor) or got[0].shape != x.shape:
        return False
    return torch.allclose(got[0].detach().double(), _bn_by_paths(x, gamma, dout, 0.0), rtol=1e-10, atol=1e-12)


@exercise("04.6", "batch norm fused: dx in one expression")
def _bn_fused(batch_norm_backward) -> Outcome:
    """``batch_norm_backward(x, gamma, dout, eps) -> (dx, dgamma, dbeta)`` for batch norm in training mode
    on ``x`` of shape (N, C) (the batch's mean and biased variance, per column; the same argument order
    as ``hooklab.backprop.batch_norm_backward``), compared with the chain of the seven steps; tried with
    N = 6 and N = 3, then with a large eps (0.5); an answer that ignores eps is named in any case."""
    worst, worst_name, names = 0.0, "", ["dx", "dgamma", "dbeta"]
    for (n, c), seed, eps in (((6, 4), 51, EPS), ((3, 5), 55, EPS), ((5, 3), 57, 0.5)):
        _, x, gamma, dout, grads = _bn_case(n, c, seed, eps)
        expected = (grads["x"], grads["gamma"], grads["beta"])
        got, failed = by_hand(batch_norm_backward, ["x", "gamma", "dout", "eps"], x, gamma, dout, eps)
        compared = failed or compare(got, expected, names, _bn_traps(x, gamma, dout, eps))
        if isinstance(compared, Outcome) and _ignores_eps(got, x, gamma, dout, eps):
            compared = Outcome(False, f"dx: your dx is batch norm's with eps = 0: inv_std = (v + eps)^(−1/2), and the "
                                      f"check passes eps = {eps}; use it")
        if isinstance(compared, Outcome) and re.search(r"^d(gamma|beta): shape \(1, \d+\)", compared.detail):
            compared = Outcome(False, f"{compared.detail}: a gradient has its parameter's shape, and gamma and beta "
                                      "are (C,): sum over the rows without keepdim=True")
        if isinstance(compared, Outcome):
            shown = f"x of shape {(n, c)}" + (f" and eps = {eps}" if eps != EPS else "")
            return Outcome(False, f"with {shown}: {compared.detail}")
        if compared[0] >= worst:
            worst, worst_name = compared
    return verdict(names, worst, worst_name, verb="equal the chain of the seven steps, as computed by",
                   prefix="with x of shapes (6, 4) and (3, 5), and eps = 0.5 on (5, 3): ")


# ----- convolution and pooling (04.d, 04.8, 04.9) -----------------------------------------------------
@prediction(
    "04.d", "how many output positions use each pixel of a 4×4 image (3×3 kernel, padding 1)",
    why="a pixel is in one patch for each kernel position that covers it: 9 in the middle, 6 on an edge, 4 in a "
        "corner (there the rest of the window falls on the padding). fold adds every patch's gradient back onto "
        "its pixels, so a pixel's dx is a sum of that many terms.",
    wrong=[([[9.0] * 4] * 4, "only the pixels away from the border are in 9 patches: at the border part of the 3×3 "
                             "window falls on the padding"),
           ([[1.0] * 4] * 4, "the patches overlap: with a 3×3 kernel and stride 1 each pixel is in several")],
)  # fmt: skip
def _coverage() -> list[list[float]]:
    ones = torch.ones(1, 1, 4, 4)
    return F.fold(F.unfold(ones, 3, padding=1), (4, 4), 3, padding=1)[0, 0].tolist()


@exercise("04.8", "conv2d backward, stride 1, with padding")
def _conv(conv2d_backward) -> Outcome:
    """``conv2d_backward(x, w, dout, padding) -> (dx, dw)`` for ``y = F.conv2d(x, w, padding=padding)``
    (stride 1, no bias, any kernel size); tried with padding 0 on a 6×5 input with a 3×2 kernel, then
    padding 1 with 3×3. A failure names the case's shapes, and an error in the answer becomes a failure
    that names them too."""
    cases, shapes = [], {}
    for (shape, kernel, padding), seed in ((((2, 3, 6, 5), (4, 3, 3, 2), 0), 9), (((2, 2, 5, 5), (3, 2, 3, 3), 1), 12)):
        x, w = rand(*shape, seed=seed), rand(*kernel, seed=seed + 1)
        out = F.conv2d(x, w, padding=padding)
        dout = rand(*out.shape, seed=seed + 2)
        shapes[f"with padding={padding}:"] = (f"x of shape {shape}, w of shape {kernel}: a {kernel[2]}×{kernel[3]} "
                                             "kernel, and any size must work")
        per_image = [reference(partial(F.conv2d, padding=padding), (x[i:i + 1], w), dout[i:i + 1])[1]
                     for i in range(len(x))]
        dw = reference(partial(F.conv2d, padding=padding), (x, w), dout)[1]
        traps = [((per_image[0],), NOT_SUMMED_OVER_N), ((per_image[-1],), NOT_SUMMED_OVER_N),
                 ((dw.flip(-2, -1),), "your dw is the right one flipped: F.conv2d slides w over x unflipped (a "
                                      "cross-correlation), so dw needs no flip"),
                 ((F.conv_transpose2d(dout, w.flip(-2, -1), padding=padding),),
                  "your dx is F.conv_transpose2d with the kernel flipped. conv_transpose2d is conv2d's backward: it "
                  "already flips the kernel, so pass w as it is")]
        cases.append((f"padding={padding}", partial(F.conv2d, padding=padding), {"x": x, "w": w},
                      {"x": x, "w": w, "dout": dout, "padding": padding}, dout, traps))
    try:
        outcome = check_cases(conv2d_backward, cases, "with padding 0 and 1: ")
    except NotImplementedError:
        raise  # the stub: "not solved yet"
    except RuntimeError as error:  # e.g. a kernel size written in as 3×3
        return Outcome(False, f"your code raised RuntimeError: {str(error).splitlines()[0]}. The first case is x of "
                              "shape (2, 3, 6, 5) with w of shape (4, 3, 3, 2), a 3×2 kernel, padding 0: take the "
                              "kernel size from w.shape, it can be any")
    if not outcome.passed and "convolution_backward" in outcome.detail:  # torch.nn.grad.conv2d_input / _weight
        return Outcome(False, f"{outcome.detail}: torch.nn.grad's conv2d_input and conv2d_weight are autograd's own "
                              "backward. F.conv_transpose2d is allowed for dx: that a transposed convolution carries "
                              "the gradient back is the insight")
    if not outcome.passed and "shape (2, 2, 7, 7), expected (2, 2, 5, 5)" in outcome.detail:
        return Outcome(False, f"{outcome.detail} (dx has the shape of the padded input: cut the padding off, or "
                              "fold back with the same padding=..., which drops it)")
    if not outcome.passed and re.search(r"dw: shape \(2, \d+, \d+, \d+, \d+\), expected", outcome.detail):
        return Outcome(False, f"{outcome.detail} (one dw per image: {NOT_SUMMED_OVER_N})")
    case = next((shown for label, shown in shapes.items() if outcome.detail.startswith(label)), None)
    if not outcome.passed and case and "shape (" in outcome.detail:  # only a shape slip can be the kernel's
        return Outcome(False, f"{outcome.detail} [the case: {case}]")
    return outcome


NOT_SUMMED_OVER_N = ("the same kernel w slides over every image of the batch, so dw sums the contributions of all "
                     "N images: sum over the images' axis")


@exercise("04.9", "max pooling backward, 2×2 windows")
def _max_pool(max_pool_backward) -> Outcome:
    """``max_pool_backward(x, dout) -> dx`` for ``y = F.max_pool2d(x, 2)`` (2×2 windows, stride 2).
    Tried on x of shape (2, 3, 4, 4), then (1, 2, 6, 8), without ties, then on (1, 2, 4, 4) with tied
    windows, as batch norm makes them on the digits' blank background: there PyTorch gives the whole
    gradient to the first maximum in row-major order (measured on CPU with torch 2.14.1, and asserted
    here). max_unpool2d and max_pool2d's indices are refused: they hand over the routing."""
    cases = []
    for shape, seed in (((2, 3, 4, 4), 91), ((1, 2, 6, 8), 93), ((1, 2, 4, 4), 95)):
        x = rand(*shape, seed=seed)
        if seed == 95:  # tied windows: all four equal, the two on the anti-diagonal, the bottom row
            x[0, 0, :2, :2], x[0, 1, :2, :2] = 0.0963, torch.tensor([[0.0, 2.0], [2.0, 1.0]], dtype=D)
            x[0, 1, 2:, 2:] = torch.tensor([[0.5, 1.0], [3.0, 3.0]], dtype=D)
        dout = rand(shape[0], shape[1], shape[2] // 2, shape[3] // 2, seed=seed + 1)
        spread = dout.repeat_interleave(2, -2).repeat_interleave(2, -1)
        at_max = x == F.max_pool2d(x, 2).repeat_interleave(2, -2).repeat_interleave(2, -1)
        traps = [((spread / 4,), "that spreads each window's gradient evenly, as average pooling does: max pooling "
                                 "sends all of it to the window's largest input, and 0 to the other three"),
                 ((spread,), "every input of a window got the window's whole gradient: only its largest input "
                             "should, the other three get 0")]
        if seed == 95:
            assert reference(partial(F.max_pool2d, kernel_size=2), (x,), dout)[0][0, 0, 0, 0] == dout[0, 0, 0, 0]
            last = _last_max_takes_it(x, dout)
            traps += [((spread * at_max,), MASK), ((spread * at_max / at_max.double().reshape(
                *shape[:2], shape[2] // 2, 2, shape[3] // 2, 2).sum((3, 5)).repeat_interleave(2, -2)
                .repeat_interleave(2, -1),), TIES), ((last,), TIES)]
        label = f"x of shape {shape}" + (", with tied maxima" if seed == 95 else "")
        cases.append((label, partial(F.max_pool2d, kernel_size=2), {"x": x}, {"x": x, "dout": dout}, dout, traps))
    routing = _PyTorchRouting()
    with routing:
        outcome = check_cases(max_pool_backward, cases, "with x of shapes (2, 3, 4, 4) and (1, 2, 6, 8), and tied "
                                                        "windows: ")
    if routing.found and "write the formula yourself" not in outcome.detail:  # the course's formula named first
        return Outcome(False, f"your answer called {routing.found}: PyTorch's own routing, which picks each "
                              "window's maximum for you. 04.9 asks you to write that routing: find each window's "
                              "maximum yourself (e.g. unfold the windows and take argmax), then send dout there")
    return outcome


class _PyTorchRouting(TorchFunctionMode):
    """Notes a call that hands over max pooling's routing: max_unpool2d, or max_pool2d's indices."""

    def __init__(self):
        super().__init__()
        self.found: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name, kwargs = getattr(func, "__name__", ""), kwargs or {}
        if "max_unpool" in name:  # named before the indices it needs
            self.found = "max_unpool2d"
        elif self.found is None and ("with_indices" in name or kwargs.get("return_indices")):
            self.found = "max_pool2d with return_indices=True"
        return func(*args, **kwargs)


TIES = ("a window with tied maxima (batch norm maps the digits' blank background to one value per channel, so such "
        "windows are common in the CNN): splitting the gradient, or giving it to the last maximum, is a fair choice "
        "on paper, but 04.11 compares with autograd at every step, and PyTorch's max_pool2d gives the whole gradient "
        "to the first maximum in row-major order (measured on CPU with torch 2.14.1; the documentation does not "
        "say). argmax over the window's four values, flattened, picks it")


MASK = ("a window with tied maxima got its whole gradient at every tied maximum: a mask x == the window's maximum "
        "marks all of them, so that window passes back its gradient two or more times. Only one input may take it: "
        "PyTorch's max_pool2d gives it to the first maximum in row-major order (measured on CPU with torch 2.14.1). "
        "argmax over the window's four values, flattened, picks it")


def _last_max_takes_it(x, dout):
    """dx when each window's last maximum (in row-major order) takes the gradient."""
    n, c, h, w = x.shape
    windows = x.reshape(n, c, h // 2, 2, w // 2, 2).permute(0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
    last = 3 - windows.flip(-1).argmax(-1)
    dx = torch.zeros_like(windows).scatter(-1, last[..., None], dout[..., None])
    return dx.reshape(n, c, h // 2, w // 2, 2, 2).permute(0, 1, 2, 4, 3, 5).reshape(x.shape)


# ----- the capstone: one epoch on the digits (04.11) ----------------------------------------------
LR, BATCH, ACCURACY_TOLERANCE = 0.1, 32, 0.02


def digits_cnn() -> nn.Sequential:
    """The network of notebook 04: conv → batch norm → ReLU → max-pool, twice, then a Linear."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(128, 10))


CALL_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


class DigitsCNN(nn.Sequential):
    """The lesson's CNN as the checks of 04.10 and 04.11 run it: each call of its forward notes how many of
    its layers have a hook on them then. An answer that runs the layers itself, in a loop, never calls it."""

    def forward(self, x):
        self.__dict__.setdefault("hooked", []).append(
            sum(any(getattr(m, kind, None) for kind in CALL_HOOKS) for m in self.children()))
        return self.run(x)

    def run(self, x):
        return super().forward(x)


class DigitsSkipCNN(DigitsCNN):
    """The lesson's CNN with a skip connection: pool '3''s output, its 16 channels twice, is added to batch
    norm '5''s. Its forward is not a chain of its layers: a loop over them runs another network."""

    def run(self, x):
        a = self[3](self[2](self[1](self[0](x))))
        h = self[5](self[4](a)) + a.repeat(1, 2, 1, 1)
        for layer in list(self)[6:]:
            h = layer(h)
        return h


def watched(model: nn.Sequential, kind=DigitsCNN) -> DigitsCNN:
    """``model`` (the lesson's CNN), its forward now noting the hooks on its layers at each call."""
    model.__class__ = kind
    model.hooked = []
    return model


NEEDS_HOOKS = ("it only works while forward is a chain of the model's layers, run in the order they were "
               "added: a skip connection, a layer used twice or any other code in forward escapes a loop over "
               "them. A hook on each layer catches what model(x) really gives it, whatever forward does")


def _steps_taken(model: DigitsCNN) -> int:
    """How many training-mode forward passes batch norm '1' has made: it moves when the layers run."""
    return int(model[1].num_batches_tracked)


def _unhooked(model: DigitsCNN, steps_before: int) -> str | None:
    """Why an answer that recorded without hooks is refused, or None when model(x) ran with hooks on, or
    when the layers never ran (an answer that computes nothing gets its own message)."""
    if not model.hooked and _steps_taken(model) > steps_before:
        return f"your answer registered no hook and never called model(x): it ran the layers itself, and {NEEDS_HOOKS}"
    if model.hooked and not any(model.hooked):
        return (f"your answer registered no hook while model(x) ran: what it recorded came from running the "
                f"layers itself, and {NEEDS_HOOKS}")
    return None


@contextlib.contextmanager
def _training_on_purpose():
    """No TrainModeWarning from a recording inside: the checkers' models are in train mode on purpose
    (batch norm normalises with the batch's statistics, and its running statistics may move)."""
    from hooklab.recording import TrainModeWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainModeWarning)
        yield


def _layer_label(model, name: str) -> str:
    return f"layer {name} ({type(model.get_submodule(name)).__name__})"


def _ratio(got, expected) -> float:
    return float((got * expected).sum() / (expected * expected).sum())


def _bessel_scaled(model, name: str, got, expected) -> bool:
    """A batch norm weight's gradient scaled by √((N − 1)/N), just under 1: the N − 1 variance."""
    layer = model.get_submodule(name.rpartition(".")[0])
    if not isinstance(layer, nn.BatchNorm2d) or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    r = _ratio(got, expected)
    return 0.99 < r < 0.99999 and torch.allclose(got, r * expected, rtol=1e-3, atol=1e-8)


EPS_LEFT_OUT = ("(a small difference, at batch norm: did you pass batch norm's eps, layer.eps (1e-5 here), to "
                "04.6's batch_norm_backward? With eps=0 it divides by √var instead of √(var + eps), and every "
                "entry moves a little. If you did, part of your computation ran in float32: convert it to the "
                "inputs' dtype)")


def _near_batch_norm(model, layer: str, last_right: str | None) -> bool:
    """Whether the first wrong gradient is a batch norm's, or the one just below what a batch norm passes back."""
    names = [layer] + ([last_right.rpartition(".")[0]] if last_right else [])
    return any(isinstance(model.get_submodule(name), nn.BatchNorm2d) for name in names)


def _judge_step(got, expected: dict[str, torch.Tensor], model) -> Outcome | float:
    """The answer's parameter gradients in chain order from the loss: the first wrong one named, with
    the layers between it and the last right one (where the slip must be)."""
    if not isinstance(got, dict):
        return Outcome(False, f"return a dict {{parameter name: gradient}} with one entry per name of "
                              f"model.named_parameters() ({', '.join(expected)}), not {type(got).__name__}")
    layers = [name for name, _ in model.named_children()]
    worst, last_right = 0.0, None
    for name in reversed(expected):
        layer = name.rpartition(".")[0]
        what = f"{name} ({type(model.get_submodule(layer)).__name__} {name.rpartition('.')[2]})"
        if name not in got:
            return Outcome(False, f"no gradient for {what}: return one entry per name of model.named_parameters() "
                                  f"({', '.join(expected)})")
        result = one(what, got[name], expected[name])
        if isinstance(result, Outcome) and _bessel_scaled(model, name, got[name], expected[name]):
            return Outcome(False, f"first wrong: {what}, every entry {_ratio(got[name], expected[name]):.4f} × the "
                                  "right value: x.var(0) divides by N − 1 (Bessel's correction); batch norm's "
                                  "v = mean((x − μ)²) divides by N (here N·H·W values per channel): use "
                                  "x.var(0, unbiased=False)")
        if isinstance(result, Outcome) and "float32 rounding" in result.detail and _near_batch_norm(
                model, layer, last_right):  # batch norm's eps left out: a small difference, like float32's
            result = Outcome(False, re.sub(r"\(off by about float32 rounding[^)]*\)", EPS_LEFT_OUT, result.detail))
        if isinstance(result, Outcome):
            if "the inputs are float64" in result.detail:
                return Outcome(False, f"first wrong: {result.detail}")
            if last_right is None:
                return Outcome(False, f"first wrong: {result.detail}. The slip is in the loss's gradient or in the "
                                      f"backward of {_layer_label(model, layer)}")
            done = last_right.rpartition(".")[0]
            where = f"in the backward of {_layer_label(model, layer)}"
            if done != layer:
                between = layers[layers.index(layer):layers.index(done)]
                where = (f"in what {_layer_label(model, done)} passes back to its input, or in the backward of "
                         f"{', '.join(_layer_label(model, n) for n in reversed(between))}")
            return Outcome(False, f"every gradient from the loss back to {last_right} right; first wrong: "
                                  f"{result.detail}. The slip is {where}")
        last_right = name
        worst = max(worst, result)
    return worst


def _accuracy(model, x, y) -> float:
    with torch.no_grad():
        return (model.eval()(x).argmax(1) == y).double().mean().item()


@exercise("04.11", "one epoch on the digits with your own backward pass", time_limit=300)
def _capstone(model_backward) -> Outcome:
    """``model_backward(model, x, y) -> {parameter name: gradient}`` for
    ``F.cross_entropy(model(x), y)`` on the lesson's CNN, whose parameters do not require grad. The
    check trains it for one epoch of plain SGD (lr 0.1, batches of 32, float64) with your gradients,
    compares them at every step with autograd's on a copy of the model, and trains a second copy
    with autograd alone: the two test accuracies must agree within 0.02. The records must come from hooks
    while ``model(x)`` runs, not from a loop calling the layers itself."""
    from ..audit import leftover_hooks
    from ..data import digits

    data = digits()
    images, test_images = data.x_train.double(), data.x_test.double()
    mine, theirs = watched(digits_cnn()).double(), digits_cnn().double()
    mine.requires_grad_(False)
    names = [name for name, _ in mine.named_parameters()]
    order = torch.randperm(len(data.y_train), generator=torch.Generator().manual_seed(0))
    worst, steps = 0.0, 0
    for steps, idx in enumerate(order.split(BATCH), start=1):
        x, y = images[idx], data.y_train[idx]
        twin = copy.deepcopy(mine).requires_grad_(True)  # its forward moves only its own running statistics
        expected = dict(zip(names, torch.autograd.grad(F.cross_entropy(twin(x), y), list(twin.parameters())),
                            strict=True))
        steps_before = _steps_taken(mine)
        try:
            with _training_on_purpose():
                got, failed = by_hand(model_backward, ["model", "x", "y"], mine, x, y)
        except TypeError as error:
            if "tuple" not in str(error):
                raise
            return Outcome(False, f"your code raised TypeError: {error}. A Conv2d's layer.padding is a pair, (1, 1), "
                                  "and 04.8's conv2d_backward takes one int: pass layer.padding[0]")
        unhooked = None if failed or steps > 1 else _unhooked(mine, steps_before)
        if unhooked:
            return Outcome(False, f"at step 1: {unhooked}")
        left = [] if failed else leftover_hooks(mine)
        if left:
            return Outcome(False, f"at step {steps}: a hook is still registered after your function returned "
                                  f"({left[0]}); each call adds another, and the records pile up. Register them "
                                  "inside `with hooklab.Hooks() as handles:`, with handles.add(...)")
        named = {key.rpartition(".")[0] for key in got} if isinstance(got, dict) and not failed else set()
        if len(named) == 1 and len(got) < len(expected):
            return Outcome(False, f"at step {steps}: every gradient you returned is named after layer "
                                  f"'{named.pop()}', the last one: did each hook keep its own layer's name? A "
                                  "lambda made in a loop sees the loop's last name unless you bind it, name=name")
        result = failed or _judge_step(got, expected, mine)
        if isinstance(result, Outcome):
            return Outcome(False, f"at step {steps}: {result.detail}")
        worst = max(worst, result)
        with torch.no_grad():
            for name, p in mine.named_parameters():
                p -= LR * got[name]
        loss = F.cross_entropy(theirs(x), y)
        with torch.no_grad():
            for p, g in zip(theirs.parameters(), torch.autograd.grad(loss, list(theirs.parameters())), strict=True):
                p -= LR * g
    yours, autograd = _accuracy(mine, test_images, data.y_test), _accuracy(theirs, test_images, data.y_test)
    bound = f"< {SHOWN_AS_BOUND:.0e}" if worst < SHOWN_AS_BOUND else f"{worst:.1e}"
    if abs(yours - autograd) > ACCURACY_TOLERANCE:
        return Outcome(False, f"every step's gradients matched autograd's (max |difference| {bound}), but the test "
                              f"accuracy is {yours:.2f} with yours and {autograd:.2f} with autograd's: does your "
                              "function run the model forward more than once? Each forward pass in training mode "
                              "moves batch norm's running statistics")
    return Outcome(True, f"{steps} steps, and at every one your gradients match autograd's (max |difference| "
                         f"{bound}); test accuracy after one epoch {yours:.2f} with yours, {autograd:.2f} with "
                         f"autograd's")



# ----- the payoff: find the slip with hooks (04.e, 04.10) -----------------------------------------------------
def batch_norm_with_a_slip(bn, x, out, dout):
    """Batch norm's backward formula, as the problem's backward writes it."""
    inv_std = (x.var((0, 2, 3), unbiased=False, keepdim=True) + bn.eps) ** -0.5
    x_hat = (x - x.mean((0, 2, 3), keepdim=True)) * inv_std
    dx = dout * bn.weight[:, None, None] * inv_std
    return dx, {"weight": (dout * x_hat).sum((0, 2, 3)), "bias": dout.sum((0, 2, 3))}


# What the lesson prints once 04.e is answered; not in the docstring, which help() would show before.
batch_norm_with_a_slip.slip = ("it treats the batch mean and variance as constants. So dx keeps only the direct path, "
                    "dout·γ·inv_std, and drops the paths through the mean and the variance. The weight's and "
                    "bias's gradients are right.")


def _passes_everything(relu, x, out, dout):
    """A ReLU's backward with one slip: the gradient passed everywhere, as if the ReLU were the identity."""
    return dout, {}


def _bias_by_the_mean(linear, x, out, dout):
    """A Linear's backward with one slip, in a parameter's gradient only: the bias's averaged over the
    rows instead of summed."""
    from hooklab.backprop import BACKWARD

    dx, params = BACKWARD[nn.Linear](linear, x, out, dout)
    return dx, {**params, "bias": dout.mean(0)}


def formulas_with_a_slip() -> dict:
    """The problem's backward formulas: one per layer type, ``(layer, input, output, dout) -> (dx,
    {parameter name: gradient})`` as in ``hooklab.backprop.BACKWARD``, and one of them slips."""
    from hooklab.backprop import BACKWARD

    return {**BACKWARD, nn.BatchNorm2d: batch_norm_with_a_slip}


def hand_backward(formulas):
    """``backward(model, x, y) -> {parameter name: gradient}`` for ``F.cross_entropy(model(x), y)``: one
    forward pass recorded by forward hooks, then each layer's formula from ``formulas``, last layer first."""
    from hooklab.backprop.losses import softmax_cross_entropy_backward
    from hooklab.hooks import Hooks

    @torch.no_grad()  # formulas only: no graph is needed
    def backward(model, x, y):
        records = []  # (name, layer, input, output), one per call
        with Hooks() as handles:
            for name, layer in model.named_children():
                handles.add(layer.register_forward_hook(
                    lambda layer, args, out, name=name: records.append((name, layer, args[0], out))))
            logits = model(x)
        d, grads = softmax_cross_entropy_backward(logits, y), {}
        for name, layer, inp, out in reversed(records):
            d, params = formulas[type(layer)](layer, inp, out, d)
            grads.update({f"{name}.{k}": g for k, g in params.items() if g is not None})
        return grads
    return backward


def _close(a, b) -> bool:
    """allclose in float64; in float32 within a relative tolerance (the lesson's rtol 1e-3) and an
    absolute one scaled to the tensor's size, since float32 rounding leaves ~1e-7 on entries near 0."""
    if b.dtype == torch.float64:
        return torch.allclose(a, b)
    return torch.allclose(a, b, rtol=1e-3, atol=1e-3 * b.abs().max().item())


def _verdicts(model, x, y, formulas, chained=False, close=_close) -> dict[str, tuple[bool, bool]]:
    """For each child in forward order: (its formula's dx disagrees with its grad_input, its formula's
    parameter gradients disagree with .grad), each formula run on what that layer recorded; or
    (``chained``) on the dx the formula of the layer after it passed on, the slip 04.10 names."""
    from hooklab.recording import record

    with _training_on_purpose(), record(model, backward=True) as rec, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Full backward hook is firing")  # layer '0' gets the images
        F.cross_entropy(model(x), y).backward()
    verdicts, passed_on = {}, rec.records[-1].grad_output[0]
    for r in reversed(rec.records):
        layer = model.get_submodule(r.name)
        with torch.no_grad():
            dx, params = formulas[type(layer)](layer, r.inputs[0], r.output, passed_on if chained else r.grad_output[0])
        dx_wrong = r.grad_input[0] is not None and not close(dx, r.grad_input[0])
        verdicts[r.name] = (dx_wrong, any(g is not None and not close(g, getattr(layer, k).grad)
                                          for k, g in params.items()))
        passed_on = dx
    model.zero_grad()
    return dict(reversed(verdicts.items()))


def _disagreeing(verdicts, params_only=False, dx_only=False) -> set[str]:
    return {name for name, (dx_wrong, params_wrong) in verdicts.items()
            if (params_wrong and not dx_only) or (dx_wrong and not params_only)}


LOOSE = ((1e-5, 1e-3), (1e-5, 1e-2), (1e-3, 1e-3), (1e-2, 1e-8), (5e-2, 1e-8), (1e-1, 1e-8))  # (rtol, atol)


def _dx_slip(model, x, y, formulas, name) -> tuple[float, float]:
    """How far layer ``name``'s formula's dx is from its recorded grad_input: (max |difference|, relative)."""
    from hooklab.recording import record

    with _training_on_purpose(), record(model, backward=True) as rec:
        F.cross_entropy(model(x), y).backward()
    model.zero_grad()
    r = next(r for r in rec.records if r.name == name)
    with torch.no_grad():
        dx, _ = formulas[type(model.get_submodule(name))](model.get_submodule(name), r.inputs[0], r.output,
                                                          r.grad_output[0])
    diff = dx - r.grad_input[0]
    return diff.abs().max().item(), (diff.norm() / r.grad_input[0].norm()).item()


def _too_loose(model, x, y, formulas, names) -> bool:
    """Whether ``names`` is what a comparison with a tolerance too loose for the slip gives."""
    def loose(rtol, atol):
        return lambda a, b: torch.allclose(a, b, rtol=rtol, atol=atol)

    return any(names == _disagreeing(_verdicts(model, x, y, formulas, close=loose(rtol, atol)))
               for rtol, atol in LOOSE)


def _wrapped(formulas) -> dict:
    """The same formulas, each a new function object: right, but not the table's functions."""
    def wrap(formula):
        return lambda layer, x, out, dout: formula(layer, x, out, dout)
    return {kind: wrap(formula) for kind, formula in formulas.items()}


SKIP = "the CNN with a skip connection (pool '3''s output added to batch norm '5''s)"


def _slipped_cases():
    """(what the case is, a CNN in training mode, the formulas under test, the layers the answer must name)."""
    from hooklab.backprop import BACKWARD

    slipped = formulas_with_a_slip()
    cases = []
    for label, formulas, expected in (
            ("formulas whose Linear bias gradient is a mean over the rows, not a sum",
             {**BACKWARD, nn.Linear: _bias_by_the_mean}, {"9"}),
            ("the problem's formulas", slipped, {"1", "5"}),
            ("formulas whose ReLU passes every gradient", {**BACKWARD, nn.ReLU: _passes_everything}, {"2", "6"}),
            ("hooklab.backprop's formulas (no slip)", BACKWARD, set()),
            ("hooklab.backprop's formulas, each wrapped in a new function (no slip)", _wrapped(BACKWARD), set()),
            ("the problem's formulas, in float32 as the lesson runs them", slipped, {"1", "5"}),
            ("hooklab.backprop's formulas, in float32 as the lesson runs them", BACKWARD, set()),
            (f"formulas whose ReLU passes every gradient, on {SKIP}", {**BACKWARD, nn.ReLU: _passes_everything},
             {"2", "6"})):
        model = watched(digits_cnn(), DigitsSkipCNN if SKIP in label else DigitsCNN)
        cases.append((label, model if "float32" in label else model.double(), formulas, expected))
    return cases


REUSED = "a model whose forward calls the same Linear '0' and Tanh '1' twice, Sequential(fc, tanh, fc, tanh)"


def _reused_cases():
    """(what the case is, a model that reuses its two children, the formulas, the layers the answer must name):
    each hook fires once per call, so an answer keeping one record per layer pairs the last call's input with
    the first call's gradient (backward meets the calls in reverse) and blames right formulas."""
    from hooklab.backprop import BACKWARD

    cases = []
    for label, formulas, expected in (("hooklab.backprop's formulas (no slip)", BACKWARD, set()),
                                      ("formulas whose Linear bias gradient is a mean over the rows, not a sum",
                                       {**BACKWARD, nn.Linear: _bias_by_the_mean}, {"0"})):
        torch.manual_seed(0)
        fc, act = nn.Linear(6, 6), nn.Tanh()
        cases.append((f"{label}, on {REUSED}", nn.Sequential(fc, act, fc, act).double(), formulas, expected))
    return cases, torch.randn(8, 6, dtype=D), torch.arange(8) % 6


ONE_RECORD_PER_CALL = ("A module called twice fires each hook twice, once per call. Kept in one slot per layer, the "
                       "record pairs the last call's input with the first call's gradient (backward meets the calls "
                       "in reverse), and right formulas disagree. Keep one record per call (a list per layer), judge "
                       "each call's dx on its own record, and compare each parameter's gradient, summed over the "
                       "calls, with its .grad")


IN_FORWARD_ORDER = ("A module called twice fires each hook twice, and you kept one record per call, but backward "
                    "meets the calls in reverse order: its first backward belongs to the last call. You paired each "
                    "call's input with another call's gradient, so right formulas disagree. Fill the records from "
                    "the end (the first backward goes with the last forward), judge each call's dx on its own "
                    "record, and compare each parameter's gradient, summed over the calls, with its .grad")


EACH_CALL_ALONE = ("Each call's dx is judged right on its own record; but each call's parameter gradient is only "
                   "that call's share, and .grad adds up the shares of every call. Sum each parameter's gradient "
                   "over the calls first, then compare that sum with its .grad")


def _pairs_in_forward_order(disagreeing_layers, model, x, y, formulas) -> bool:
    """Whether the answer runs the formula of the reused Linear '0' once per call, each time with the input of one
    call and the gradient of another: a record per call, its backwards paired in forward order."""
    from hooklab.hooks import Hooks

    inputs, grads = [], []
    fc = model[0]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Full backward hook is firing")
        try:
            with Hooks() as hooks:
                hooks.add(fc.register_forward_hook(lambda m, args, out: inputs.append(args[0].detach())))
                hooks.add(fc.register_full_backward_hook(lambda m, gi, go: grads.insert(0, go[0].detach())))
                F.cross_entropy(model(x), y).backward()
        finally:
            model.zero_grad()
    seen = []

    def logged(formula):
        def run(layer, a, out, dout):
            if layer is fc:
                seen.append((a, dout))
            return formula(layer, a, out, dout)
        return run

    try:
        disagreeing_layers(model, x, y, {kind: logged(formula) for kind, formula in formulas.items()})
    except Exception:  # the answer's own error is reported elsewhere
        return False
    finally:
        model.zero_grad()

    def index(t, among):
        return next((i for i, u in enumerate(among) if torch.is_tensor(t) and t.shape == u.shape and torch.equal(t, u)),
                    None)
    pairs = [(index(a, inputs), index(d, grads)) for a, d in seen]
    return (len(pairs) == len(inputs) and None not in {i for pair in pairs for i in pair}
            and any(i != j for i, j in pairs))


def _hook_left(label: str, model: nn.Module) -> Outcome | None:
    """04.10's verdict when a hook is still registered on ``model`` after the student's function returned."""
    from ..audit import leftover_hooks

    left = leftover_hooks(model)
    if not left:
        return None
    return Outcome(False, f"with {label}: a hook is still registered after your function returned ({left[0]}): add "
                          "every handle with handles.add(...) inside `with hooklab.Hooks() as handles:`")


def _judge_reused(disagreeing_layers) -> Outcome | None:
    """The reused-module cases, after the lesson's CNN: None when the answer names the right layers."""
    cases, x, y = _reused_cases()
    for label, model, formulas, expected in cases:
        try:
            got = disagreeing_layers(model, x, y, formulas)
        except RuntimeError as error:  # a one-slot record: a shape or a missing record
            return Outcome(False, f"with {label}: your code raised RuntimeError: {error}. {ONE_RECORD_PER_CALL}")
        finally:
            model.zero_grad()
        if left := _hook_left(label, model):
            return left
        names = _names(got)
        if names != expected and _pairs_in_forward_order(disagreeing_layers, model, x, y, formulas):
            return Outcome(False, f"with {label}: you named {sorted(names) if names is not None else got!r:.60}. "
                                  f"{IN_FORWARD_ORDER}")
        with_parameters = {name for name, child in model.named_children() if any(True for _ in child.parameters())}
        if not expected and names == with_parameters:
            return Outcome(False, f"with {label}: you named {sorted(names)}, the layer with parameters. "
                                  f"{EACH_CALL_ALONE}")
        if names != expected:
            truth = f"the layers whose formula disagrees are {sorted(expected)}" if expected else "no formula disagrees"
            return Outcome(False, f"with {label}: you named {sorted(names) if names is not None else got!r:.60}, "
                                  f"but {truth} here. {ONE_RECORD_PER_CALL}")
    return None


def _names(got):
    """The answer as a set of layer names, or None when it is not a collection of names."""
    if got is None:
        return set()
    if isinstance(got, str | nn.Module) or not isinstance(got, set | frozenset | list | tuple | dict):
        return None
    names = set()
    for item in got:
        if not isinstance(item, str):
            return None
        names.add(item.strip().strip("'\""))
    return names


def _int_names(got) -> str | None:
    """The hint for an answer naming layers by int ({1, 5}): 04.e's, with the answer's own names as strings."""
    if not isinstance(got, set | frozenset | list | tuple) or isinstance(got, str):
        return None
    ints = [item for item in got if isinstance(item, int) and not isinstance(item, bool)]
    if not ints:
        return None
    as_strings = "{" + ", ".join(repr(str(item)) for item in sorted(ints)) + "}"
    return (f"you returned {sorted(ints)[:4]}, layer names as ints; a layer's name is a string, as "
            f"named_children() gives it: {as_strings}. The lesson looks each name up among "
            "model.named_children(), where an int is never found")


def _layer_names_form(guess) -> str | None:
    """04.e's form: layer names as strings; an int (or anything else) is a slip of form."""
    items = [guess] if isinstance(guess, str) else guess
    if isinstance(items, set | frozenset | list | tuple) and all(isinstance(item, str) for item in items):
        return None
    return ("write layer names as strings, as named_children() gives them, in a set: {'9'}, not {9}; "
            f"you wrote {kind_of(guess)}")


RECORDED = ("conv '4' got a wrong gradient only in the problem's chained backward, where each formula passes its dx "
            "on. Here autograd runs the backward, and conv '4''s hook records the gradient that really reached it; "
            "run on that, the conv formula is right, so conv '4' agrees")


@prediction(
    "04.e", "which layers disagree with what their own hooks recorded, if batch norm's formula is the one that slips",
    why="batch norm's formula serves both batch norms, '1' and '5', and each passes back another dx than the "
        "grad_input its hooks recorded. Conv '4' received a wrong gradient only in the chained backward: judged on "
        "the grad_output its own hook recorded, the conv formula is right. Had the conv formula slipped instead, "
        "the convs '0' and '4' would be named: the run decides between the two suspects.",
    wrong=[(frozenset(["4", "5"]), RECORDED),
           (frozenset(["1", "4", "5"]), RECORDED),
           (frozenset(["0", "1", "4", "5"]), RECORDED + ", and so does conv '0'"),
           (frozenset(["5"]), "'5' is one of them; one formula serves every layer of its type: which other layer "
                              "uses batch norm's?"),
           (frozenset(["1"]), "'1' is one of them; one formula serves every layer of its type: which other layer "
                              "uses batch norm's?"),
           (frozenset(["0", "4"]), "those are the layers the other suspect, the conv formula, would give. The "
                                   "question supposes batch norm's formula slips: which layers use it?"),
           (frozenset(["4"]), "conv '4' is the first wrong row of the table, but the question supposes batch norm's "
                              "formula slips. " + RECORDED),
           (frozenset(["4", "5", "6", "7"]), "ReLU '6' and max pool '7' come before batch norm '5' in backward: "
                                             "their formulas are right, and so is what their hooks recorded. "
                                             + RECORDED),
           (frozenset(["0", "1", "2", "3", "4", "5"]), "that is what a backward chained through the formulas would "
                                                       "blame: each layer the wrong gradient reaches disagrees too. "
                                                       "With the hooks, each layer is judged on the grad_output it "
                                                       "recorded"),
           (set(), "the slip is there: batch norm's formula passes back another input gradient than autograd's, and "
                   "allclose sees it")],
    form=_layer_names_form,
)  # fmt: skip
def _slipped_layers() -> frozenset[str]:
    from ..data import digits

    data = digits()
    _, model, formulas, _ = next(case for case in _slipped_cases() if case[0] == "the problem's formulas")
    return frozenset(_disagreeing(_verdicts(model, data.x_train[:32].double(), data.y_train[:32], formulas)))


LOCAL_NAMES = ("the formulas name each parameter as the layer does, 'weight' or 'bias' (not '5.weight'), and a "
               "convolution without bias gives {'bias': None}: skip the gradients that are None")


@exercise("04.10", "name every layer whose backward formula slipped, with hooks", time_limit=300)
def _disagreeing_layers(disagreeing_layers) -> Outcome:
    """``disagreeing_layers(model, x, y, formulas) -> set of layer names``: with the forward and backward
    of ``F.cross_entropy(model(x), y)`` recorded by hooks, each layer's formula from ``formulas`` (layer
    type -> ``(layer, input, output, dout) -> (dx, {parameter name: gradient})``), run on that layer's
    recorded input, output and ``grad_output``, is compared with the gradients autograd gave it; the
    answer is every layer where they disagree (a list or set; empty, or None, when none does). Asking
    for every layer, not the first, tells apart an answer that passes each formula's dx on to the layer
    before (which also blames every layer the wrong gradient reaches). Tried in float64 on the lesson's
    CNN with a slip in one formula (in a dx, in a parameter's gradient), with none, then in float32 as
    the lesson runs it, with right formulas that are new functions (an identity test fails there), and on
    the CNN with a skip connection in its forward, then on a small model whose forward calls the same
    Linear and Tanh twice (one record per layer, not per call, blames right formulas there). The answer
    must record with hooks while ``model(x)`` runs (a loop calling the layers itself holds only for a
    chain), and its hooks must be gone."""
    from ..data import digits

    data = digits()
    with warnings.catch_warnings():  # layer '0' gets the images: PyTorch warns at every backward through it
        warnings.filterwarnings("ignore", "Full backward hook is firing")
        return _judge_disagreeing(disagreeing_layers, data)


def _judge_disagreeing(disagreeing_layers, data) -> Outcome:
    for label, model, formulas, expected in _slipped_cases():
        float32 = "float32" in label
        x, y = data.x_train[:32] if float32 else data.x_train[:32].double(), data.y_train[:32]
        verdicts = _verdicts(model, x, y, formulas)
        assert _disagreeing(verdicts) == expected, (label, verdicts)  # the slips are where the cases put them
        model.hooked.clear()
        steps_before = _steps_taken(model)
        try:
            with _training_on_purpose():
                got = disagreeing_layers(model, x, y, formulas)
        except TypeError as error:
            if "NoneType" not in str(error):
                raise
            return Outcome(False, f"with {label}: your code raised TypeError: {error}. Layer '0' gets the images, "
                                  "which need no gradient: its grad_input is (None,), so compare only its weight's "
                                  f"gradient there; and {LOCAL_NAMES}")
        except AttributeError as error:
            return Outcome(False, f"with {label}: your code raised AttributeError: {error}. {LOCAL_NAMES[0].upper()}"
                                  f"{LOCAL_NAMES[1:]}")
        finally:
            model.zero_grad()
        if left := _hook_left(label, model):
            return left
        unhooked = _unhooked(model, steps_before)
        if unhooked:
            return Outcome(False, unhooked)
        int_names = _int_names(got)
        if int_names:
            return Outcome(False, int_names)
        names = _names(got)
        if names == expected:
            continue
        if expected and names == _disagreeing(verdicts, dx_only=True) and _sees_a_dx_slip(disagreeing_layers, data):
            return Outcome(False, f"with {label}: you named {sorted(names) if names else 'no layer'}, as a "
                                  "comparison of each layer's grad_input alone does: it skips the parameters' "
                                  "gradients, and here the slip is in one of them, in layer "
                                  f"{', '.join(repr(n) for n in sorted(expected))}. Compare "
                                  "each parameter's gradient from the formula with its .grad too (skip the None ones)")
        right_somewhere = [case[3] for case in _slipped_cases() if case[3]]
        if names in right_somewhere and _fixed_answer(disagreeing_layers, data, names):
            return Outcome(False, f"you named {sorted(names)} whatever the formulas: a fixed answer, not a comparison. "
                                  "Run each layer's formula on what that layer recorded, compare with autograd's "
                                  "gradients, and return the layers where they disagree")
        why = _what_went_wrong(model, x, y, formulas, verdicts, got, names, expected, float32,
                               hide=label.startswith("the problem's formulas"))
        return Outcome(False, f"with {label}: {why}")
    reused = _judge_reused(disagreeing_layers)
    if reused is not None:
        return reused
    return Outcome(True, "a Linear bias gradient's slip found in '9', a ReLU that passes every gradient in '2' and "
                         "'6' (also with a skip connection in forward), the problem's slip, no layer for formulas "
                         "without a slip, even when each is a new function, and each call of a module called twice "
                         "judged on its own record")


def _fixed_answer(disagreeing_layers, data, names) -> bool:
    """Whether the answer (the right one for some formulas) names the same layers for formulas that slip in
    different layers, and for none: a hard-coded answer."""
    x, y = data.x_train[:32].double(), data.y_train[:32]
    for _, model, formulas, _ in [case for case in _slipped_cases() if "float32" not in case[0]][:4]:
        try:
            with _training_on_purpose():
                if _names(disagreeing_layers(model, x, y, formulas)) != names:
                    return False
        except Exception:  # only a probe: the answer's own failure is reported elsewhere
            return False
        finally:
            model.zero_grad()
    return True


def _sees_a_dx_slip(disagreeing_layers, data) -> bool:
    """Whether the answer names the layers of a slip in a dx (a ReLU passing every gradient): then it
    compares grad_input, and an answer that misses a parameter's slip compares nothing else."""
    _, model, formulas, expected = next(case for case in _slipped_cases() if "ReLU" in case[0])
    x, y = data.x_train[:32].double(), data.y_train[:32]
    try:
        with _training_on_purpose():
            return _names(disagreeing_layers(model, x, y, formulas)) == expected
    except Exception:  # only a probe: the answer's own failure is reported elsewhere
        return False
    finally:
        model.zero_grad()


def _what_went_wrong(model, x, y, formulas, verdicts, got, names, expected, float32, hide=False) -> str:
    """Why ``got`` is not ``expected``: the slip of the answer, in the student's words; with ``hide`` (the
    problem's formulas, whose answer is prediction 04.e) no message names a layer the answer left out."""
    layers = list(verdicts)

    def kind(name):
        return type(model.get_submodule(name)).__name__

    def its(names):
        return "its" if len(names) == 1 else "their"

    def shown(names):
        return "{" + ", ".join(repr(n) for n in sorted(names, key=layers.index if names <= set(layers) else str)) + "}"

    if names is None:
        return (f"return a set (or list) of layer names, strings like '5' as in model.named_children(), empty when "
                f"every formula agrees; not {got!r:.60}")
    if names - set(layers):
        return f"you named {shown(names - set(layers))}, which is not a child of the model; name children like '5'"
    extra, missing = names - expected, expected - names
    from hooklab.backprop import BACKWARD

    if names and names == {n for n in layers if formulas[type(model.get_submodule(n))] is not BACKWARD.get(
            type(model.get_submodule(n)))}:
        return (f"you named {shown(names)}: every layer whose formula is another function than hooklab.backprop's. "
                "A formula can be another function and still be right: compare what the formulas compute on the "
                "recorded tensors, not which function they are")
    if expected and names == _disagreeing(_verdicts(model, x, y, formulas, chained=True)):
        return (f"you named {shown(names)}: you passed your formula's dx on instead of what the hooks recorded. Every "
                "layer the wrong gradient reaches then disagrees too. Run each layer's formula on its own "
                "grad_output, kept by its backward hook: each layer is judged on what that layer recorded")
    if expected and names and names == _disagreeing(_verdicts(model, x, y, formulas, chained=True), params_only=True):
        return (f"you named {shown(names)}: layers upstream of the slip, whose gradients are wrong only because a "
                "wrong gradient reached them: judge each layer on the grad_output its own hook recorded, not on the "
                "gradient your formulas passed down")
    if expected and names == _disagreeing(verdicts, params_only=True):
        what = "a layer passes" if hide else f"{shown(missing)} pass"
        return (f"you named {shown(names) if names else 'no layer'}, as a comparison of the parameters' gradients "
                f"alone does; they can't see what {what} back "
                "to its input. Compare each layer's "
                "grad_input with the dx of its formula too")
    if float32 and extra and not missing:
        return (f"you named {shown(extra)} too, but {its(extra)} gradients differ from autograd's only by float32 "
                "rounding (about 1e-7, on entries near 0, where torch.allclose's default atol=1e-8 is too strict). "
                "Compare with a relative tolerance (e.g. rtol=1e-3, the 1e-3 of the problem's comparison) or an atol "
                "scaled to each tensor's size")
    if not expected:
        return (f"you named {shown(names)}, but every formula agrees with autograd's backward here, up to rounding: "
                "compare with torch.allclose, not == (the same mathematics in another order rounds differently), "
                "and return an empty set")
    if not names:
        whose = "a formula" if hide else f"the formula of {shown(expected)}"
        return (f"you named no layer, but {whose} gives another gradient than autograd's: "
                "run each layer's formula from the table you were given, formulas[type(layer)], on what that layer "
                "recorded (its input, output and grad_output), and compare with torch.allclose")
    if any(isinstance(model.get_submodule(n), nn.MaxPool2d) for n in extra):
        return (f"you named {shown(extra)}, a max pooling, but its formula agrees with autograd's. Your comparison "
                f"disagrees with PyTorch's on windows with tied maxima: {TIES}")
    if missing and not extra and _too_loose(model, x, y, formulas, names):
        slips = [(n, *_dx_slip(model, x, y, formulas, n)) for n in sorted(missing, key=layers.index)]
        sizes = "; ".join(f"{'' if hide else repr(n) + ' '}by at most {a:.1e} per entry, {r:.0%} of its size"
                          for n, a, r in slips)
        which = "another layer" if hide else shown(missing)
        return (f"you named {shown(names)}, but the dx of {which} differs from autograd's grad_input too "
                f"({sizes}). Your tolerance is too loose to see it: compare with torch.allclose(a, b, rtol=1e-3, "
                "atol=1e-5), which allows float32 rounding and no more")
    if missing and not extra:
        which = "another layer" if hide else f"{shown(missing)} ({', '.join(kind(n) for n in sorted(missing))})"
        return (f"you named {shown(names)}, but {which} "
                f"{'disagrees' if hide or len(missing) == 1 else 'disagree'} too: check every layer, not only up to "
                "the first disagreement")
    if extra:
        agree = "its formula agrees" if len(extra) == 1 else "their formulas agree"
        return (f"you named {shown(extra)}, but {agree} with autograd's up to rounding: compare with torch.allclose, "
                "not == (the same mathematics in another order rounds differently)"
                + ("" if hide else f"; the layers that disagree are {shown(expected)}"))
    if hide:
        return f"you named {shown(names)}, but these are not the layers whose formula disagrees"
    return f"you named {shown(names)}, but the layers whose formula disagrees are {shown(expected)}"


# ----- worked answers: the lesson goes on with them until the student's own pass -----------------------------
def linear_backward(a, w, dz):
    """04.1: a linear layer ``z = a @ w.T + b`` with a bias of shape (1,) shared by both units."""
    return dz @ w, dz.T @ a, dz.sum().reshape(1)


def keep_grads(steps):
    """04.2: a tensor hook on each step; backward fills the dict by name, in the order it reaches them."""
    grads = {}
    for name, value in steps.items():  # name=name binds each hook to its own name (a closure would see the last)
        value.register_hook(lambda grad, name=name: grads.__setitem__(name, grad))
    return grads


def ce_backward_steps(t, target):
    """04.3: the eight steps of ``ce_steps``, from the loss back."""
    n, d = len(target), {}
    d["logprobs"] = torch.zeros_like(t["logprobs"])
    d["logprobs"][torch.arange(n), target] = -1.0 / n
    d["probs"] = d["logprobs"] / t["probs"]
    d["counts_sum_inv"] = (t["counts"] * d["probs"]).sum(1, keepdim=True)
    d["counts_sum"] = -t["counts_sum"] ** -2 * d["counts_sum_inv"]
    d["counts"] = t["counts_sum_inv"] * d["probs"] + d["counts_sum"]  # used twice: added
    d["norm_logits"] = t["counts"] * d["counts"]
    d["logit_maxes"] = -d["norm_logits"].sum(1, keepdim=True)
    at_max = F.one_hot(t["logits"].argmax(1), t["logits"].shape[1]).to(t["logits"].dtype)
    d["logits"] = d["norm_logits"] + at_max * d["logit_maxes"]  # routed to each row's maximum
    return d


def ce_backward(logits, target):
    """04.4: dlogits of the mean cross-entropy in one expression, (softmax − one-hot) / N."""
    d = logits.softmax(1)
    d[torch.arange(len(target)), target] -= 1
    return d / len(target)


def bn_backward_steps(t, gamma, dout):
    """04.5 (and G4.6): the seven steps of ``bn_steps``, from ``y`` back, plus ``gamma`` and ``beta``."""
    n = len(dout)
    d = {"x_hat": dout * gamma, "gamma": (dout * t["x_hat"]).sum(0), "beta": dout.sum(0)}
    d["inv_std"] = (t["diff"] * d["x_hat"]).sum(0, keepdim=True)
    d["var"] = -0.5 * t["inv_std"] ** 3 * d["inv_std"]
    d["diff2"] = d["var"].expand_as(t["diff2"]) / n
    d["diff"] = t["inv_std"] * d["x_hat"] + 2 * t["diff"] * d["diff2"]  # two uses: added
    d["mean"] = -d["diff"].sum(0, keepdim=True)
    d["x"] = d["diff"] + d["mean"] / n  # two uses: added
    return d


def judged_alone(steps, d, dout):
    """04.7: keep_grads on every step first, then a hook on each step of ``d`` that hands on ``d[name]``
    instead of autograd's gradient, so each step meets the gradient your own chain gave it; the handing-on
    hooks are removed when the block ends."""
    from hooklab.hooks import Hooks

    with Hooks() as handles:
        arrived = keep_grads(steps)  # registered first, so they fire first: what arrived, before yours replaces it
        for name in d:
            handles.add(steps[name].register_hook(lambda grad, name=name: d[name]))
        steps["y"].backward(dout)
    return {name: grad for name, grad in arrived.items() if name in d}  # from y back


judged_alone_reference = judged_alone  # the checker's own, under a name the lesson does not shadow


def batch_norm_backward(x, gamma, dout, eps):
    """04.6: batch norm fused, ``(dx, dgamma, dbeta)``: one term per path of ``x``."""
    inv_std = (x.var(0, unbiased=False) + eps) ** -0.5  # the biased variance, as batch norm
    x_hat, g = (x - x.mean(0)) * inv_std, dout * gamma
    return inv_std * (g - g.mean(0) - x_hat * (g * x_hat).mean(0)), (dout * x_hat).sum(0), dout.sum(0)


def conv2d_backward(x, w, dout, padding):
    """04.8: ``(dx, dw)`` of ``F.conv2d(x, w, padding=padding)``, stride 1, no bias: a matrix product on
    ``unfold``'s patches, and ``fold`` adds each patch's gradient back onto its pixels."""
    kernel, d = w.shape[-2:], dout.flatten(2)  # d: (N, out, L)
    cols = F.unfold(x, kernel, padding=padding)  # (N, C·kh·kw, L)
    dw = torch.einsum("nol,nkl->ok", d, cols).reshape(w.shape)
    dcols = torch.einsum("ok,nol->nkl", w.flatten(1), d)
    return F.fold(dcols, x.shape[-2:], kernel, padding=padding), dw


def max_pool_backward(x, dout):
    """04.9: ``dx`` of ``F.max_pool2d(x, 2)``: each window's gradient to its first maximum in row-major order."""
    windows = F.unfold(x.flatten(0, 1)[:, None], 2, stride=2)  # (N·C, 4 values, L windows)
    winner = F.one_hot(windows.argmax(1), 4).transpose(1, 2).to(x.dtype)  # argmax: the first maximum
    dcols = winner * dout.flatten(0, 1).flatten(1)[:, None]
    return F.fold(dcols, x.shape[-2:], 2, stride=2).reshape(x.shape)


def autograd_grads(model, x, y):
    """{parameter name: gradient} of the batch's mean cross-entropy, by autograd."""
    names, params = zip(*model.named_parameters(), strict=True)
    return dict(zip(names, torch.autograd.grad(F.cross_entropy(model(x), y), params), strict=True))


def train_one_epoch(model, backward=autograd_grads, lr=LR):
    """Plain SGD over the training digits once, 32 at a time in a fixed order; returns the test accuracy
    (batch norm then uses its running statistics). ``backward(model, x, y)`` returns {parameter name: gradient}."""
    from ..data import digits

    data = digits()
    order = torch.randperm(len(data.y_train), generator=torch.Generator().manual_seed(0))
    for idx in order.split(BATCH):
        grads = backward(model, data.x_train[idx], data.y_train[idx])
        with torch.no_grad():
            for name, p in model.named_parameters():
                p -= lr * grads[name]
    return _accuracy(model, data.x_test, data.y_test)


def gradient_errors(right: dict, wrong: dict, model, ax=None):
    """A bar per parameter, from the loss back: how far ``wrong``'s gradient is from ``right``'s,
    |wrong − right| / |right|. Returns the figure."""
    import matplotlib.pyplot as plt

    names = list(reversed(right))
    errors = [((wrong[n] - right[n]).norm() / right[n].norm()).item() for n in names]
    kind = {nn.Linear: "linear", nn.BatchNorm2d: "batch norm", nn.Conv2d: "conv"}
    labels = [f"{n}\n{kind[type(model.get_submodule(n.rpartition('.')[0]))]}" for n in names]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 2.8))
    bars = ax.bar(labels, errors, color="tab:red")
    ax.bar_label(bars, labels=[f"{e:.2f}" for e in errors], fontsize=8)  # a right gradient reads 0.00, not a gap
    ax.set_ylim(0, 1.15 * max(errors))
    ax.set(xlabel="parameter, from the loss back", ylabel="|slipped − right| / |right|",
           title="How far each parameter's gradient is off, one batch of 32 digits")
    return ax.figure


def model_backward(model, x, y):
    """04.11: every layer's backward by hand (``hooklab.backprop``'s formulas), from what forward hooks recorded."""
    from hooklab.backprop import BACKWARD

    return hand_backward(BACKWARD)(model, x, y)


def disagreeing_layers(model, x, y, formulas):
    """04.10: every layer whose formula from ``formulas``, run on what the student's own hooks recorded at
    that layer, disagrees with autograd's gradients; an empty set when none does. A layer that forward
    calls more than once fires each hook once per call: every call is kept and judged on its own
    (backward meets a layer's calls in reverse order, the last call first, as in a chain), and its
    parameters' gradients, summed over the calls as ``.grad`` sums them, are compared once."""
    from hooklab.hooks import Hooks

    calls = {name: [] for name, _ in model.named_children()}  # layer name -> one dict per call
    backwards = dict.fromkeys(calls, 0)

    def recorder(name):
        def forward(layer, args, output):
            calls[name].append({"input": args[0].detach(), "output": output.detach()})

        def backward(layer, grad_input, grad_output):
            backwards[name] += 1  # the last call's backward comes first
            calls[name][-backwards[name]].update(grad_input=grad_input[0], grad_output=grad_output[0])
        return forward, backward

    with Hooks() as handles, warnings.catch_warnings():  # layer '0' gets the images, which need no gradient
        warnings.filterwarnings("ignore", "Full backward hook is firing")
        for name, layer in model.named_children():
            forward, backward = recorder(name)
            handles.add(layer.register_forward_hook(forward))
            handles.add(layer.register_full_backward_hook(backward))
        F.cross_entropy(model(x), y).backward()

    def close(a, b):
        return torch.allclose(a, b, rtol=1e-3, atol=1e-5)

    slipped = set()
    for name, layer_calls in calls.items():
        layer, summed = model.get_submodule(name), {}
        for call in layer_calls:
            with torch.no_grad():  # what *this* call of the layer recorded
                dx, params = formulas[type(layer)](layer, call["input"], call["output"], call["grad_output"])
            if call["grad_input"] is not None and not close(dx, call["grad_input"]):
                slipped.add(name)
            for k, g in params.items():
                if g is not None:
                    summed[k] = summed.get(k, 0) + g
        if any(not close(g, getattr(layer, k).grad) for k, g in summed.items()):
            slipped.add(name)
    model.zero_grad()  # .grad would build up over calls
    return slipped


WORKED = {"linear_backward": ("04.1", linear_backward), "keep_grads": ("04.2", keep_grads),
          "ce_backward_steps": ("04.3", ce_backward_steps), "ce_backward": ("04.4", ce_backward),
          "bn_backward_steps": ("04.5", bn_backward_steps), "batch_norm_backward": ("04.6", batch_norm_backward),
          "judged_alone": ("04.7", judged_alone), "conv2d_backward": ("04.8", conv2d_backward),
          "max_pool_backward": ("04.9", max_pool_backward), "disagreeing_layers": ("04.10", disagreeing_layers),
          "model_backward": ("04.11", model_backward)}


def whose(*ids: str) -> str:
    """For a table's header: each exercise id with "yours" once it has passed in this kernel, else
    "(worked answer)"."""
    from . import passed

    return ", ".join(f"{id} " + ("yours" if passed(id) else "(worked answer)") for id in ids)


def yours_or_worked(names: dict, *wanted: str):
    """``hooklab.exercises.yours_or_worked`` for this lesson: each name in ``wanted`` is the student's once its
    exercise (in ``WORKED``) has passed in this kernel, else the worked answer above."""
    from . import yours_or_worked as pick

    return pick(names, WORKED, *wanted)

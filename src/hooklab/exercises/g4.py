"""Exercises of the field guide G4 (backprop details): more backward passes by hand.

* G4.1 the backward pass of a training step of the 2-2-2 network under MSE (section 3);
* G4.2 softmax on its own, for any incoming gradient (section 6);
* G4.3 cross-entropy with label smoothing (section 7);
* G4.4 a linear layer on a batch of sequences (section 8);
* G4.5 ELU from its output only, as after an in-place ELU (section 11).
* G4.6 batch norm in seven atomic steps, checked in chain order (section 14; lesson 04 asks the fused form).

They are judged like notebook 04's (``_by_hand``): with autograd off and watched, against autograd's
gradients in float64, with a hint for the usual slips.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from . import Outcome, exercise
from ._by_hand import SHOWN_AS_BOUND, D, Trap, by_hand, check_cases, compare, rand, reference
from .nb04 import B1_222, B2_222, W1_222, W2_222, _bn_chain

# ----- G4.1: a training step of the 2-2-2 network under MSE -------------------------------------------
STEP_INPUTS = torch.tensor([[0.05, 0.1], [0.9, 0.2], [0.3, 0.8], [0.6, 0.6]], dtype=D)
STEP_TARGETS = torch.tensor([[0.01, 0.99], [0.99, 0.01], [0.01, 0.99], [0.5, 0.5]], dtype=D)
STEPS, LR = 25, 2.0
#: a second layer with 3 outputs: there 2·(out − t)/N differs from (out − t)/rows
W2_WIDE = torch.tensor([[0.40, 0.50], [0.45, 0.55], [-0.30, 0.20]], dtype=D)
TARGETS_WIDE = torch.tensor([[0.01, 0.99, 0.5], [0.99, 0.01, 0.2], [0.01, 0.99, 0.7], [0.5, 0.5, 0.1]], dtype=D)
_STEP_NAMES = ["x", "w1", "b1", "w2", "b2", "target"]


def _net_loss(x, w1, b1, w2, b2, target):
    return F.mse_loss(torch.sigmoid(torch.sigmoid(x @ w1.T + b1) @ w2.T + b2), target)


def _rows_loss(x, w1, b1, w2, b2, target):
    """A loss whose gradient at the output is (out − t)/rows: right for 2 outputs only."""
    out = torch.sigmoid(torch.sigmoid(x @ w1.T + b1) @ w2.T + b2)
    return ((out - target) ** 2).sum() / (2 * len(target))


def _wide_case(net_backward) -> Outcome | tuple[float, str]:
    """One step of the network with 3 outputs: a failed Outcome, or ``compare``'s result."""
    params, one = (W1_222, B1_222, W2_WIDE, B2_222), torch.tensor(1.0, dtype=D)
    expected = reference(partial(_net_loss, target=TARGETS_WIDE), (STEP_INPUTS, *params), one)[1:]
    by_rows = reference(partial(_rows_loss, target=TARGETS_WIDE), (STEP_INPUTS, *params), one)[1:]
    trap = (by_rows, "mse_loss's mean runs over every entry of the output: dL/d out = 2·(out − t)/N with "
                     "N = target.numel() (rows × outputs); (out − t)/rows is right only when there are 2 outputs")
    got, failed = by_hand(net_backward, _STEP_NAMES, STEP_INPUTS, *params, TARGETS_WIDE)
    return failed or compare(got, expected, ["dw1", "db1", "dw2", "db2"], [trap])


@exercise("G4.1", "the backward pass of a training step")
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
        expected = reference(loss, (STEP_INPUTS, *params), torch.tensor(1.0, dtype=D))[1:]
        got, failed = by_hand(net_backward, _STEP_NAMES, STEP_INPUTS, *params, STEP_TARGETS)
        compared = failed or compare(got, expected, names)
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


# ----- G4.2: softmax on its own -------------------------------------------------------------------------
def _softmax_cases():
    """A square input first: there a row sum that lost its dimension broadcasts without an error."""
    for shape, seed in (((4, 4), 1), ((2, 3, 5), 13)):
        x, dout = rand(*shape, seed=seed) * 2, rand(*shape, seed=seed + 1)
        out = x.softmax(dim=-1)
        traps: list[Trap] = []
        if shape[0] == shape[-1]:
            traps.append(((out * (dout - (dout * out).sum(-1)),),
                          "your row sums were added along the wrong dimension: a sum over the last dimension "
                          f"drops it, and the {tuple(shape[:-1])} result then lines up with the columns; "
                          "keepdim=True keeps one sum per row"))
        traps += [((out * (dout - (dout * out).sum(dim, keepdim=True)),),
                   "sum over the last dimension (dim=-1), where softmax normalises")
                  for dim in range(len(shape) - 1)]
        yield f"x of shape {shape}", partial(torch.softmax, dim=-1), {"x": x}, {"out": out, "dout": dout}, dout, traps


@exercise("G4.2", "softmax backward from the output")
def _softmax(softmax_backward) -> Outcome:
    """``softmax_backward(out, dout) -> dx`` where ``out = x.softmax(dim=-1)``, for any incoming
    ``dout`` (no loss after it); tried on a (4, 4) and a (2, 3, 5) input."""
    return check_cases(softmax_backward, _softmax_cases(), "with x of shapes (4, 4) and (2, 3, 5): ")


# ----- G4.3: cross-entropy with label smoothing ---------------------------------------------------------
@exercise("G4.3", "cross-entropy with label smoothing, backward")
def _softmax_ce(ce_backward) -> Outcome:
    """``ce_backward(logits, target, smoothing) -> dlogits`` for
    ``F.cross_entropy(logits, target, label_smoothing=smoothing)`` (mean over the batch)."""
    # class 3 of 4 is never a target: F.one_hot(target) without num_classes gives 3 columns
    logits, target = rand(5, 4, seed=12) * 2, torch.tensor([2, 0, 1, 1, 2])
    cases = [(f"smoothing={smoothing}", partial(F.cross_entropy, target=target, label_smoothing=smoothing),
              {"logits": logits}, {"logits": logits, "target": target, "smoothing": smoothing},
              torch.tensor(1.0, dtype=D), []) for smoothing in (0.2, 0.0)]
    try:
        return check_cases(ce_backward, cases, "with smoothing 0.2 and 0: ")
    except RuntimeError as error:
        columns = int(target.max()) + 1
        if f"size of tensor a ({logits.shape[1]})" not in str(error) or f"({columns})" not in str(error):
            raise
        return Outcome(False, f"your code raised RuntimeError: {error}. The targets here never include class "
                              f"{logits.shape[1] - 1}, and F.one_hot infers the number of classes from the "
                              "largest target: pass num_classes=logits.shape[1]")


# ----- G4.4: linear on a batch of sequences -------------------------------------------------------------
def _linear_cases():
    """Two (B, T, in) shapes, so that an answer with B·T or a size written in does not pass."""
    for (batch, steps, n_in, n_out), seed in (((2, 5, 4, 3), 3), ((3, 1, 4, 2), 20)):
        x, w = rand(batch, steps, n_in, seed=seed), rand(n_out, n_in, seed=seed + 1)
        b, dout = rand(n_out, seed=seed + 2), rand(batch, steps, n_out, seed=seed + 3)
        yield (f"x of shape {tuple(x.shape)}", F.linear, {"x": x, "w": w, "b": b}, {"x": x, "w": w, "dout": dout},
               dout, [])


@exercise("G4.4", "linear backward on a batch of sequences")
def _linear(linear_backward) -> Outcome:
    """``linear_backward(x, w, dout) -> (dx, dw, db)`` for ``y = x @ w.T + b`` with ``x`` of shape
    ``(B, T, in)`` (bias shape ``[out]``); tried on x of shape (2, 5, 4) with 3 outputs, then
    (3, 1, 4) with 2."""
    return check_cases(linear_backward, _linear_cases(), "with x of shapes (2, 5, 4) and (3, 1, 4): ")


# ----- G4.5: ELU from its output --------------------------------------------------------------------------
@exercise("G4.5", "ELU backward from the output")
def _elu(elu_backward) -> Outcome:
    """``elu_backward(out, dout, alpha) -> dx`` where ``out = F.elu(x, alpha)``: only the output is
    given, as after an in-place ELU; tried with alpha 1 and 0.5."""
    x, dout = rand(5, 6, seed=7) * 2, rand(5, 6, seed=8)
    cases = [(f"alpha={alpha}", partial(F.elu, alpha=alpha), {"x": x},
              {"out": F.elu(x, alpha), "dout": dout, "alpha": alpha}, dout, []) for alpha in (1.0, 0.5)]
    return check_cases(elu_backward, cases, "with alpha 1.0 and 0.5: ")


# ----- G4.6: batch norm in seven atomic steps (the chain lesson 04's fused 04.6 is compared with) -----------
exercise("G4.6", "batch norm in seven atomic steps, checked in chain order")(_bn_chain)

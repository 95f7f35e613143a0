"""Exercises of the field guide G4: each checker accepts a correct backward and rejects a wrong one,
and the watch shared with notebook 04 (``hooklab.exercises._by_hand``) refuses autograd, PyTorch's
backward operators and the course's own formulas."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from answers import failed

from hooklab import backprop as bp
from hooklab.backprop import losses
from hooklab.backprop.losses import softmax_cross_entropy_backward
from hooklab.exercises import _by_hand, check, grade

SOLUTIONS = Path(__file__).resolve().parents[1] / "notebooks" / "solutions" / "G4_backprop_details_solutions.ipynb"


def conv_by_unfold(x, w, dout, padding=0):  # notebook 04's 04.8, used to test the shared watch
    kernel, d = w.shape[-2:], dout.flatten(2)  # d: (N, out, L)
    dw = torch.einsum("nol,nkl->ok", d, F.unfold(x, kernel, padding=padding)).reshape(w.shape)
    dx = F.fold(torch.einsum("ok,nol->nkl", w.flatten(1), d), x.shape[-2:], kernel, padding=padding)
    return dx, dw


def linear_on_sequences(x, w, dout):
    rows_x, rows_dout = x.reshape(-1, x.shape[-1]), dout.reshape(-1, dout.shape[-1])
    return dout @ w, rows_dout.T @ rows_x, rows_dout.sum(0)


def smoothed(target, smoothing, classes=4):
    return (1 - smoothing) * F.one_hot(target, classes).double() + smoothing / classes


def softmax_backward(out, dout):
    return out * (dout - (dout * out).sum(-1, keepdim=True))


def softmax_backward_by_jacobian(out, dout):  # the same through the full (..., n, n) Jacobian
    jacobian = out[..., :, None] * (torch.eye(out.shape[-1], dtype=out.dtype) - out[..., None, :])
    return torch.einsum("...i,...ij->...j", dout, jacobian)


def elu_backward(out, dout, alpha):
    return torch.where(out > 0, dout, dout * (out + alpha))


def net_backward(x, w1, b1, w2, b2, target, mean=True):
    s1 = torch.sigmoid(x @ w1.T + b1)
    s2 = torch.sigmoid(s1 @ w2.T + b2)
    dz2 = 2 * (s2 - target) / (target.numel() if mean else 1) * s2 * (1 - s2)
    dz1 = (dz2 @ w2) * s1 * (1 - s1)
    return dz1.T @ x, dz1.sum().reshape(1), dz2.T @ s1, dz2.sum().reshape(1)


def net_backward_by_rows(x, w1, b1, w2, b2, target):  # dL/d out = (out − t)/rows
    s1 = torch.sigmoid(x @ w1.T + b1)
    s2 = torch.sigmoid(s1 @ w2.T + b2)
    dz2 = (s2 - target) / len(target) * s2 * (1 - s2)
    dz1 = (dz2 @ w2) * s1 * (1 - s1)
    return dz1.T @ x, dz1.sum().reshape(1), dz2.T @ s1, dz2.sum().reshape(1)


def test_the_rows_formula_is_right_on_the_two_output_network_only():
    """The slip G4.1's first case is there for: on the 2-2-2 network alone it would pass."""
    from hooklab.exercises.g4 import STEP_INPUTS, STEP_TARGETS
    from hooklab.exercises.nb04 import B1_222, B2_222, W1_222, W2_222

    args = (STEP_INPUTS, W1_222, B1_222, W2_222, B2_222, STEP_TARGETS)
    for right, by_rows in zip(net_backward(*args), net_backward_by_rows(*args), strict=True):
        assert torch.allclose(right, by_rows)


CORRECT = {
    "G4.1": net_backward,
    "G4.2": softmax_backward,
    "G4.4": linear_on_sequences,
    "G4.5": elu_backward,
    "G4.3": lambda logits, target, s: (logits.softmax(1) - smoothed(target, s)) / len(target),
}

WRONG = {
    "G4.1": lambda *args: net_backward(*args, mean=False),
    "G4.2": lambda out, dout: dout * out * (1 - out),  # the sigmoid's diagonal: misses the other outputs of a row
    "G4.4": lambda x, w, dout: (dout @ w, dout.mT @ x, dout.sum((0, 1))),  # dw per sequence: (B, out, in)
    "G4.5": lambda out, dout, alpha: dout * (out > 0),  # ReLU's: no gradient where the input was negative
    "G4.3": lambda logits, target, s: logits.softmax(1) - smoothed(target, s),  # forgot the 1/N of the mean
}

WRONG_TOO = [  # more wrong answers, each with a part of the message that must explain it
    ("G4.1", lambda *args: net_backward(*args, mean=False),
     "(every entry is 12 × the right value: a missing division"),
    ("G4.1", net_backward_by_rows,  # passes on the 2-2-2 network, where the 2 happens to cancel
     "(mse_loss's mean runs over every entry of the output: dL/d out = 2·(out − t)/N"),
    ("G4.1", lambda x, w1, b1, w2, b2, target: [g / 2 for g in net_backward(x, w1, b1, w2, b2, target)],
     "(every entry is 0.5 × the right value, 1/2: an extra division"),
    ("G4.2", lambda out, dout: out * (dout - (dout * out).sum(-1)),  # the row sum broadcasts along columns
     "with x of shape (4, 4): dx: max |difference| 4.2e-01 (your row sums were added along the wrong dimension"),
    ("G4.2", lambda out, dout: out * (dout - (dout * out).sum(1, keepdim=True)),  # right on 2-D inputs only
     "with x of shape (2, 3, 5): dx: max |difference| 2.9e-01 (sum over the last dimension (dim=-1), where softmax "
     "normalises)"),
    ("G4.2", lambda out, dout: out * (dout - (dout * out).sum()), "with x of shape (4, 4)"),  # one sum for all rows
    ("G4.2", lambda out, dout: out[..., :, None] * (torch.eye(4, dtype=out.dtype) - out[..., None, :]),
     "with x of shape (4, 4): dx: shape (4, 4, 4), expected (4, 4)"),  # the Jacobian, never multiplied by dout
    ("G4.5", lambda out, dout, alpha: torch.where(out > 0, dout, dout * (out + 1)), "with alpha=0.5"),  # alpha=1 only
    ("G4.5", lambda out, dout, alpha: torch.where(out > 0, dout, dout * alpha * out.exp()),  # out taken for x
     "with alpha=1.0"),
    ("G4.5", lambda out, dout, alpha: elu_backward(out, dout, alpha).float(), "your dx is float32"),
    ("G4.4", lambda x, w, dout: (dout @ w, (dout.mT @ x).sum(0), dout.sum(0)), "db: shape (5, 3), expected (3,)"),
    ("G4.3", lambda logits, target, s: (logits.softmax(1) - smoothed(target, 0.0)) / len(target),  # no smoothing
     "with smoothing=0.2"),
    ("G4.3", lambda logits, target, s: (logits.softmax(1) - ((1 - s) * F.one_hot(target, 4) + s / 4)) / len(target),
     "float32 rounding"),  # one_hot times a Python float is float32
]


@pytest.mark.parametrize("id", list(CORRECT))
def test_checker_accepts_a_correct_answer(id):
    outcome = grade(id, CORRECT[id])
    assert outcome.passed, outcome.detail
    assert "max |difference|" in outcome.detail


@pytest.mark.parametrize("id", list(WRONG))
def test_checker_rejects_a_wrong_answer(id):
    outcome = grade(id, WRONG[id])
    assert not outcome.passed, outcome.detail


@pytest.mark.parametrize(("id", "answer", "message"), WRONG_TOO)
def test_checker_explains_more_wrong_answers(id, answer, message):
    outcome = grade(id, answer)
    assert not outcome.passed and message in outcome.detail, outcome.detail


@pytest.mark.parametrize(("id", "answer"), [
    ("G4.2", softmax_backward_by_jacobian),
    ("G4.5", lambda out, dout, alpha: torch.where(out > 0, dout, dout * alpha * torch.log1p(out / alpha).exp())),
    ("G4.4", lambda x, w, dout: (dout @ w, torch.einsum("bto,bti->oi", dout, x), dout.sum((0, 1)))),
    ("G4.4", lambda x, w, dout: linear_by_loop(x, w, dout)),
    ("G4.5", lambda out, dout, alpha: dout * ((out > 0).double() + (out <= 0).double() * (out + alpha))),  # masks
])
def test_other_right_answers_pass(id, answer):  # Jacobian, x recovered, einsum, loop, float64 masks
    outcome = grade(id, answer)
    assert outcome.passed, outcome.detail


def linear_by_loop(x, w, dout):  # one sequence at a time, into zero-filled gradients
    dx, dw, db = torch.zeros_like(x), torch.zeros_like(w), torch.zeros(w.shape[0], dtype=x.dtype)
    for b in range(x.shape[0]):
        dx[b] = dout[b] @ w
        dw += dout[b].T @ x[b]
        db += dout[b].sum(0)
    return dx, dw, db


def softmax_by_autograd(out, dout):  # x recovered from out (up to a constant per row), then autograd
    with torch.enable_grad():
        x = out.log().requires_grad_()
        return torch.autograd.grad(x.softmax(-1), x, dout)[0]


def linear_by_autograd(x, w, dout):
    with torch.enable_grad():
        x, w = x.requires_grad_(), w.requires_grad_()
        b = torch.zeros(w.shape[0], dtype=x.dtype, requires_grad=True)
        return torch.autograd.grad(F.linear(x, w, b), (x, w, b), dout)


def elu_by_autograd(out, dout, alpha):
    with torch.enable_grad():
        x = torch.where(out > 0, out, torch.log1p(out / alpha)).requires_grad_()
        return torch.autograd.grad(F.elu(x, alpha), x, dout)[0]


def linear_by_backward_call(x, w, dout):  # .backward() with grad mode on: no backward-named operator runs
    with torch.enable_grad():
        x, w = x.requires_grad_(), w.requires_grad_()
        b = torch.zeros(w.shape[0], dtype=x.dtype, requires_grad=True)
        F.linear(x, w, b).backward(dout)
        return x.grad, w.grad, b.grad


SHORTCUTS = [  # autograd or PyTorch's own backward operator, each with the name the message must give
    ("G4.2", softmax_by_autograd, "a backward op (aten._softmax_backward_data)"),
    ("G4.2", lambda out, dout: torch.func.vjp(lambda x: x.softmax(-1), out.log())[1](dout)[0],
     "a backward op (aten._softmax_backward_data)"),
    ("G4.2", lambda out, dout: torch._softmax_backward_data(dout, out, -1, out.dtype),
     "a backward op (aten._softmax_backward_data)"),
    ("G4.4", linear_by_autograd, "autograd (linear on a tensor that requires grad)"),
    ("G4.4", linear_by_backward_call, "autograd (linear on a tensor that requires grad)"),
    ("G4.5", elu_by_autograd, "a backward op (aten.elu_backward)"),
    ("G4.5", lambda out, dout, alpha: torch.ops.aten.elu_backward(dout, alpha, 1, 1, True, out),
     "a backward op (aten.elu_backward)"),
]


@pytest.mark.parametrize(("id", "answer", "called"), SHORTCUTS)
def test_autograd_and_backward_ops_fail_with_their_name(id, answer, called):
    outcome = grade(id, answer)
    assert not outcome.passed, outcome.detail
    assert outcome.detail.endswith(f"write the formula yourself: your answer called {called}"), outcome.detail


def modes_active():
    return (len(torch.overrides._get_current_function_mode_stack()),
            len(torch.utils._python_dispatch._get_current_dispatch_mode_stack()))


def test_the_watch_on_the_answer_ends_with_it():
    def raises(out, dout):
        raise ValueError("a bug")

    assert modes_active() == (0, 0)
    assert not grade("G4.2", SHORTCUTS[0][1]).passed and modes_active() == (0, 0)
    with pytest.raises(ValueError, match="a bug"):
        grade("G4.2", raises)
    assert modes_active() == (0, 0)
    assert grade("G4.2", softmax_backward).passed and modes_active() == (0, 0)


def test_a_linear_answer_with_the_first_shape_written_in_fails(capsys):
    check("G4.4", lambda x, w, dout: (dout @ w, dout.reshape(10, 3).T @ x.reshape(10, 4), dout.reshape(10, 3).sum(0)))
    assert capsys.readouterr().out.startswith("Exercise G4.4 (linear backward on a batch of sequences): failed — "
                                              "your code raised RuntimeError: shape '[10, 3]' is invalid")


def softmax_stub(out, dout):  # the notebook's stubs, with their arguments
    raise NotImplementedError


def elu_stub(out, dout, alpha):
    raise NotImplementedError


@pytest.mark.parametrize(("id", "stub", "title"), [("G4.2", softmax_stub, "softmax backward from the output"),
                                                   ("G4.5", elu_stub, "ELU backward from the output")])
def test_the_notebook_stubs_print_not_solved_yet(id, stub, title, capsys):
    check(id, stub)
    assert capsys.readouterr().out == f"Exercise {id} ({title}): not solved yet\n"


def test_a_passing_difference_is_printed_as_a_bound_when_it_is_rounding():
    assert grade("G4.4", linear_on_sequences).detail == ("with x of shapes (2, 5, 4) and (3, 1, 4): dx, dw, db match "
                                                         "autograd; max |difference| < 1e-12")
    off = grade("G4.4", lambda x, w, dout: (*linear_on_sequences(x, w, dout)[:2], dout.sum((0, 1)) + 5e-11))
    assert off.passed and off.detail.endswith("max |difference| 5.0e-11 (in db)")  # within tolerance, above the bound


def test_several_inputs_are_all_tried_and_the_largest_difference_is_printed():
    assert grade("G4.2", softmax_backward).detail == ("with x of shapes (4, 4) and (2, 3, 5): dx matches autograd; "
                                                      "max |difference| < 1e-12")
    assert grade("G4.5", elu_backward).detail == "with alpha 1.0 and 0.5: dx matches autograd; max |difference| < 1e-12"

    def off_most_on_the_first(out, dout, alpha):  # within tolerance, above the bound
        return elu_backward(out, dout, alpha) + (5e-11 if alpha == 1.0 else 2e-11)

    off = grade("G4.5", off_most_on_the_first)
    assert off.passed and off.detail == "with alpha 1.0 and 0.5: dx matches autograd; max |difference| 5.0e-11 (in dx)"
    assert grade("G4.3", CORRECT["G4.3"]).detail == ("with smoothing 0.2 and 0: dlogits matches autograd; "
                                                     "max |difference| < 1e-12")

    def ce_off_most_on_the_first(logits, target, s):
        return CORRECT["G4.3"](logits, target, s) + (5e-11 if s == 0.2 else 2e-11)

    off = grade("G4.3", ce_off_most_on_the_first)
    assert off.passed and off.detail == ("with smoothing 0.2 and 0: dlogits matches autograd; max |difference| "
                                         "5.0e-11 (in dlogits)")


def test_the_checked_elu_outputs_have_both_signs():
    """Otherwise ReLU's backward or one that ignores alpha could pass."""
    failed("G4.5", lambda out, dout, alpha: dout, "dx: max |difference|")  # the identity: all outputs positive
    failed("G4.5", lambda out, dout, alpha: dout * (out + alpha), "dx: max |difference|")  # all negative


def test_wrong_number_of_results_is_explained():
    outcome = grade("G4.4", lambda x, w, dout: dout @ w)
    assert not outcome.passed and "returned 1 tensor(s), expected 3" in outcome.detail


def test_an_answer_that_changes_its_input_in_place_is_told_so():
    outcome = grade("G4.2", lambda out, dout: out * dout.sub_((dout * out).sum(-1, keepdim=True)))  # right numbers
    assert not outcome.passed and "changed its input dout in place" in outcome.detail
    outcome = grade("G4.4", lambda x, w, dout: (dout.zero_() @ w, *linear_on_sequences(x, w, dout)[1:]))
    assert not outcome.passed and "in place" in outcome.detail


def test_autograd_inside_the_answer_is_refused():
    def with_autograd(x, w, dout, padding):
        x, w = x.requires_grad_(), w.requires_grad_()
        F.conv2d(x, w, padding=padding).backward(dout)
        return x.grad, w.grad

    outcome = grade("04.8", with_autograd)
    assert not outcome.passed
    assert outcome.detail == ("with padding=0: write the formula yourself: your answer called autograd (conv2d on a "
                              "tensor that requires grad)")
    outcome = grade("G4.2", lambda out, dout: (out * dout).sum().backward())  # nothing requires grad: autograd's error
    assert not outcome.passed and "by hand means without autograd" in outcome.detail


def test_float32_results_get_a_dtype_hint():
    outcome = grade("G4.2", lambda out, dout: softmax_backward(out, dout).float())
    assert not outcome.passed and "float32" in outcome.detail and "float64" in outcome.detail


@pytest.mark.parametrize("returned", [{"dx": 0}, [[1.0, 2.0]], "dx"])
def test_a_result_that_is_not_tensors_names_its_type(returned):
    outcome = grade("G4.2", lambda out, dout: returned)
    assert not outcome.passed and "return 1 tensor(s)" in outcome.detail


def test_one_hot_without_num_classes_is_explained():
    outcome = grade("G4.3", lambda logits, target, s: (logits.softmax(1) - F.one_hot(target)) / len(target))
    assert not outcome.passed
    assert "F.one_hot infers the number of classes from the largest target" in outcome.detail
    assert "num_classes=logits.shape[1]" in outcome.detail and "never include class 3" in outcome.detail


def test_other_errors_of_the_answer_still_propagate():
    with pytest.raises(RuntimeError, match="size of tensor a"):  # check() prints it as "your code raised"
        grade("G4.3", lambda logits, target, s: logits.softmax(1) - torch.ones(5, 2, dtype=logits.dtype))


def worked_answers() -> dict:
    """Each exercise's worked answer from the solutions notebook, by id: its cells run without
    their check() line."""
    namespace, answers = {"torch": torch, "F": F}, {}
    for cell in json.loads(SOLUTIONS.read_text())["cells"]:
        lines = "".join(cell["source"]).splitlines()
        checks = [re.fullmatch(r'check\("(G4\.\d)", (\w+)\)', line) for line in lines]
        if cell["cell_type"] == "code" and any(checks):
            exec("\n".join(line for line, found in zip(lines, checks, strict=True) if not found), namespace)
            answers.update((found[1], namespace[found[2]]) for found in checks if found)
    return answers


def test_the_worked_answers_of_the_solutions_notebook_pass():
    answers = worked_answers()
    assert list(answers) == [f"G4.{k}" for k in range(1, 7)]  # in the order the guide asks them
    for id, answer in answers.items():
        outcome = grade(id, answer)
        assert outcome.passed, f"{id}: {outcome.detail}"


def softmax_by_the_loss(out, dout):  # softmax·Σy − y with y = −dout·out and log(out) as logits is the softmax backward
    rows = out.log().reshape(-1, out.shape[-1]), (-dout * out).reshape(-1, out.shape[-1])
    return softmax_cross_entropy_backward(*rows, reduction="sum").reshape(out.shape)


COURSE_SHORTCUTS = [  # the course's own formulas, each with the function the message must name
    ("G4.3", lambda logits, target, s: softmax_cross_entropy_backward(logits, smoothed(target, s)),
     "hooklab.backprop.losses.softmax_cross_entropy_backward"),
    ("G4.3", lambda logits, target, s: losses.softmax_cross_entropy_backward(logits, smoothed(target, s), 1 / 5, "sum"),
     "hooklab.backprop.losses.softmax_cross_entropy_backward"),
    ("G4.2", softmax_by_the_loss, "hooklab.backprop.losses.softmax_cross_entropy_backward"),
    ("G4.4", lambda x, w, dout: bp.linear_backward(x, w, dout, torch.zeros(w.shape[0], dtype=w.dtype)),
     "hooklab.backprop.linear_backward"),
]


@pytest.mark.parametrize(("id", "answer", "called"), COURSE_SHORTCUTS)
def test_the_course_own_formulas_fail_with_a_hint(id, answer, called):
    outcome = grade(id, answer)
    assert not outcome.passed, outcome.detail
    assert outcome.detail.endswith(f"write the formula yourself: your answer called {called}, the course's own "
                                   "backward formula (writing it is the exercise)"), outcome.detail


@pytest.mark.parametrize(("id", "answer", "called"), COURSE_SHORTCUTS)
def test_the_course_shortcuts_are_right_but_for_the_watch(id, answer, called, monkeypatch):
    """So the watch is what fails them (the gap it closes)."""
    monkeypatch.setattr(_by_hand, "_course_files", dict)
    outcome = grade(id, answer)
    assert outcome.passed, outcome.detail


def _rebuilt(function):
    """``function`` rebuilt from its code under another module name (what a file check still finds)."""
    globals_ = {**vars(sys.modules[function.__module__]), "__name__": "__main__"}
    return types.FunctionType(function.__code__, globals_, "rebuilt", function.__defaults__)


def _conv_by_jacfwd(x, w, dout, padding):
    return torch.func.jacfwd(lambda x, w: (F.conv2d(x, w, padding=padding) * dout).sum(), argnums=(0, 1))(x, w)


def _conv_by_forward_ad(x, w, dout, padding):
    import torch.autograd.forward_ad as fwAD

    dx = torch.zeros(x.numel(), dtype=x.dtype)
    for i in range(x.numel()):
        tangent = torch.zeros(x.numel(), dtype=x.dtype)
        tangent[i] = 1
        with fwAD.dual_level():
            dual = fwAD.make_dual(x, tangent.view_as(x))
            dx[i] = fwAD.unpack_dual((F.conv2d(dual, w, padding=padding) * dout).sum()).tangent
    return dx.view_as(x), torch.zeros_like(w)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")  # torch.func's import
@pytest.mark.parametrize(("answer", "called"), [
    (lambda x, w, dout, padding: _rebuilt(bp.conv2d_backward)(x, w, dout, padding=padding)[:2],
     "hooklab.backprop.conv2d_backward"),
    (_conv_by_jacfwd, "forward-mode autograd"),
    (_conv_by_forward_ad, "forward-mode autograd"),
], ids=["rebuilt under another module name", "torch.func.jacfwd", "forward_ad"])
def test_shortcuts_without_a_backward_op_fail_too(answer, called):
    outcome = grade("04.8", answer)
    assert not outcome.passed and f"write the formula yourself: your answer called {called}" in outcome.detail, \
        outcome.detail


def test_a_vmap_answer_and_a_call_of_a_forward_loss_are_not_shortcuts():
    def softmax_rows(out, dout):
        rows = out.reshape(-1, out.shape[-1]), dout.reshape(-1, out.shape[-1])
        return torch.vmap(lambda o, d: o * (d - (o * d).sum()))(*rows).reshape(out.shape)

    assert grade("G4.2", softmax_rows).passed

    def label_smoothing(logits, target, s):
        losses.softmax_cross_entropy(logits, target)  # the forward loss: not the exercise's answer
        return (logits.softmax(-1) - smoothed(target, s)) / logits.shape[0]

    outcome = grade("G4.3", label_smoothing)
    assert outcome.passed, outcome.detail


def test_a_course_formula_that_raises_still_gets_the_hint():
    outcome = grade("G4.3", lambda logits, target, s: softmax_cross_entropy_backward(logits, F.one_hot(target)))
    assert not outcome.passed  # F.one_hot gives 3 columns: the course function raised a RuntimeError
    assert "your answer called hooklab.backprop.losses.softmax_cross_entropy_backward" in outcome.detail, outcome.detail


def ce_by_scatter(logits, target, smoothing):  # log_softmax, smoothed target built with scatter_add_
    n, classes = logits.shape
    y = torch.full_like(logits, smoothing / classes)
    y.scatter_add_(1, target[:, None], torch.full((n, 1), 1 - smoothing, dtype=logits.dtype))
    return (logits.log_softmax(dim=1).exp() - y) / n


def ce_by_exp(logits, target, smoothing):  # softmax written out, one-hot rows taken from an identity matrix
    e = (logits - logits.amax(dim=1, keepdim=True)).exp()
    y = (1 - smoothing) * torch.eye(logits.shape[1], dtype=logits.dtype)[target] + smoothing / logits.shape[1]
    return (e / e.sum(dim=1, keepdim=True) - y) / len(target)


def ce_by_index(logits, target, smoothing):  # F.softmax, then the target's entry of each row lowered in place
    n, classes = logits.shape
    d = F.softmax(logits, dim=1) - smoothing / classes
    d[torch.arange(n), target] -= 1 - smoothing
    return d / n


def ce_by_the_general_formula(logits, target, smoothing):  # p·Σy − y, as if the rows of y need not sum to 1
    y = (1 - smoothing) * F.one_hot(target, logits.shape[1]).to(logits.dtype) + smoothing / logits.shape[1]
    return (logits.softmax(dim=-1) * y.sum(dim=1, keepdim=True) - y) / logits.shape[0]


@pytest.mark.parametrize("answer", [ce_by_scatter, ce_by_exp, ce_by_index, ce_by_the_general_formula])
def test_other_right_label_smoothing_answers_pass(answer):
    outcome = grade("G4.3", answer)
    assert outcome.passed, outcome.detail


def test_a_conv_answer_by_unfold_and_fold_passes():  # the ops hooklab.backprop uses, written by the student
    assert grade("04.8", conv_by_unfold).passed


def test_no_watch_is_left_after_a_check():
    def watched():
        return (modes_active(), sys.getprofile(), sys.gettrace(), losses.softmax_cross_entropy_backward,
                bp.linear_backward, bp.conv2d_backward, _by_hand._course_files())

    def course_then_a_bug(logits, target, s):
        raise ValueError(f"a bug after {softmax_cross_entropy_backward(logits, target).shape}")

    def a_bug(logits, target, s):
        raise ValueError("a bug")

    before = watched()
    assert before[0] == (0, 0) and before[3] is softmax_cross_entropy_backward
    assert not grade("G4.3", COURSE_SHORTCUTS[0][1]).passed and watched() == before  # failed
    failed("G4.3", course_then_a_bug, "write the formula yourself")
    assert watched() == before  # failed, the answer raised
    with pytest.raises(ValueError, match="a bug"):
        grade("G4.3", a_bug)
    assert watched() == before
    assert grade("G4.3", ce_by_index).passed and watched() == before  # passed
    logits, target = torch.randn(3, 4, dtype=torch.float64), torch.tensor([0, 3, 1])
    assert torch.allclose(softmax_cross_entropy_backward(logits, target),  # the course's function, outside a check
                          (logits.softmax(1) - F.one_hot(target, 4).double()) / 3)

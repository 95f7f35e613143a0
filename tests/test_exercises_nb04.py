"""Exercises of notebook 04: each checker accepts a correct backward and rejects a wrong one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hooklab import backprop as bp
from hooklab.exercises import grade
from hooklab.losses import softmax_cross_entropy_backward


def conv_no_bias(x, w, dout):
    dx, dw, _ = bp.conv2d_backward(x, w, dout)
    return dx, dw


def linear_on_sequences(x, w, dout):
    dx, dw, db = bp.linear_backward(x.flatten(0, 1), w, dout.flatten(0, 1), torch.zeros(w.shape[0], dtype=w.dtype))
    return dx.reshape(x.shape), dw, db


def smoothed(target, smoothing, classes=4):
    return (1 - smoothing) * F.one_hot(target, classes).double() + smoothing / classes


CORRECT = {
    "04.1": bp.sigmoid_backward,
    "04.2": linear_on_sequences,
    "04.3": bp.relu_backward,
    "04.4": conv_no_bias,
    "04.5": lambda logits, target, s: softmax_cross_entropy_backward(logits, smoothed(target, s)),
}

WRONG = {
    "04.1": lambda out, dout: dout * out * (1 + out),  # sign slip
    "04.2": lambda x, w, dout: (dout @ w, dout.mT @ x, dout.sum((0, 1))),  # dw per sequence: (B, out, in)
    "04.3": lambda out, dout: dout * (out >= 0),  # lets the gradient through where the input was negative
    "04.4": lambda x, w, dout: (F.conv_transpose2d(dout, w), torch.zeros_like(w)),  # dw missing
    "04.5": lambda logits, target, s: logits.softmax(1) - smoothed(target, s),  # forgot the 1/N of the mean
}

WRONG_TOO = [  # more wrong answers, each with a part of the message that must explain it
    ("04.2", lambda x, w, dout: (dout @ w, (dout.mT @ x).sum(0), dout.sum(0)), "db: shape (5, 3), expected (3,)"),
    ("04.5", lambda logits, target, s: softmax_cross_entropy_backward(logits, target), "with smoothing=0.2"),
    ("04.5", lambda logits, target, s: (logits.softmax(1) - ((1 - s) * F.one_hot(target, 4) + s / 4)) / len(target),
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


def test_a_passing_difference_is_printed_as_a_bound_when_it_is_rounding():
    assert grade("04.1", bp.sigmoid_backward).detail == "dx matches autograd; max |difference| < 1e-12"
    off = grade("04.1", lambda out, dout: dout * out * (1 - out) + 5e-11)  # within tolerance, above the bound
    assert off.passed and off.detail.endswith("max |difference| 5.0e-11 (in dx)")


def test_wrong_number_of_results_is_explained():
    outcome = grade("04.2", lambda x, w, dout: dout @ w)
    assert not outcome.passed and "returned 1 tensor(s), expected 3" in outcome.detail


def test_an_answer_that_changes_its_input_in_place_is_told_so():
    outcome = grade("04.1", lambda out, dout: dout.mul_(out).mul_(1 - out))  # right numbers, dout overwritten
    assert not outcome.passed and "changed its input dout in place" in outcome.detail
    outcome = grade("04.2", lambda x, w, dout: (dout.zero_() @ w, *linear_on_sequences(x, w, dout)[1:]))
    assert not outcome.passed and "in place" in outcome.detail


def test_autograd_inside_the_answer_is_refused():
    def with_autograd(x, w, dout):
        x, w = x.requires_grad_(), w.requires_grad_()
        F.conv2d(x, w).backward(dout)
        return x.grad, w.grad

    outcome = grade("04.4", with_autograd)
    assert not outcome.passed and "without autograd" in outcome.detail


def test_float32_results_get_a_dtype_hint():
    outcome = grade("04.1", lambda out, dout: (dout * out * (1 - out)).float())
    assert not outcome.passed and "float32" in outcome.detail and "float64" in outcome.detail


@pytest.mark.parametrize("returned", [{"dx": 0}, [[1.0, 2.0]], "dx"])
def test_a_result_that_is_not_tensors_names_its_type(returned):
    outcome = grade("04.1", lambda out, dout: returned)
    assert not outcome.passed and "return 1 tensor(s)" in outcome.detail


def test_one_hot_without_num_classes_is_explained():
    outcome = grade("04.5", lambda logits, target, s: (logits.softmax(1) - F.one_hot(target)) / len(target))
    assert not outcome.passed
    assert "F.one_hot infers the number of classes from the largest target" in outcome.detail
    assert "num_classes=logits.shape[1]" in outcome.detail and "never include class 3" in outcome.detail


def test_other_errors_of_the_answer_still_propagate():
    with pytest.raises(RuntimeError, match="size of tensor a"):  # check() prints it as "your code raised"
        grade("04.5", lambda logits, target, s: logits.softmax(1) - torch.ones(5, 2, dtype=logits.dtype))

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


CORRECT = {
    "04.1": bp.sigmoid_backward,
    "04.2": lambda x, w, dout: (dout @ w, dout.T @ x, dout.sum(0)),
    "04.3": bp.relu_backward,
    "04.4": conv_no_bias,
    "04.5": softmax_cross_entropy_backward,
}

WRONG = {
    "04.1": lambda out, dout: dout * out * (1 + out),  # sign slip
    "04.2": lambda x, w, dout: (dout @ w, x.T @ dout, dout.sum(0)),  # dw transposed: wrong shape
    "04.3": lambda out, dout: dout * (out >= 0),  # lets the gradient through where the input was negative
    "04.4": lambda x, w, dout: (F.conv_transpose2d(dout, w), torch.zeros_like(w)),  # dw missing
    "04.5": lambda logits, target: logits.softmax(1) - F.one_hot(target, 4),  # forgot the 1/N of the mean
}


@pytest.mark.parametrize("id", list(CORRECT))
def test_checker_accepts_a_correct_answer(id):
    outcome = grade(id, CORRECT[id])
    assert outcome.passed, outcome.detail
    assert "max |difference|" in outcome.detail


@pytest.mark.parametrize("id", list(WRONG))
def test_checker_rejects_a_wrong_answer(id):
    outcome = grade(id, WRONG[id])
    assert not outcome.passed, outcome.detail


def test_wrong_number_of_results_is_explained():
    outcome = grade("04.2", lambda x, w, dout: dout @ w)
    assert not outcome.passed and "returned 1 tensor(s), expected 3" in outcome.detail


def test_an_answer_that_changes_its_input_in_place_is_told_so():
    outcome = grade("04.1", lambda out, dout: dout.mul_(out).mul_(1 - out))  # right numbers, dout overwritten
    assert not outcome.passed and "changed its input dout in place" in outcome.detail
    outcome = grade("04.2", lambda x, w, dout: (dout.zero_() @ w, dout.T @ x, dout.sum(0)))
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


def test_one_hot_without_num_classes_fails_when_the_last_class_is_not_a_target():
    with pytest.raises(RuntimeError, match="size of tensor a"):  # check() prints it as "your code raised"
        grade("04.5", lambda logits, target: (logits.softmax(1) - F.one_hot(target)) / len(target))

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

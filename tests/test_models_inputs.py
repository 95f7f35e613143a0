"""hooklab.data and hooklab.models with bad input: hooklab's own parameter names in the errors."""

from __future__ import annotations

import pytest
import torch

from hooklab.data import digits
from hooklab.models import DigitsCNN, accuracy, train_digits


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"test_fraction": 0}, ValueError, r"test_fraction must leave at least 10 of the 1797 digits .*not 0$"),
    ({"test_fraction": 1.5}, ValueError, "test_fraction must leave"),
    ({"test_fraction": 0.001}, ValueError, "test_fraction must leave"),
    ({"test_fraction": "0.2"}, TypeError, "test_fraction must be a number"),
    ({"seed": -1}, ValueError, r"seed must be a whole number from 0 to 2\*\*32 - 1, not -1"),
    ({"seed": 0.5}, TypeError, "seed must be a whole number"),
])
def test_digits_checks_its_own_parameters(kwargs, error, message):
    with pytest.raises(error, match=message):
        digits(**kwargs)


def test_digits_smallest_split_still_works():
    data = digits(test_fraction=0.0056)
    assert len(data.y_test) == 11 and len(data.y_train) == 1786


@pytest.mark.parametrize(("shape", "message"), [
    ((1, 8, 8), r"DigitsCNN expects \(N, 1, 8, 8\), got \(1, 8, 8\): add a batch dimension with x\[None\]"),
    ((8, 8), r"got \(8, 8\): add batch and channel dimensions with x\[None, None\]"),
    ((2, 3, 8, 8), r"got \(2, 3, 8, 8\)$"),
])
def test_digits_cnn_names_the_expected_input_shape(shape, message):
    with pytest.raises(ValueError, match=message):
        DigitsCNN()(torch.rand(*shape))


def test_flatten_head_needs_8x8_and_gap_head_takes_other_sizes():
    with pytest.raises(ValueError, match=r"got \(1, 1, 16, 16\)"):
        DigitsCNN(head="flatten")(torch.rand(1, 1, 16, 16))
    assert DigitsCNN()(torch.rand(1, 1, 16, 16)).shape == (1, 10)
    assert DigitsCNN(head="flatten")(torch.rand(2, 1, 8, 8)).shape == (2, 10)


def test_training_and_accuracy_refuse_empty_or_zero_sized_input():
    model = DigitsCNN()
    with pytest.raises(ValueError, match="batch_size must be at least 1, not 0"):
        train_digits(model, batch_size=0, progress=False)
    with pytest.raises(TypeError, match="epochs must be a whole number"):
        train_digits(model, epochs=1.5, progress=False)
    empty = digits()._replace(x_train=torch.zeros(0, 1, 8, 8), y_train=torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="no training images"):
        train_digits(model, data=empty, progress=False)
    with pytest.raises(ValueError, match="got 0 images, 0 labels"):
        accuracy(model, torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="got 3 images, 2 labels"):
        accuracy(model, torch.zeros(3, 1, 8, 8), torch.zeros(2, dtype=torch.long))

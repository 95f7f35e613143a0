"""hooklab.backprop.verify with bad input: every refusal comes before anything runs, and says what to do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hooklab.audit import leftover_hooks
from hooklab.backprop import UnsupportedLayerError, compare, verify
from hooklab.models import DigitsCNN


class Counting(nn.Sequential):
    """A Sequential that counts its forward calls: a refusal must come before the first one."""

    calls = 0

    def forward(self, x):
        Counting.calls += 1
        return super().forward(x)


def model(*layers):
    Counting.calls = 0
    return Counting(*layers) if layers else Counting(nn.Linear(4, 3))


LABELS = torch.tensor([0, 1])


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"loss": "mse"}, ValueError, r"loss='mse' needs target=\.\.\."),
    ({"loss": "cross_entropy"}, ValueError, r"loss='cross_entropy' needs target=\.\.\. \(class indices"),
    ({"target": LABELS}, ValueError, "target is only used by a loss"),
    ({"loss": "cross_entropy", "target": LABELS, "grad": torch.ones(2, 3)}, ValueError, "pass grad or loss, not both"),
    ({"seed": None}, TypeError, "seed must be an int"),
    ({"x": torch.tensor([[1.0, float("nan"), 0.0, 0.0]] * 2)}, ValueError, "x contains NaN or inf"),
    ({"grad": torch.full((2, 3), float("inf"))}, ValueError, "grad contains NaN or inf"),
    ({"x": torch.ones(2, 4, dtype=torch.long)}, TypeError, "x must be a floating-point tensor"),
    ({"x": torch.ones(2, 4, dtype=torch.float64)}, TypeError, r"x is torch.float64 but the model's parameters"),
    ({"x": [[1.0] * 4]}, TypeError, "x must be a tensor"),
])
def test_bad_arguments_are_refused_before_the_model_runs(kwargs, error, message):
    net = model()
    x = kwargs.pop("x", torch.randn(2, 4))
    with pytest.raises(error, match=message):
        verify(net, x, **kwargs)
    assert Counting.calls == 0


def test_unsupported_settings_are_refused_before_the_model_runs():
    net = model(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2, return_indices=True))
    with pytest.raises(UnsupportedLayerError, match=r"layer '1' \(MaxPool2d\): return_indices=True"):
        verify(net, torch.randn(1, 1, 6, 6))
    assert Counting.calls == 0
    net = model(nn.Conv2d(1, 1, 3, padding_mode="circular", padding=1), nn.AvgPool2d(2, ceil_mode=True))
    with pytest.raises(UnsupportedLayerError, match=r"padding_mode='circular'; layer '1' .*ceil_mode=True"):
        verify(net, torch.randn(1, 1, 6, 6))
    assert Counting.calls == 0


def test_shapes_that_only_the_output_shows_are_named():
    with pytest.raises(ValueError, match=r"grad has shape \(2,\) but the model's output has shape \(2, 3\)"):
        verify(model(), torch.randn(2, 4), grad=torch.ones(2))
    with pytest.raises(ValueError, match=r"target has shape \(2,\) .* loss='mse' compares them element by element"):
        verify(model(), torch.randn(2, 4), loss="mse", target=torch.ones(2))
    assert leftover_hooks() == []


def test_batch_norm_with_one_value_per_channel_says_why():
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Dropout(0.5))
    with pytest.raises(ValueError, match="batch norm in training mode needs more than one value per channel"):
        verify(net, torch.randn(1, 3))
    assert verify(net.eval(), torch.randn(1, 3)).ok  # what the message suggests works


def test_compare_refuses_mixed_dtypes_and_non_tensors():
    with pytest.raises(TypeError, match=r"a: manual dtype torch.float32 != reference torch.float64"):
        compare("a", torch.ones(2), torch.ones(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="b: reference must be a tensor"):
        compare("b", torch.ones(2), [1.0, 1.0])


def test_valid_calls_still_verify():
    assert verify(DigitsCNN(), torch.rand(2, 1, 8, 8), loss="cross_entropy", target=LABELS).ok
    assert verify(model(), torch.randn(2, 4), grad=torch.randn(2, 3)).ok

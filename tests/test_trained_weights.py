"""The trained digits CNNs that ship with hooklab, and the script that wrote them."""

from __future__ import annotations

import pytest
import torch
from train_digits import train  # tools/

from hooklab.data import digits
from hooklab.models import HEADS, accuracy, trained_digits_cnn, weights_path


@pytest.fixture(scope="module")
def data():
    return digits()


@pytest.mark.parametrize("head", HEADS)
def test_shipped_weights_load_into_an_eval_model_that_has_learned(head, data):
    model = trained_digits_cnn(head)
    assert not model.training
    assert accuracy(model, data.x_test, data.y_test) > 0.95


@pytest.mark.parametrize("head", HEADS)
def test_the_training_script_still_trains_as_well_as_what_ships(head, data):
    """Retraining on this machine need not give the same bits (another CPU adds up in another
    order), but it must give a network as good: within 1.5 points of the shipped one."""
    shipped = accuracy(trained_digits_cnn(head), data.x_test, data.y_test)
    retrained = train(head)
    assert abs(accuracy(retrained, data.x_test, data.y_test) - shipped) <= 0.015
    assert {k: v.shape for k, v in retrained.state_dict().items()} == {
        k: v.shape for k, v in torch.load(weights_path(head), weights_only=True).items()
    }


def test_an_unknown_head_is_named():
    with pytest.raises(ValueError, match="head must be 'gap' or 'flatten', not 'max'"):
        trained_digits_cnn("max")

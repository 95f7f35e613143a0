"""hooklab.order: the firing-order tracer of the field guide G6."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

from hooklab.audit import leftover_hooks
from hooklab.layers import UnknownLayerError
from hooklab.order import KINDS, Firing, format_order, plot_order, trace_firing_order


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.act = nn.Tanh()

    def forward(self, x):
        return self.act(self.fc(x))


def _trace(**kwargs):
    model = TwoLayers()
    x = torch.randn(4, 3, requires_grad=True)
    return model, trace_firing_order(model, x, **kwargs)


def _position(firings, kind, where):
    steps = [f.step for f in firings if f.kind == kind and f.where == where]
    assert len(steps) == 1, f"{kind} at {where}: {steps}"
    return steps[0]


def test_every_kind_fires_and_steps_count_up():
    model, firings = _trace()
    assert {f.kind for f in firings} == set(KINDS)
    assert [f.step for f in firings] == list(range(1, len(firings) + 1))
    assert leftover_hooks(model) == []


def test_forward_order_follows_module_call_impl():
    _, firings = _trace()
    for layer in ("fc", "act"):
        order = [
            _position(firings, k, layer)
            for k in (
                "global forward pre-hook",
                "forward pre-hook (prepend)",
                "forward pre-hook",
                "global forward hook",
                "forward hook",
            )
        ]
        assert order == sorted(order), layer
    # the whole of fc's forward comes before act's
    assert _position(firings, "forward hook", "fc") < _position(firings, "global forward pre-hook", "act")
    assert all(f.phase == "forward" for f in firings if "forward" in f.kind)


def test_backward_runs_layers_in_reverse_and_pre_hooks_first():
    _, firings = _trace()
    for layer in ("fc", "act"):
        assert _position(firings, "global backward pre-hook", layer) < _position(firings, "backward pre-hook", layer)
        assert _position(firings, "backward pre-hook", layer) < _position(firings, "global backward hook", layer)
        assert _position(firings, "global backward hook", layer) < _position(firings, "backward hook", layer)
        assert _position(firings, "Node pre-hook", layer) < _position(firings, "Node hook", layer)
    assert _position(firings, "backward hook", "act") < _position(firings, "backward pre-hook", "fc")
    for p in ("fc.weight", "fc.bias"):
        assert _position(firings, "tensor hook on parameter", p) < _position(firings, "post-accumulate-grad hook", p)
    last_param_grad = max(_position(firings, "tensor hook on parameter", p) for p in ("fc.weight", "fc.bias"))
    assert _position(firings, "multi-grad hook", "all parameters") > last_param_grad


def test_layers_are_chosen_by_name_and_grads_are_restored():
    model = TwoLayers()
    model.fc.weight.grad = torch.full_like(model.fc.weight, 7.0)
    x = torch.randn(2, 3, requires_grad=True)
    firings = trace_firing_order(model, x, layers=["act"], loss=lambda out: out.pow(2).sum())
    assert {f.where for f in firings} == {"act"}
    assert torch.equal(model.fc.weight.grad, torch.full_like(model.fc.weight, 7.0))
    assert model.fc.bias.grad is None
    assert leftover_hooks(model) == []


def test_unknown_layer_lists_close_matches():
    with pytest.raises(UnknownLayerError, match="'fc'"):
        trace_firing_order(TwoLayers(), torch.randn(1, 3), layers=["fc1"])


def test_hooks_are_removed_when_the_pass_raises():
    model = TwoLayers()
    with pytest.raises(RuntimeError):
        trace_firing_order(model, torch.randn(1, 5))  # wrong width: the forward pass raises
    assert leftover_hooks(model) == []


def test_format_and_plot():
    _, firings = _trace()
    text = format_order(firings)
    lines = text.splitlines()
    assert len(lines) == len(firings)
    assert lines[0].split()[:2] == ["1", "forward"]
    fig, ax = plt.subplots()
    assert plot_order(firings, ax=ax) is fig
    assert len(ax.get_yticklabels()) == len(KINDS)
    plt.close(fig)
    fig = plot_order([Firing(1, "forward", "forward hook", "fc")])
    assert len(fig.axes) == 1
    plt.close(fig)
    with pytest.raises(ValueError, match="no firings"):
        plot_order([])

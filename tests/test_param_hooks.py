"""hooklab.param_hooks: hooks on parameters that replace, observe and clean up after themselves."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hooklab.audit import leftover_hooks
from hooklab.param_hooks import UnknownParameterError, grad_stats, param_hooks, select_parameters


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def reference_grads(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(x).pow(2).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return grads


def test_returning_a_tensor_replaces_the_gradient_only_of_chosen_parameters():
    model, x = mlp(), torch.randn(5, 3)
    expected = reference_grads(model, x)
    with param_hooks(model, lambda name, g: torch.zeros_like(g), params="2.bias") as hooks:
        model(x).pow(2).sum().backward()
    assert hooks.names == ["2.bias"]
    assert torch.equal(model[2].bias.grad, torch.zeros(2))
    assert expected["2.bias"].abs().sum() > 0
    for name, p in model.named_parameters():
        if name != "2.bias":
            torch.testing.assert_close(p.grad, expected[name])
    assert leftover_hooks(model) == []


def test_returning_none_observes_and_names_are_not_late_bound():
    model, x = mlp(), torch.randn(5, 3)
    seen = {}
    with param_hooks(model, lambda name, g: seen.__setitem__(name, g.clone())):
        model(x).pow(2).sum().backward()
    assert sorted(seen) == sorted(n for n, _ in model.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(seen[name], p.grad)


def test_module_names_select_all_their_parameters():
    model = mlp()
    assert list(select_parameters(model, "0")) == ["0.weight", "0.bias"]
    assert list(select_parameters(model, ["2.weight", "0"])) == ["2.weight", "0.weight", "0.bias"]
    assert len(select_parameters(model)) == 4


def test_unknown_and_frozen_names_give_clear_errors():
    model = mlp()
    with pytest.raises(UnknownParameterError, match=r"close matches: '2\.bias'"):
        param_hooks(model, print, params="2.bais")
    model[0].bias.requires_grad_(False)
    with pytest.raises(ValueError, match=r"0\.bias"):
        param_hooks(model, print, params="0")
    assert "0.bias" not in select_parameters(model)


def test_unknown_names_are_matched_against_module_names_too():
    class AutoEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.decoder = nn.Linear(3, 2), nn.Linear(2, 3)

    model = AutoEncoder()
    with pytest.raises(UnknownParameterError, match=r"named 'encodr'; close matches: 'encoder',"):
        param_hooks(model, print, params="encodr")
    with pytest.raises(UnknownParameterError, match=r"its parameters and modules are 'encoder\.weight', "):
        param_hooks(model, print, params="zzz")


def test_hooks_are_removed_when_the_block_raises():
    model = mlp()
    with pytest.raises(ZeroDivisionError), param_hooks(model, lambda n, g: None):
        assert len(leftover_hooks(model)) == 4
        1 / 0  # noqa: B018
    assert leftover_hooks(model) == []


def test_register_twice_is_refused_and_remove_twice_is_safe():
    model = mlp()
    hooks = param_hooks(model, lambda n, g: None).register()
    try:
        with pytest.raises(RuntimeError, match="already registered"):
            hooks.register()
    finally:
        hooks.remove()
        hooks.remove()
    assert leftover_hooks(model) == []


def test_accumulated_hooks_see_the_updated_grad_and_can_step_in_backward():
    model, x = mlp(), torch.randn(5, 3)
    lr = 0.1
    grads = reference_grads(model, x)
    expected = {n: p.detach() - lr * grads[n] for n, p in model.named_parameters()}

    def sgd(name, p):
        with torch.no_grad():
            p.add_(p.grad, alpha=-lr)
        p.grad = None

    with param_hooks(model, sgd, when="accumulated"):
        model(x).pow(2).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name])
        assert p.grad is None
    with pytest.raises(ValueError, match="when must be"):
        param_hooks(model, sgd, when="after")


def test_grad_stats_rows_match_the_gradients_in_arrival_order():
    model, x = mlp(), torch.randn(5, 3)
    with grad_stats(model) as stats:
        for _ in range(2):
            model(x).pow(2).sum().backward()
    assert len(stats.rows) == 8
    assert [r.name for r in stats.rows[:4]] == ["2.bias", "2.weight", "0.bias", "0.weight"]
    assert [r.call for r in stats.rows] == [0, 0, 0, 0, 1, 1, 1, 1]
    one = reference_grads(model, x)
    for row in stats.rows:
        assert row.values["mean"] == pytest.approx(one[row.name].mean().item(), rel=1e-6)
        assert row.values["norm"] == pytest.approx(one[row.name].norm().item(), rel=1e-6)
    text = stats.table(stats.rows[:1])
    assert text.splitlines()[0].split() == ["parameter", "mean", "norm"]
    assert text.splitlines()[1].startswith("2.bias")
    stats.clear()
    assert stats.rows == []
    assert leftover_hooks(model) == []


def test_grad_stats_takes_custom_statistics():
    model, x = mlp(), torch.randn(5, 3)
    with grad_stats(model, params="2", stats={"max": lambda g: g.abs().max()}) as stats:
        model(x).pow(2).sum().backward()
    assert [r.name for r in stats.rows] == ["2.bias", "2.weight"]
    assert stats.rows[0].values["max"] == pytest.approx(model[2].bias.grad.abs().max().item())

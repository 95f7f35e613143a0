"""hooklab.stats: per-step summaries that match direct computation, flat memory, owned hooks."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from hooklab.audit import leftover_hooks
from hooklab.layers import UnknownLayerError
from hooklab.stats import _num, plot_colorful_dimension, plot_mean_std, track_stats


def small_net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


def train_steps(model, n, x=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(n):
        batch = torch.randn(8, 4) if x is None else x
        loss = model(batch).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_activation_row_matches_direct_computation():
    model = small_net()
    x = torch.randn(5, 4)
    with track_stats(model, ["1"], bins=10, act_range=(0.0, 2.0)) as stats:
        out = model(x)
    relu = torch.relu(model[0](x)).detach()
    row = stats["1"]
    assert list(row.steps) == [1]
    mean, std, zero, dead = row.values[0]
    assert mean == pytest.approx(relu.mean().item())
    assert std == pytest.approx(relu.std().item())
    assert zero == pytest.approx((relu == 0).float().mean().item())
    assert dead == pytest.approx((relu == 0).all(dim=0).float().mean().item())
    expected_hist = torch.histc(relu.abs().clamp(0, 2), bins=10, min=0, max=2)
    assert torch.equal(row.hists[0], expected_hist)
    assert row.hists[0].sum().item() == relu.numel()
    assert out.shape == (5, 3)


def test_dead_units_of_conv_are_channels():
    conv = nn.Conv2d(1, 3, 1)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, 0.0, -1.0]).view(3, 1, 1, 1))
        conv.bias.zero_()
    model = nn.Sequential(conv, nn.ReLU())
    x = torch.rand(2, 1, 4, 4) + 0.1  # positive: channel 1 is all zero, channel 2 negative -> 0
    with track_stats(model, ["1"]) as stats:
        model(x)
    assert stats["1"].column("dead").item() == pytest.approx(2 / 3)


def test_gradients_are_grad_output_even_when_next_module_is_in_place():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Linear(6, 3))
    x = torch.randn(8, 4)
    with track_stats(model, ["0", "2"], grads=True) as stats:
        out = model(x)
        out.pow(2).sum().backward()
    # reference: gradient w.r.t. the Linear's output, computed separately without in-place ops
    h = model[0](x)
    h.retain_grad()
    model[2](torch.relu(h)).pow(2).sum().backward()
    g = stats.gradients["0"]
    assert list(g.steps) == [1]
    assert g.values[0][0] == pytest.approx(h.grad.mean().item(), abs=1e-7)
    assert g.values[0][1] == pytest.approx(h.grad.std().item(), rel=1e-5)
    assert g.hists[0].sum().item() == h.grad.numel()


def test_steps_count_model_calls_and_skip_eval():
    model = small_net()
    with track_stats(model, grads=True) as stats:
        train_steps(model, 3)
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 4))
        model.train()
        train_steps(model, 2)
    assert stats.step == 5
    for name in ("0", "1", "2"):
        assert list(stats[name].steps) == [1, 2, 3, 4, 5]
        assert list(stats.gradients[name].steps) == [1, 2, 3, 4, 5]


def test_keep_last_bounds_rows_and_tensor_handles_do_not_pile_up():
    model = small_net()
    with track_stats(model, grads=True, keep_last=7) as stats:
        train_steps(model, 60)
        # pruned at each step: only this step's and (its graph still alive in `loss`) the last one's
        assert len(stats._grad_hooks) <= 6
    assert len(stats["0"]) == 7 and list(stats["0"].steps) == list(range(54, 61))
    assert stats["0"].hist_image().shape == (40, 7)
    # what is stored is summaries: no tensor larger than one histogram
    assert all(h.numel() == 40 for h in stats.gradients["2"].hists)


def test_hooks_removed_on_exit_and_on_error():
    model = small_net()
    with pytest.raises(ZeroDivisionError):
        with track_stats(model, grads=True):
            model(torch.randn(2, 4)).sum().backward()
            raise ZeroDivisionError("the training loop failed")
    assert leftover_hooks(model) == []


def test_bad_input_gets_clear_errors():
    model = small_net()
    with pytest.raises(UnknownLayerError, match="close matches"):
        track_stats(model, ["00"])
    with pytest.raises(ValueError, match="act_range"):
        track_stats(model, act_range=(1.0, 1.0))
    with track_stats(model, ["0"]) as stats:
        model(torch.randn(2, 4))
    with pytest.raises(KeyError, match="not chosen"):
        stats["2"]
    with pytest.raises(ValueError, match="grads=True"):
        stats.summary("gradient")
    with pytest.raises(KeyError, match="unknown statistic"):
        stats["0"].column("median")


def test_summary_and_plots():
    model = small_net()
    with track_stats(model, grads=True) as stats:
        train_steps(model, 4)
    text = stats.summary()
    assert text.splitlines()[0].startswith("layer") and len(text.splitlines()) == 4
    assert "1" in stats.summary("gradient")
    fig = plot_mean_std(stats, "gradient")
    assert len(fig.axes) == 2 and fig.axes[1].get_yscale() == "log"
    (ax,) = plot_mean_std(stats, columns=("dead",)).axes  # any statistic, one panel each
    names = list(stats.activations)
    assert [line.get_label() for line in ax.get_lines()] == names
    for line, name in zip(ax.get_lines(), names, strict=True):
        assert line.get_ydata().tolist() == stats[name].column("dead").tolist()
    fig2 = plot_colorful_dimension(stats["1"])
    assert fig2.axes[0].get_images()[0].get_array().shape == (40, 4)


def test_gradient_histogram_puts_zeros_in_first_bin():
    model = nn.Sequential(nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight.zero_()
    x = torch.randn(3, 2, requires_grad=True)
    with track_stats(model, grads=True, bins=4, grad_range=(-4.0, 0.0)) as stats:
        out = model(x)
        out.backward(torch.tensor([[0.0, 0.5]] * 3))
    hist = stats.gradients["0"].hists[0]
    assert hist.tolist() == [3.0, 0.0, 0.0, 3.0]  # three zeros, three 0.5 (log10 = -0.30)


def test_a_mean_that_cancels_exactly_prints_as_about_zero():
    """The gradient at a cross-entropy's logits sums to zero over the classes, so its mean is
    rounding noise; a mean that is merely small is printed as a number."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5))
    with track_stats(model, grads=True) as stats:
        nn.functional.cross_entropy(model(torch.randn(16, 4)), torch.randint(0, 5, (16,))).backward()
    logits = stats.gradients["2"]
    mean, std = logits.column("mean")[0], logits.column("std")[0]
    assert abs(mean) < 1e-6 * std  # the premise: exact cancellation up to rounding
    lines = {line.split()[0]: line for line in stats.summary("gradient").splitlines()[1:]}
    assert re.search(r"≈0 → +≈0", lines["2"])
    assert "≈0" not in lines["0"]
    first_layer = stats.gradients["0"].column("mean")[0]
    assert f"{_num(first_layer)} →" in lines["0"]  # small, but not cancelling: printed


"""hooklab.stats with bad input: clear errors before any hook or figure, reasons for empty rows."""

from __future__ import annotations

import warnings

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

from hooklab.audit import leftover_hooks
from hooklab.stats import plot_colorful_dimension, plot_mean_std, track_stats


def small_net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


def test_entering_the_same_tracker_twice_raises_and_keeps_the_counts():
    model = small_net()
    x = torch.randn(2, 4)
    stats = track_stats(model)
    with stats:
        model(x)
        with pytest.raises(RuntimeError, match="already inside a with block"), stats:
            pass
        model(x)
    assert list(stats["0"].steps) == [1, 2]
    assert leftover_hooks(model) == []


def test_nan_activations_are_counted_not_binned_as_zeros():
    model = nn.Sequential(nn.Identity())
    x = torch.tensor([[0.5, float("nan"), float("inf"), 0.0]])
    with track_stats(model, bins=4, act_range=(0.0, 1.0)) as stats:
        model(x)
        model(torch.ones(1, 4))
    row = stats["0"]
    assert row.column("nonfinite").tolist() == [0.5, 0.0]
    assert row.hists[0].tolist() == [1.0, 0.0, 1.0, 0.0]  # 0.0 and 0.5 only
    assert row.column("zero")[0].item() == 0.25
    assert "NaN/inf in 1 row" in stats.summary()


def test_nan_gradients_are_counted_and_zeros_stay_in_the_first_bin():
    model = nn.Sequential(nn.Linear(2, 2))
    x = torch.randn(1, 2, requires_grad=True)
    with track_stats(model, grads=True, bins=2, grad_range=(-2.0, 0.0)) as stats:
        model(x).backward(torch.tensor([[0.0, float("nan")]]))
    g = stats.gradients["0"]
    assert g.column("nonfinite").tolist() == [0.5] and g.hists[0].tolist() == [1.0, 0.0]


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"bins": 2.5}, TypeError, "bins must be a whole number"),
    ({"bins": 0}, ValueError, "bins must be at least 1"),
    ({"keep_last": 0}, ValueError, "keep_last must be at least 1"),
    ({"keep_last": -1}, ValueError, "keep_last must be at least 1"),
    ({"keep_last": 2.0}, TypeError, "keep_last must be a whole number"),
    ({"act_range": (0, 1, 2)}, TypeError, "act_range must be two numbers"),
    ({"grad_range": 5}, TypeError, "grad_range must be two numbers"),
    ({"act_range": (1.0, 0.0)}, ValueError, "low < high"),
    ({"types": nn.LSTM}, ValueError, "matches no module"),
    ({"layers": ["0"], "types": nn.ReLU}, ValueError, "'0' is a Linear"),
])
def test_bad_settings_raise_before_any_hook(kwargs, error, message):
    model = small_net()
    with pytest.raises(error, match=message):
        track_stats(model, **kwargs)
    assert leftover_hooks(model) == []


def test_eval_mode_calls_are_explained():
    model = small_net().eval()
    with track_stats(model) as stats:
        model(torch.randn(2, 4))
    text = stats.summary()
    assert "(no activation seen)" in text
    assert "no activation seen in any layer: the model ran once, in eval mode" in text
    assert "only_training=False" in text


def test_gradients_without_grads_true_say_how_to_get_them():
    model = small_net()
    with track_stats(model) as stats:
        model(torch.randn(2, 4))
    with pytest.raises(KeyError, match=r"track_stats\(..., grads=True\) records gradients"):
        stats.gradients["0"]
    with pytest.raises(KeyError, match="not chosen"):
        track_stats(model, ["0"], grads=True).gradients["2"]


def test_missing_gradients_give_the_reason():
    model = small_net()
    model.requires_grad_(False)
    with track_stats(model, grads=True) as stats:
        model(torch.randn(2, 4)).sum()
    assert "no parameter or input before it requires grad" in stats.summary("gradient")
    model.requires_grad_(True)
    with track_stats(model, grads=True) as stats:
        model(torch.randn(2, 4)).sum()  # no backward()
    assert "call backward() inside the with block" in stats.summary("gradient")


def tracked(grads=False):
    model = small_net()
    with track_stats(model, grads=grads) as stats:
        model(torch.randn(3, 4)).sum().backward()
    return stats


def test_plot_mean_std_accepts_one_name_and_one_axes():
    stats = tracked()
    fig = plot_mean_std(stats, columns="mean")
    assert [ax.get_title() for ax in fig.axes] == ["activation mean per layer"]
    fig, ax = plt.subplots()
    assert plot_mean_std(stats, axes=ax, columns="dead") is fig


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"columns": ("median",)}, ValueError, "unknown statistic 'median' in columns"),
    ({"columns": ()}, ValueError, "no statistic given"),
    ({"columns": 3}, TypeError, "columns is a tuple of statistic names"),
    ({"kind": "weights"}, ValueError, "kind must be"),
])
def test_plot_mean_std_bad_arguments_open_no_figure(kwargs, error, message):
    with pytest.raises(error, match=message):
        plot_mean_std(tracked(), **kwargs)
    assert not plt.get_fignums()


def test_plot_mean_std_wrong_axes_count():
    stats = tracked()
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="got 1 Axes for 2 statistics"):
        plot_mean_std(stats, axes=ax)
    with pytest.raises(ValueError, match="got 1 Axes for 2 statistics"):
        plot_mean_std(stats, axes=[ax])
    with pytest.raises(TypeError, match="axes must be matplotlib Axes"):
        plot_mean_std(stats, axes=[fig], columns="mean")
    assert plt.get_fignums() == [fig.number] and not ax.lines
    plt.close(fig)


def test_all_zero_gradients_draw_without_a_log_scale_warning():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.fill_(-1.0)
    with track_stats(model, ["1"], grads=True) as stats:
        model(torch.randn(3, 2, requires_grad=True)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plot_mean_std(stats, "gradient")
    assert fig.axes[1].get_yscale() == "linear"
    plt.close(fig)


def test_plot_colorful_dimension_wants_one_layer():
    stats = tracked()
    with pytest.raises(TypeError, match=r"one layer's statistics such as stats\['features.1'\]"):
        plot_colorful_dimension(stats)
    with pytest.raises(TypeError, match="the tracker of track_stats"):
        plot_mean_std(stats["0"])
    assert not plt.get_fignums()

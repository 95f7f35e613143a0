"""hooklab.plots with bad input: NaN shown as NaN, shapes and counts refused before a figure opens."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from hooklab.plots import draw_signed, feature_grid, tile_channels

NAN = float("nan")


@pytest.mark.parametrize("signed", [False, True])
def test_non_finite_values_stay_blank_and_do_not_set_the_scale(signed):
    maps = torch.stack([torch.full((2, 2), NAN), torch.tensor([[NAN, 0.0], [float("inf"), 2.0]])])
    grid = tile_channels(maps, ncols=2, pad=1, signed=signed)
    assert np.isnan(grid[:, 0:2]).all()  # a NaN channel is a blank tile, not a constant one
    tile = grid[:, 3:5]
    assert np.isnan(tile[0, 0]) and np.isnan(tile[1, 0])
    expected = [0.5, 1.0] if signed else [0.0, 1.0]  # scaled by the finite values 0 and 2 only
    np.testing.assert_allclose([tile[0, 1], tile[1, 1]], expected)


def test_feature_grid_title_counts_channels_with_nan():
    maps = torch.rand(1, 3, 4, 4)
    maps[0, 1, 0, 0] = NAN
    fig = feature_grid(maps, title="conv")
    assert fig.axes[0].get_title() == "conv\n1 with NaN/inf values (blank pixels)"
    assert feature_grid(torch.rand(1, 3, 4, 4)).axes[0].get_title() == "3 of 3 channels, 4×4"


def test_draw_signed_scales_by_the_finite_values_and_greys_nan():
    fig = draw_signed(torch.tensor([[1.0, NAN], [-3.0, float("inf")]]))
    image = fig.axes[0].images[0]
    assert image.get_clim() == (-3.0, 3.0)
    assert image.get_cmap().get_bad()[:3] == pytest.approx((0.6, 0.6, 0.6))
    assert draw_signed(torch.full((2, 2), NAN)).axes[0].images[0].get_clim() == (-1.0, 1.0)


@pytest.mark.parametrize(("shape", "message"), [
    ((3, 4, 4), r"one \(H, W\) map, got shape \(3, 4, 4\)$"),
    ((1, 4, 4), r"got shape \(1, 4, 4\): pass values\[0\]"),
    ((4,), r"got shape \(4,\)"),
    ((1, 1, 4, 4), r"got shape \(1, 1, 4, 4\)"),
])
def test_draw_signed_wants_one_map(shape, message):
    with pytest.raises(ValueError, match=message):
        draw_signed(torch.rand(*shape))
    assert not plt.get_fignums()  # refused before a figure was made


def test_draw_signed_keywords_override_the_defaults():
    fig = draw_signed(torch.tensor([[-1.0, 2.0]]), vmin=0, cmap="gray")
    image = fig.axes[0].images[0]
    assert image.get_clim() == (0.0, 2.0) and image.get_cmap().name == "gray"
    plt.close("all")
    with pytest.raises(TypeError, match="expected an"):
        draw_signed([[1.0]])
    assert not plt.get_fignums()


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"pad": -1}, ValueError, "pad must be at least 0"),
    ({"pad": 1.0}, TypeError, "pad must be a whole number or None"),
    ({"channels": 2.0}, TypeError, "channels must be a whole number or None"),
    ({"channels": -3}, ValueError, r"channels must be at least 1 \(or None\)"),
    ({"channels": 0}, ValueError, "channels must be at least 1"),
    ({"ncols": 2.0}, TypeError, "ncols must be a whole number"),
    ({"ncols": True}, TypeError, "ncols must be a whole number"),
])
def test_tile_channels_counts_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        tile_channels(torch.rand(4, 3, 3), **kwargs)


def test_empty_maps_and_bad_samples_are_refused_before_a_figure():
    with pytest.raises(ValueError, match=r"the maps are empty \(0×0 pixels\)"):
        feature_grid(torch.rand(1, 4, 0, 0))
    with pytest.raises(ValueError, match="no channels"):
        feature_grid(torch.rand(1, 0, 3, 3))
    with pytest.raises(TypeError, match=r"sample must be an int, got 0.5 \(float\)"):
        feature_grid(torch.rand(2, 4, 3, 3), sample=0.5)
    with pytest.raises(IndexError, match=r"sample 2 is out of range for 2 items in the batch \(0\.\.1\)"):
        feature_grid(torch.rand(2, 4, 3, 3), sample=2)
    with pytest.raises(ValueError, match="channels must be at least 1"):
        feature_grid(torch.rand(1, 4, 3, 3), channels=-3)
    with pytest.raises(TypeError, match=r"expected a \(C, H, W\) tensor"):
        tile_channels(np.zeros((2, 3, 3)))
    assert not plt.get_fignums()

"""hooklab.plots: the feature-map grid tiles the right values into the right places."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from torch import nn

from hooklab import record
from hooklab.plots import feature_grid, tile_channels


def test_tiles_are_scaled_per_channel_and_placed_row_by_row():
    maps = torch.stack([torch.arange(6.0).reshape(2, 3) * (k + 1) - k for k in range(5)])  # (5, 2, 3)
    grid = tile_channels(maps, channels=None, ncols=2, pad=1)
    assert grid.shape == (3 * 2 + 2, 2 * 3 + 1)  # 3 rows of 2 tiles, 1-pixel gaps
    expected_tile = np.arange(6.0).reshape(2, 3) / 5.0  # every channel spans its own [min, max]
    for k in range(5):
        r, c = divmod(k, 2)
        np.testing.assert_allclose(grid[r * 3 : r * 3 + 2, c * 4 : c * 4 + 3], expected_tile)
    assert np.isnan(grid[2, :]).all() and np.isnan(grid[:, 3]).all()  # gaps
    assert np.isnan(grid[6:, 4:]).all()  # the unused sixth tile stays blank


def test_constant_channel_is_zero_and_channels_limit_counts():
    maps = torch.zeros(3, 2, 2)
    maps[1] = 7.0
    grid = tile_channels(maps, channels=2, ncols=8, pad=0)
    assert grid.shape == (2, 4)
    assert np.array_equal(grid, np.zeros((2, 4)))


def test_signed_tiles_put_zero_at_one_half():
    maps = torch.stack([torch.tensor([[-2.0, 0.0], [1.0, 4.0]]), torch.zeros(2, 2), torch.full((2, 2), -3.0)])
    grid = tile_channels(maps, ncols=3, pad=1, signed=True)
    np.testing.assert_allclose(grid[:, 0:2], [[0.25, 0.5], [0.625, 1.0]])  # divided by 4, then (v + 1) / 2
    np.testing.assert_allclose(grid[:, 3:5], 0.5)  # an all-zero map is 0.5, not NaN
    np.testing.assert_allclose(grid[:, 6:8], 0.0)  # a constant negative map: -1 everywhere
    assert np.isnan(grid[:, 2]).all() and np.isnan(grid[:, 5]).all()


def test_default_gap_grows_with_the_tile_size():
    assert tile_channels(torch.rand(2, 4, 4), ncols=2).shape == (4, 9)  # at least 1 pixel
    assert tile_channels(torch.rand(2, 32, 32), ncols=2).shape == (32, 66)  # 32 // 16 = 2 pixels


def test_feature_grid_accepts_a_record_and_draws_on_a_given_axes():
    conv = nn.Conv2d(1, 3, 3, padding=1)
    model = nn.Sequential(conv, nn.ReLU(inplace=True))
    x = torch.randn(2, 1, 5, 5)
    with record(model, types=nn.Conv2d) as rec:
        model(x)
    fig, (left, right) = plt.subplots(1, 2)
    returned = feature_grid(rec["0"], ax=right, sample=1, ncols=3)
    assert returned is fig
    assert not left.images and len(right.images) == 1
    drawn = right.images[0].get_array()
    with torch.no_grad():
        second = conv(x)[1]  # before the in-place ReLU: the record must have kept negatives
    assert (second < 0).any()
    np.testing.assert_allclose(drawn[:5, :5], tile_channels(second, ncols=3)[:5, :5])
    assert right.get_title() == "3 of 3 channels, 5×5"


def test_feature_grid_makes_its_own_figure_with_one_axes():
    fig = feature_grid(torch.rand(1, 64, 4, 4), title="early")
    assert len(fig.axes) == 1 and fig.axes[0].get_title() == "early"
    grid = fig.axes[0].images[0].get_array()
    assert grid.shape == (8 * 5 - 1, 8 * 5 - 1)
    assert math.isclose(np.nanmax(grid), 1.0) and math.isclose(np.nanmin(grid), 0.0)


def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="shape"):
        feature_grid(torch.zeros(4, 4))
    with pytest.raises(IndexError, match=r"sample 1 is out of range for 1 items in the batch \(0\.\.0\)"):
        feature_grid(torch.zeros(1, 2, 3, 3), sample=1)
    with pytest.raises(TypeError, match="Record"):
        feature_grid([[0.0]])
    with pytest.raises(ValueError, match="ncols"):
        tile_channels(torch.zeros(2, 3, 3), ncols=0)

"""The explorers of notebook 05, driven without a browser: render() and the widgets' sliders."""

from __future__ import annotations

import time

import matplotlib.pyplot as plt
import pytest
import torch
import torchvision

from hooklab.cam_widgets import GradCamPicker, draw_cam
from hooklab.layers import UnknownLayerError
from hooklab.models import DigitsCNN
from hooklab.plots import draw_signed
from hooklab.widgets import LayerExplorer, describe_tensor


@pytest.fixture(scope="module")
def model():
    return DigitsCNN(seed=2).eval()


@pytest.fixture(scope="module")
def x():
    return torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(4))


@pytest.fixture
def explorer(model, x):
    return LayerExplorer(model, x)


def test_layers_and_values_match_a_hand_split_forward_pass(explorer, model, x):
    # head.0 (global average pool) gives 1×1 maps and is left out
    assert explorer.layers == [f"features.{i}" for i in range(7)]
    x0 = x[:1].clone().requires_grad_(True)
    inner = model.features[:4](x0)  # output of features.3
    scores = model.head(model.features[4:](inner))
    target = int(scores.argmax())
    (grad,) = torch.autograd.grad(scores[0, target], inner)
    assert explorer.target == target
    assert torch.allclose(explorer.activations["features.3"], inner[0].detach())
    assert torch.allclose(explorer.gradients["features.3"], grad[0], atol=1e-7)
    assert all(p.grad is None for p in model.parameters())


def test_describe_names_shape_and_statistics(explorer):
    text = explorer.describe("features.5", 7)
    lines = text.splitlines()
    assert lines[0] == "features.5 (Conv2d) activation shape (64, 4, 4), channel 7 of 64"
    channel = explorer.activations["features.5"][7]
    assert lines[1] == f"  channel 7: mean {channel.mean().item():.4g}  std {channel.std().item():.4g}  " \
                       f"min {channel.min().item() + 0.0:.4g}  max {channel.max().item() + 0.0:.4g}  zero 0.0%"
    assert "gradient shape (32, 8, 8)" in explorer.describe("features.3", 0, "gradient")


def test_describe_tensor_counts_zeros():
    assert describe_tensor(torch.tensor([0.0, 0.0, 1.0, -1.0])).endswith("zero 50.0%")
    assert "min 0 " in describe_tensor(torch.tensor([-0.0, 2.0]))


def test_render_prints_and_returns_a_figure(explorer, capsys):
    fig = explorer.render("features.1", 2)
    assert capsys.readouterr().out.startswith("features.1 (ReLU) activation shape (16, 8, 8), channel 2 of 16")
    assert len(fig.axes) == 3  # channel, colour bar, tiles
    assert fig.axes[0].get_title() == "features.1\nactivation, channel 2"


def test_render_and_figure_share_one_drawing_and_close_it_when_drawing_fails(explorer, model, x, monkeypatch, capsys):
    picker = GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.6"])
    parts = picker.compute("features.6", 3, 0)
    calls = {
        "render": (lambda: explorer.render("features.1", 2), lambda: picker.render("features.6", 3, 0)),
        "figure": (lambda: explorer.figure("features.1", 2), lambda: picker.figure("features.6", 3, 0, parts)),
    }
    for kind, tracked in (("render", True), ("figure", False)):
        for call in calls[kind]:
            fig = call()
            assert (plt.get_fignums() == [fig.number]) if tracked else (plt.get_fignums() == [])
            plt.close(fig)

    def broken(*args):
        raise RuntimeError("drawing failed")

    for obj in (explorer, picker):
        monkeypatch.setattr(obj, "_draw", broken)
    for call in (*calls["render"], *calls["figure"]):
        with pytest.raises(RuntimeError, match="drawing failed"):
            call()
        assert plt.get_fignums() == []  # hooklab.checks.drawn closed the pyplot figure
    capsys.readouterr()


def test_tiles_and_frame(explorer):
    """Activation tiles span 0..1; gradient tiles put 0 at 0.5 (white in RdBu_r); the red frame
    sits on the chosen channel's tile, one pixel outside it."""
    fig = explorer.figure("features.3", 10, "gradient")
    tiles = fig.axes[1].images[0].get_array()
    grad = explorer.gradients["features.3"]
    row, col = divmod(10, 8)
    tile = tiles[row * 9 : row * 9 + 8, col * 9 : col * 9 + 8]
    expected = (grad[10] / grad[10].abs().max() + 1) / 2
    assert torch.allclose(torch.as_tensor(tile.filled(float("nan"))), expected.double())
    assert tiles.mask[8, :].all() and tiles.mask[:, 8].all()  # the gaps are masked (drawn grey)
    (frame,) = fig.axes[1].patches
    assert frame.get_xy() == (col * 9 - 1, row * 9 - 1) and frame.get_width() == 9
    act = explorer.figure("features.3", 10).axes[1].images[0].get_array()
    assert float(act.min()) == 0.0 and float(act.max()) == 1.0
    conv = torch.nn.Conv2d(1, 9, 3, padding=1)  # 56×56 maps, as in a ResNet: the frame still fits its tile
    big = LayerExplorer(conv, torch.rand(1, 1, 56, 56)).figure("", 8, "gradient").axes[1]
    assert big.patches[0].get_xy() == (-1, 56) and big.images[0].get_array().shape == (113, 455)


def test_bad_layer_channel_or_kind(explorer):
    with pytest.raises(LookupError, match=r"close matches: 'features\.3'"):
        explorer.describe("features.33")
    with pytest.raises(LookupError, match=r"its explorable layers are 'features\.0'"):
        explorer.describe("fc")  # DigitsCNN has no such layer, and nothing is close to it
    with pytest.raises(LookupError, match=r"close matches: 'features\.6'"):
        explorer.widget("features.60")  # before any slider is built
    with pytest.raises(IndexError, match=r"0\.\.15"):
        explorer.describe("features.1", 16)
    with pytest.raises(ValueError, match="kind"):
        explorer.describe("features.1", 0, "weights")


def test_render_is_fast_and_runs_no_forward_pass(explorer, model):
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        times = []
        for layer in explorer.layers:
            start = time.perf_counter()
            plt.close(explorer.figure(layer, 1))
            times.append(time.perf_counter() - start)
    finally:
        handle.remove()
    assert calls == []
    assert sorted(times)[len(times) // 2] < 0.2, times  # median; typically ~20 ms


def test_moving_the_sliders_updates_name_shape_statistics_and_image(explorer):
    panel = explorer.widget()
    assert panel.layer.description == "layer" and panel.channel.description == "channel"
    assert panel.text.startswith("features.0 (Conv2d) activation shape (16, 8, 8), channel 0 of 16")
    assert panel.channel.max == 15
    first_png = panel.png

    panel.layer.value = "features.5"
    assert panel.text.startswith("features.5 (Conv2d) activation shape (64, 4, 4), channel 0 of 64")
    assert panel.channel.max == 63
    assert panel.png != first_png
    assert panel.redraws == 2

    second_png = panel.png
    panel.channel.value = 40
    assert "channel 40 of 64" in panel.text and "channel 40: mean" in panel.text
    assert panel.png != second_png

    panel.layer.value = "features.1"  # fewer channels: the channel slider is clamped, one redraw
    assert panel.channel.max == 15 and panel.channel.value == 15
    assert panel.text.startswith("features.1 (ReLU) activation shape (16, 8, 8), channel 15 of 16")
    assert panel.redraws == 4

    panel.kind.value = "gradient"
    assert panel.text.startswith("features.1 (ReLU) gradient shape (16, 8, 8), channel 15 of 16")
    assert panel.text == explorer.describe("features.1", 15, "gradient") + "\n"


def test_resnet_explorer_labels_second_calls_and_leaves_no_hooks():
    resnet = torchvision.models.resnet18(weights=None).eval()
    explorer = LayerExplorer(resnet, torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    assert "layer1.0.relu" in explorer.layers and "layer1.0.relu (call 1)" in explorer.layers
    first, second = explorer.activations["layer1.0.relu"], explorer.activations["layer1.0.relu (call 1)"]
    assert first.shape == second.shape == (64, 16, 16)
    assert not torch.equal(first, second)
    panel = explorer.widget("layer2.0.conv1")
    assert panel.text.startswith("layer2.0.conv1 (Conv2d) activation shape (128, 8, 8)")
    # the conftest fixture checks that no hook is left on resnet


def test_grad_cam_picker_widget(model, x):
    picker = GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.3", "features.6"])
    panel = picker.widget()
    assert panel.layer.value == "features.6"
    assert panel.text.startswith(f"image 0: label 1, predicted {int(picker.predicted[0])}")
    before = panel.png
    panel.target.value = (panel.target.value + 1) % 10
    assert f"class {panel.target.value} " in panel.text and panel.png != before
    panel.layer.value = "features.3"
    assert "explained at features.3" in panel.text and "Grad-CAM (8, 8)" in panel.text
    panel.index.value = 2
    assert panel.text.startswith("image 2: label 3")
    with pytest.raises(ValueError, match=r"\(N, 1, H, W\)"):
        GradCamPicker(model, x[:, 0], torch.tensor([1, 2, 3]), ["features.3"])
    with pytest.raises(UnknownLayerError, match=r"close matches: 'features\.6'"):
        GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.3", "features.66"])
    with pytest.raises(ValueError, match="non-empty list"):
        GradCamPicker(model, x, torch.tensor([1, 2, 3]), "features.3")


def test_draw_cam_titles_the_maximum_and_outlines_the_image(x):
    fig, ax = plt.subplots()
    cam = torch.zeros(4, 4)
    cam[1, 3] = 0.25
    assert draw_cam(x[0, 0], cam, "class 3", ax=ax) is fig
    assert ax.get_title() == "class 3\nmax 0.25"
    shown = ax.images[0]
    assert shown.get_clim() == (0.0, 0.25) and shown.get_array().shape == (4, 4)
    assert shown.get_extent() == [-0.5, 7.5, 7.5, -0.5]  # 4×4 blocks over the 8×8 image's pixels
    assert len(ax.collections) == 1  # the outline of the image
    draw_cam(x[0, 0], torch.zeros(8, 8), ax=ax)  # an all-zero map: a valid colour range
    assert ax.images[1].get_clim() == (0.0, 1.0)
    plt.close(fig)


def test_draw_cam_and_draw_signed_make_their_own_figure_without_ax(x):
    fig = draw_cam(x[0, 0], torch.ones(4, 4))
    assert len(fig.axes) == 1 and fig.axes[0].get_title() == ""
    plt.close(fig)
    fig = draw_signed(torch.tensor([[-2.0, 1.0], [0.0, 0.5]]))
    shown = fig.axes[0].images[0]
    assert shown.get_clim() == (-2.0, 2.0) and shown.get_cmap().name == "RdBu_r"  # zero in the middle: white
    plt.close(fig)
    fig = draw_signed(torch.zeros(2, 2))  # all zero: a valid colour range
    assert fig.axes[0].images[0].get_clim() == (-1.0, 1.0)
    plt.close(fig)

"""The explorers of notebook 05, driven without a browser: their plain functions, pictures and controls."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from scipy import ndimage
from torch import nn

from hooklab import picture
from hooklab.cam_widgets import GradCamPicker, _rank_correlation, draw_cam
from hooklab.data import photo, to_display
from hooklab.layers import UnknownLayerError
from hooklab.models import DigitsCNN
from hooklab.plots import draw_signed, tile_channels
from hooklab.recording import record
from hooklab.saliency import GuidedBackprop, grad_cam, guided_grad_cam
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
        "figure": (lambda: explorer.figure("features.1", 2), lambda: picker.figure(parts)),
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


def forward_passes(model):
    """Count the model's forward passes while the block runs (the hook is removed afterwards)."""
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    return calls, handle


def test_redraws_run_no_forward_pass_and_a_new_image_or_class_runs_one(model):
    explorer = LayerExplorer(model, torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(4)))
    calls, handle = forward_passes(model)
    try:
        for layer in explorer.layers:
            plt.close(explorer.figure(layer, 1))
            explorer.picture(layer, 1, "gradient")
            explorer.summary(layer, 1)
        assert calls == []
        explorer.picture("features.3", 0, index=2)
        explorer.picture("features.5", 9, index=2)  # the same image and class: the pass is kept
        assert len(calls) == 1
        explorer.summary("features.3", 0, index=2, target=4)
        assert len(calls) == 2
    finally:
        handle.remove()


def decode(pic) -> np.ndarray:
    """A picture's PNG as an array of palette indices (what was drawn, colour by colour)."""
    image = Image.open(io.BytesIO(pic.png))
    assert image.mode == "P" and image.size == pic.size
    return np.asarray(image)


class OneHot(nn.Module):
    """70 channels of 8×8; channel c is zero except one pixel, at position c % 64 (read row by
    row), times the input's mean: every channel's tile looks different, channel 5 is dead."""

    def forward(self, x):
        basis = torch.zeros(70, 64)
        basis[torch.arange(70), torch.arange(70) % 64] = 1.0
        basis[5] = 0.0
        return basis.view(1, 70, 8, 8) * x.mean()


class OneHotNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.spread, self.head = OneHot(), nn.Linear(70, 2)

    def forward(self, x):
        return self.head(self.spread(x).mean(dim=(2, 3)))


def test_picture_frames_the_chosen_channel_on_its_page_and_crosses_out_dead_ones():
    explorer = LayerExplorer(OneHotNet().eval(), torch.full((1, 1, 4, 4), 0.5))
    grid_left = 2 * 176 + 40  # the tiles start right of the two channel panels
    for channel, tiles_shown in ((9, 64), (66, 6)):  # page 0 (channels 0-63), page 1 (64-69)
        pixels = decode(explorer.picture("spread", channel))[:, grid_left:]
        rows, cols = (pixels == picture.RED).nonzero()
        inside = pixels[rows.min() + 2 : rows.max() - 1, cols.min() + 2 : cols.max() - 1]  # within the frame
        bright = (inside == picture.LEVELS - 1).nonzero()  # the channel's one pixel, at its top of viridis
        tile = inside.shape[0] / 8  # screen pixels per map pixel
        position = (channel % 64) // 8, channel % 8
        assert (round(bright[0].min() / tile), round(bright[1].min() / tile)) == position
        lit = ndimage.label(pixels == picture.LEVELS - 1)[1]  # one bright block per tile, but dead channel 5's
        assert lit == tiles_shown - (channel < 64)
    crossed = decode(explorer.picture("spread", 9))[:, grid_left:] == picture.LIGHT
    assert crossed.any() and not (decode(explorer.picture("spread", 66))[:, grid_left:] == picture.LIGHT).any()
    text = explorer.summary("spread", 66)
    assert "channel 66 of 70; tiles: activation, channels 64–69" in text
    assert "dead (zero everywhere for this image, crossed out): 1 of 70: 5" in text
    assert explorer.dead("spread") == [5]


def test_a_map_that_is_zero_everywhere_is_white_as_a_gradient_and_dark_as_an_activation():
    for signed, colour in ((True, picture.LEVELS + round((picture.LEVELS - 1) / 2)), (False, 0)):
        canvas = picture.Canvas(200, 260)
        LayerExplorer._channel_panel(canvas, 0, torch.zeros(4, 4), "zero", signed)
        assert np.asarray(canvas.image)[100, 80] == colour


def test_colours_and_tiles_match_the_matplotlib_versions():
    maps = torch.randn(10, 5, 6, generator=torch.Generator().manual_seed(0))
    maps[2, 1, 1] = float("nan")
    maps[3] = 0.0
    for signed in (False, True):
        grid, h, w = picture.tiles(maps, ncols=4, signed=signed)
        expected = tile_channels(maps, channels=None, ncols=4, pad=1, signed=signed)
        assert (h, w) == (5, 6) and grid.shape == expected.shape
        assert np.allclose(grid, expected, atol=1e-6, equal_nan=True)
    values = torch.tensor([[-1.0, 0.0, 1.0, float("nan")]])
    assert picture.colours(values, "viridis", 0.0, 1.0).tolist() == [[0, 0, picture.LEVELS - 1, picture.GREY]]
    assert picture.colours(values, "RdBu_r", -1.0, 1.0)[0, :3].tolist() == [
        picture.LEVELS, picture.LEVELS + round((picture.LEVELS - 1) / 2), 2 * picture.LEVELS - 1]
    with pytest.raises(ValueError, match="cmap must be one of viridis, RdBu_r"):
        picture.colours(values, "jet", 0.0, 1.0)
    big = torch.arange(4 * 70 * 70, dtype=torch.float32).view(4, 70, 70)
    grid, h, w = picture.tiles(big)
    assert (h, w) == (24, 24)  # averaged over 3×3 blocks: at most 32 pixels a side
    assert picture.shrink(torch.ones(100, 50), 40).shape == (34, 17)


def test_a_figure_becomes_a_palette_png_of_its_own_size(picker):
    parts = picker.compute("features.6", 3, 0)
    fig = picker.figure(parts)
    image = Image.open(io.BytesIO(picture.figure_png(fig)))
    width, height = fig.get_size_inches() * fig.dpi
    assert image.mode == "P" and image.size == (round(width), round(height))
    assert len(image.getcolors(256)) > 16  # the photo-like panels keep their shades


def test_moving_the_controls_updates_the_text_and_the_picture(explorer):
    panel = explorer.widget()
    assert [panel.controls[k].description for k in panel.controls] == ["layer", "channel", "tiles", "image", "class"]
    assert panel.text.startswith(f"image 0 of 3: class {explorer.target} explained")
    assert "features.0 (Conv2d) shape (16, 8, 8), channel 0 of 16; tiles: activation, channels 0–15" in panel.text
    assert panel.channel.max == 15 and panel.redraws == 1
    shown = [panel.png]

    def moved(control, value, *expected):
        control.value = value
        assert all(e in panel.text for e in expected), panel.text
        assert panel.png not in shown
        shown.append(panel.png)

    moved(panel.layer, "features.5", "features.5 (Conv2d) shape (64, 4, 4), channel 0 of 64")
    assert panel.channel.max == 63
    moved(panel.channel, 40, "channel 40 of 64", "  activation, channel 40: mean", "  gradient,   channel 40: mean")
    moved(panel.layer, "features.1", "features.1 (ReLU) shape (16, 8, 8), channel 15 of 16")  # clamped, one redraw
    assert panel.channel.max == 15 and panel.channel.value == 15 and panel.redraws == 4
    moved(panel.kind, "gradient", "tiles: gradient")
    other = (explorer.target + 1) % 10
    moved(panel.target, other, f"class {other} explained")
    assert panel.text.splitlines()[2] == explorer.describe("features.1", 15, index=0, target=other).splitlines()[1] \
        .replace("  channel", "  activation, channel")
    find = panel.box.children[1]
    assert find.description == "find" and "features.6" in find.options
    find.value = "features.6"
    assert panel.layer.value == "features.6" and panel.text.count("features.6 (ReLU)") == 1
    find.value = "features."  # not a layer yet: nothing moves
    assert panel.layer.value == "features.6" and panel.redraws == 7


def test_the_widget_picks_an_image_of_the_batch(model, x):
    explorer = LayerExplorer(model, x)
    panel = explorer.widget("features.3", 4)
    panel.index.value = 2
    scores = model(x[2:3])
    assert panel.text.startswith(f"image 2 of 3: class {int(scores.argmax())} explained")
    act = explorer.recorded(2, int(scores.argmax())).activations["features.3"]
    assert torch.equal(act, model.features[:4](x[2:3])[0])
    with pytest.raises(IndexError, match=r"index 3 is out of range for 3 images"):
        explorer.picture("features.3", 0, index=3)


def test_resnet_explorer_labels_second_calls_reaches_every_channel_and_leaves_no_hooks():
    resnet = torchvision.models.resnet18(weights=None).eval()
    explorer = LayerExplorer(resnet, torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    assert "layer1.0.relu" in explorer.layers and "layer1.0.relu (call 1)" in explorer.layers
    first, second = explorer.activations["layer1.0.relu"], explorer.activations["layer1.0.relu (call 1)"]
    assert first.shape == second.shape == (64, 16, 16)
    assert not torch.equal(first, second)
    panel = explorer.widget("layer2.0.conv1")
    assert "layer2.0.conv1 (Conv2d) shape (128, 8, 8), channel 0 of 128" in panel.text
    panel.layer.value = "layer4.1.conv2"
    panel.channel.value = 511
    assert "channel 511 of 512; tiles: activation, channels 448–511" in panel.text
    # the conftest fixture checks that no hook is left on resnet


@pytest.fixture(scope="module")
def picker(model, x):
    return GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.3", "features.6"])


def test_grad_cam_picker_widget(model, x, picker):
    panel = picker.widget()
    assert [c.description for c in panel.controls.values()] == [
        "layer", "class", "image", "method", "before ReLU", "scale", "weights"]
    assert panel.layer.value == "features.6"
    assert panel.text.startswith(f"image 0: label 1, predicted {int(picker.predicted[0])}")
    shown = [panel.png]

    def moved(control, value, expected):
        control.value = value
        assert expected in panel.text, panel.text
        assert panel.png not in shown
        shown.append(panel.png)

    moved(panel.target, (panel.target.value + 1) % 10, f"class {(panel.target.value + 1) % 10} ")
    moved(panel.layer, "features.3", "Grad-CAM (8, 8)")
    moved(panel.index, 2, "image 2: label 3")
    moved(panel.method, "HiResCAM", "  HiResCAM (8, 8)")
    moved(panel.signed, True, "HiResCAM")
    moved(panel.scale, "shared", "HiResCAM")
    moved(panel.weights, "random", "rank correlation with the trained model's map")
    with pytest.raises(ValueError, match=r"\(N, C, H, W\), got shape \(3, 8, 8\)"):
        GradCamPicker(model, x[:, 0], torch.tensor([1, 2, 3]), ["features.3"])
    with pytest.raises(ValueError, match=r"\(N, 1, H, W\) digits or \(N, 3, H, W\) photos, got shape \(3, 2, 8, 8\)"):
        GradCamPicker(model, x.expand(3, 2, 8, 8), torch.tensor([1, 2, 3]), ["features.3"])
    with pytest.raises(UnknownLayerError, match=r"close matches: 'features\.6'"):
        GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.3", "features.66"])
    with pytest.raises(ValueError, match="non-empty list"):
        GradCamPicker(model, x, torch.tensor([1, 2, 3]), "features.3")


def test_picker_methods_match_their_formulas_and_hooklab_cam(model, x, picker):
    with record(model, "features.3", backward=True) as rec:
        x2 = x[2:3].clone().requires_grad_(True)
        torch.autograd.grad(model(x2)[0, 7], x2)
    a, g = rec["features.3"].output, rec["features.3"].grad_output[0]
    by_hand = {
        "Grad-CAM": (g.mean(dim=(2, 3), keepdim=True) * a).sum(dim=1),
        "HiResCAM": (g * a).sum(dim=1),
        "Layer-CAM": (g.clamp(min=0) * a).sum(dim=1),
    }
    for method, raw in by_hand.items():
        parts = picker.compute("features.3", 7, 2, method=method)
        assert torch.allclose(parts["raw"], raw[0], atol=1e-6) and torch.equal(parts["map"], parts["raw"].clamp(min=0))
    assert torch.equal(picker.compute("features.3", 7, 2, method="Grad-CAM")["map"],
                       grad_cam(model, x[2:3], "features.3", 7).maps[0])
    guided = picker.compute("features.3", 7, 2)
    assert torch.equal(guided["guided"], guided_grad_cam(model, x[2:3], "features.3", 7)[0])
    with GuidedBackprop(model) as gb:
        assert torch.equal(guided["saliency"], gb.saliency(x[2:3], 7)[0, 0])


def test_a_students_method_joins_the_selector_and_bad_ones_are_named(model, x):
    def mine(activations, gradients):
        return (gradients.clamp(min=0) * activations).sum(dim=1).clamp(min=0)

    picker = GradCamPicker(model, x, [1, 2, 3], ["features.6"], methods={"my Layer-CAM": mine})
    assert list(picker.widget().method.options)[-1] == "my Layer-CAM"
    assert torch.allclose(picker.compute("features.6", 3, method="my Layer-CAM")["map"],
                          picker.compute("features.6", 3, method="Layer-CAM")["map"])
    wrong = GradCamPicker(model, x, [1, 2, 3], ["features.6"], methods={"flat": lambda a, g: (a * g).sum()})
    with pytest.raises(ValueError, match=r"'flat' must return \(N, h, w\) maps, here \(1, 4, 4\); it returned \(\)"):
        wrong.compute("features.6", 3, method="flat")
    with pytest.raises(LookupError, match=r"unknown method 'Layer-Cam'; close matches: 'Layer-CAM'"):
        picker.compute("features.6", 3, method="Layer-Cam")
    with pytest.raises(TypeError, match="methods must map a name to a function"):
        GradCamPicker(model, x, [1, 2, 3], ["features.6"], methods=[mine])


def test_shared_scale_and_the_signed_map(picker, capsys):
    predicted = int(picker.predicted[0])
    other = (predicted + 5) % 10
    top = float(picker.compute("features.6", predicted, 0)["map"].max())
    own = float(picker.compute("features.6", other, 0)["map"].max())
    fig = picker.render("features.6", other, 0, scale="shared", signed=True)
    assert fig.axes[1].images[0].get_clim() == (0.0, max(top, own))
    raw = picker.compute("features.6", other, 0)["raw"]
    bound = float(raw.abs().max())
    assert len(fig.axes) == 5 and fig.axes[2].images[0].get_clim() == (-bound, bound)
    assert fig.axes[2].get_title().startswith(f"before the ReLU, class {other}")
    plt.close(fig)
    fig = picker.render("features.6", other, 0, method="Grad-CAM")
    assert len(fig.axes) == 2 and fig.axes[1].images[0].get_clim()[1] == pytest.approx(own or 1.0)
    plt.close(fig)
    with pytest.raises(ValueError, match="scale must be 'own'"):
        picker.render("features.6", other, 0, scale="global")
    assert plt.get_fignums() == []
    capsys.readouterr()


def test_weight_randomisation_leaves_the_model_and_the_random_numbers_alone(model, x):
    picker = GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.3", "features.6"])  # nothing cached yet
    before = [p.clone() for p in model.parameters()]
    state = torch.random.get_rng_state()
    trained = picker.compute("features.6", 3, 0, method="Grad-CAM")
    random = picker.compute("features.6", 3, 0, method="Grad-CAM", weights="random")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert not torch.equal(trained["raw"], random["raw"])
    randomised = picker._model("random")
    assert randomised is not model and not torch.equal(randomised.features[0].weight, model.features[0].weight)
    text = picker.describe(random)
    rho = _rank_correlation(random["raw"], trained["raw"])
    assert f"rank correlation with the trained model's map {rho:.2f}" in text
    with pytest.raises(ValueError, match="weights must be 'trained' or 'random'"):
        picker.compute("features.6", 3, 0, weights="shuffled")
    assert _rank_correlation(torch.arange(9.0), torch.arange(9.0)) == pytest.approx(1.0)
    built_from_0 = GradCamPicker(DigitsCNN(seed=0).eval(), torch.rand(1, 1, 8, 8), [0], ["features.6"], seed=0)
    redrawn = built_from_0._model("random")  # seed 0 would rebuild the same weights: the next seed is used
    assert built_from_0.random_seed == 1 and not torch.equal(redrawn.head[2].weight, built_from_0.model.head[2].weight)

    class Scale(nn.Module):  # a parameter that no reset_parameters() re-draws
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1, 1, 1, 1))

        def forward(self, x):
            return x * self.scale

    fixed = nn.Sequential(Scale(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    with pytest.raises(ValueError, match=r"changed none of them: its layers need a reset_parameters\(\) method"):
        GradCamPicker(fixed, torch.rand(1, 1, 4, 4), [0], ["0"])._model("random")
    assert _rank_correlation(torch.arange(9.0), -torch.arange(9.0)) == pytest.approx(-1.0)


def test_guided_backprop_runs_once_per_pass_and_only_for_guided_grad_cam(model, x, monkeypatch, capsys):
    picker = GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.3", "features.6"])  # nothing cached yet
    runs, saliency = [], GuidedBackprop.saliency
    monkeypatch.setattr(GuidedBackprop, "saliency", lambda gb, *args: runs.append(args) or saliency(gb, *args))
    plt.close(picker.render("features.6", 3, 0, weights="random", scale="shared"))
    assert len(runs) == 1  # the trained map describe compares with and the shared scale's map need none
    again = picker.compute("features.6", 3, 0, weights="random")
    assert len(runs) == 1 and torch.equal(again["guided"], again["saliency"] * again["cam"])
    picker.compute("features.6", 3, 1, method="Grad-CAM")
    assert len(runs) == 1
    picker.compute("features.6", 3, 1)
    assert len(runs) == 2
    capsys.readouterr()


def test_picker_explains_an_rgb_photo_on_resnet18():
    resnet = torchvision.models.resnet18(weights=None).eval()  # random weights: nothing is downloaded
    cat = photo("chelsea", size=112)
    picker = GradCamPicker(resnet, cat, [281], ["layer3", "layer4"])
    parts = picker.compute("layer4", None, 0, method="Grad-CAM")
    assert torch.equal(parts["map"], grad_cam(resnet, cat, "layer4").maps[0]) and parts["map"].shape == (4, 4)
    panel = picker.widget()
    assert panel.text.startswith(f"image 0: label 281, predicted {int(picker.predicted[0])}")
    fig = picker.figure(parts)
    shown = fig.axes[0].images[0].get_array()
    assert shown.shape == (112, 112, 3) and np.allclose(shown, to_display(cat), atol=1e-6)
    assert fig.axes[1].images[1].get_alpha() == 0.55 and not fig.axes[1].collections  # no digit outline
    # the conftest fixture checks that no hook is left on resnet


def test_draw_cam_over_a_photo(x):
    rgb = torch.rand(8, 8, 3, generator=torch.Generator().manual_seed(0))
    fig = draw_cam(rgb, torch.ones(2, 2), "photo", vmax=4.0)
    ax = fig.axes[0]
    assert len(ax.images) == 2 and ax.images[1].get_clim() == (0.0, 4.0)
    assert ax.get_title() == "photo\nmax 1, colours 0..4"
    plt.close(fig)
    with pytest.raises(ValueError, match=r"an \(H, W, 3\) photo; got \(3, 8, 8\): use hooklab\.data\.to_display"):
        draw_cam(rgb.permute(2, 0, 1), torch.ones(2, 2))


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

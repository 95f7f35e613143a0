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
from hooklab.audit import leftover_hooks
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


def test_view_prints_the_summary_and_returns_the_picture(explorer, capsys):
    shown = explorer.view("features.1", 2)
    assert capsys.readouterr().out == explorer.summary("features.1", 2) + "\n"
    assert isinstance(shown, picture.Picture) and shown.png == explorer.picture("features.1", 2).png
    assert not hasattr(explorer, "render") and not hasattr(explorer, "figure")  # one drawing: the picture


def test_render_and_figure_show_the_picture_and_close_it_when_drawing_fails(model, x, monkeypatch, capsys):
    picker = GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.6"])
    parts = picker.compute("features.6", 3, 0)
    pixels = np.asarray(picker._canvas(parts, "own", False).image)
    for call, tracked in ((lambda: picker.render("features.6", 3, 0), True), (lambda: picker.figure(parts), False)):
        fig = call()
        assert (plt.get_fignums() == [fig.number]) if tracked else (plt.get_fignums() == [])
        assert np.array_equal(fig.axes[0].images[0].get_array(), pixels)  # the picture, pixel for pixel
        assert tuple(fig.get_size_inches() * fig.dpi) == (pixels.shape[1], pixels.shape[0])
        plt.close(fig)

    def broken(*args):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(picker, "_draw", broken)
    for call in (lambda: picker.render("features.6", 3, 0), lambda: picker.figure(parts)):
        with pytest.raises(RuntimeError, match="drawing failed"):
            call()
        assert plt.get_fignums() == []  # hooklab.checks.drawn closed the pyplot figure
    capsys.readouterr()


def test_tiles_are_tile_channels_of_the_channels_averaged_down(explorer):
    """Activation tiles span 0..1; gradient tiles put 0 at 0.5 (white in RdBu_r), between gaps of
    1 pixel; the picture pastes their colours, enlarged."""
    run, grad = explorer.recorded(0), explorer.gradients["features.3"]
    indices, (h, w), cols = explorer._grid(run, "features.3", "gradient", 0)
    assert (h, w, cols) == (8, 8, 6)  # 32 channels of 8×8: a squarish grid, 6 a row
    grid = tile_channels(grad, ncols=cols, pad=1, signed=True)
    row, col = divmod(10, cols)
    expected = (grad[10] / grad[10].abs().max() + 1) / 2
    assert torch.allclose(torch.from_numpy(grid[row * 9 : row * 9 + 8, col * 9 : col * 9 + 8]), expected.double())
    assert np.isnan(grid[8, :]).all() and np.isnan(grid[:, 8]).all()  # the gaps: NaN, painted grey
    assert np.array_equal(indices, picture.colours(torch.from_numpy(grid), "RdBu_r", 0.0, 1.0))
    act = explorer._grid(run, "features.3", "activation", 0)[0]
    assert {0, picture.LEVELS - 1} <= set(np.unique(act).tolist())  # viridis from its bottom to its top
    conv = torch.nn.Conv2d(1, 9, 3, padding=1)  # 56×56 maps, as in a ResNet: averaged down to 28×28 tiles
    big = LayerExplorer(conv, torch.rand(1, 1, 56, 56))
    indices, (h, w), cols = big._grid(big.recorded(0), "", "gradient", 0)
    assert (h, w, cols) == (28, 28, 3) and indices.shape == (3 * 29 - 1, 3 * 29 - 1)


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


def test_colours_and_sizes():
    values = torch.tensor([[-1.0, 0.0, 1.0, float("nan")]])
    assert picture.colours(values, "viridis", 0.0, 1.0).tolist() == [[0, 0, picture.LEVELS - 1, picture.GREY]]
    assert picture.colours(values, "RdBu_r", -1.0, 1.0)[0, :3].tolist() == [
        picture.LEVELS, picture.LEVELS + round((picture.LEVELS - 1) / 2), 2 * picture.LEVELS - 1]
    with pytest.raises(ValueError, match="cmap must be one of viridis, RdBu_r"):
        picture.colours(values, "jet", 0.0, 1.0)
    inferno = plt.get_cmap("inferno")
    expected = [np.round(np.array(inferno(v)[:3]) * 255).tolist() for v in (0.0, 0.0, 1.0)] + [[153, 153, 153]]
    assert picture.rgb(values, "inferno", 0.0, 1.0)[0].tolist() == expected
    assert picture.shrink(torch.ones(100, 50), 40).shape == (34, 17)
    cells = torch.arange(4.0).view(2, 2)
    assert torch.equal(picture.fit(cells, (4, 4)), cells.repeat_interleave(2, 0).repeat_interleave(2, 1))  # blocks
    assert torch.equal(picture.fit(torch.arange(16.0).view(4, 4), (2, 2)), torch.tensor([[2.5, 4.5], [10.5, 12.5]]))


def test_the_picker_picture_is_a_png_of_its_canvas(picker):
    parts = picker.compute("features.6", 3, 0)
    canvas = picker._canvas(parts, "own", False)
    shown = picker.picture(parts)
    image = Image.open(io.BytesIO(shown.png))
    assert image.mode == "P" and image.size == shown.size == canvas.image.size
    drawn = np.asarray(image.convert("RGB")).astype(int)
    assert (drawn[0, 0] == 255).all()  # the background stays white
    assert np.abs(drawn - np.asarray(canvas.image)).mean() < 2  # the 256 colours picked for it
    assert len(image.getcolors(256)) > 16  # the map keeps its shades


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


def panel_pixel(picker, parts, scale, signed, panel, row, col):
    """The colour the picture gives cell (row, col) of the map in panel ``panel``."""
    canvas = picker._canvas(parts, scale, signed)
    image = picker.images[parts["index"]]
    top = 6 + 15 * max(len(p.title) for p in picker._panels(parts, scale, signed))
    cell = 176 / max(image.shape[-2:]) * image.shape[-1] / parts["map"].shape[1]
    x = 8 + panel * (176 + 16) + int((col + 0.5) * cell)
    return tuple(np.asarray(canvas.image)[top + int((row + 0.5) * cell), x])


def test_shared_scale_and_the_signed_map(picker, capsys):
    predicted = int(picker.predicted[0])
    other = (predicted + 5) % 10
    top = float(picker.compute("features.6", predicted, 0)["map"].max())
    parts = picker.compute("features.6", other, 0)
    own = float(parts["map"].max())
    panels = picker._panels(parts, "shared", True)
    assert [p.kind for p in panels] == ["image", "map", "signed", "signed", "signed"]
    assert panels[1].high == max(top, own) and panels[1].title[2] == f"max {own:.4g}, scale shared"
    bound = float(parts["raw"].abs().max())
    assert panels[2].high == bound and panels[2].title[:2] == ("before the ReLU", f"class {other}")
    assert [p.title[0] for p in panels[3:]] == ["guided backprop", "guided Grad-CAM"]
    row, col = divmod(int(parts["map"].argmax()), parts["map"].shape[1])
    inferno = lambda v, high: tuple(picture.rgb(torch.tensor([[v]]), "inferno", 0.0, high)[0, 0])  # noqa: E731
    assert panel_pixel(picker, parts, "shared", True, 1, row, col) == inferno(own, max(top, own))
    assert panel_pixel(picker, parts, "own", False, 1, row, col) == inferno(1.0, 1.0)  # its own maximum: the top
    plain = picker._panels(picker.compute("features.6", other, 0, method="Grad-CAM"), "own", False)
    assert len(plain) == 2 and plain[1].high == pytest.approx(own or 1.0)
    fig = picker.render("features.6", other, 0, scale="shared", signed=True)
    assert capsys.readouterr().out.startswith("image 0: label 1")
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

    bare = nn.Sequential(Scale(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    random_bare = GradCamPicker(bare, torch.rand(1, 1, 4, 4), [0], ["0"])._model("random")  # re-drawn too
    assert not torch.equal(random_bare[0].scale, bare[0].scale) and torch.equal(bare[0].scale, torch.ones(1, 1, 1, 1))
    no_weights = nn.Sequential(nn.Identity(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    with pytest.raises(ValueError, match=r"changed none of them: its layers need a reset_parameters\(\) method"):
        GradCamPicker(no_weights, torch.rand(1, 1, 4, 4), [0], ["0"])._model("random")
    assert _rank_correlation(torch.arange(9.0), -torch.arange(9.0)) == pytest.approx(-1.0)


def test_guided_backprop_runs_once_per_class_and_only_for_guided_grad_cam(model, x, monkeypatch, capsys):
    picker = GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.3", "features.6"])  # nothing kept yet
    predicted = int(picker.predicted[0])
    passes = count_passes(monkeypatch, model)
    plt.close(picker.render("features.6", predicted, 0, weights="random", scale="shared"))
    # random weights: one forward pass and two backward passes (the layers', the guided one); the trained
    # map describe compares with: one forward pass and one backward pass; the shared scale's map (the class
    # the trained model predicts) is the one already there
    assert passes == {"forward": 2, "backward": 3}
    again = picker.compute("features.6", predicted, 0, weights="random")
    assert passes == {"forward": 2, "backward": 3} and torch.equal(again["guided"], again["saliency"] * again["cam"])
    picker.compute("features.3", predicted, 0, weights="random")  # another layer: nothing to run
    assert passes == {"forward": 2, "backward": 3}
    picker.compute("features.6", 3, 1, method="Grad-CAM")
    assert passes == {"forward": 3, "backward": 4}
    picker.compute("features.6", 3, 1)
    assert passes == {"forward": 3, "backward": 5}
    capsys.readouterr()


#: moves of the picker's controls from its start (image 0, class 7: the one predicted for every image),
#: with the passes each runs, (forward, backward): a new class runs a backward pass for the layers'
#: gradients, and one for guided backprop with guided Grad-CAM; the shared scale needs the map of the
#: predicted class, and describe, with random weights, the trained model's map of the class shown
MOVES = [("target", 4, (0, 2)), ("layer", "features.3", (0, 0)), ("method", "Grad-CAM", (0, 0)),
         ("signed", True, (0, 0)), ("scale", "shared", (0, 0)), ("method", "guided Grad-CAM", (0, 0)),
         ("index", 2, (1, 3)), ("weights", "random", (1, 3)), ("target", 5, (0, 3)), ("method", "HiResCAM", (0, 0)),
         ("scale", "own", (0, 0)), ("weights", "trained", (0, 0)), ("index", 0, (0, 1)), ("target", 4, (0, 0))]


def test_a_move_runs_a_backward_pass_only_for_a_new_class_and_ends_where_a_new_picker_starts(model, x, monkeypatch):
    """Each move of the widget runs the passes it needs and no more: a forward pass per image and
    weights, one backward pass per class for every layer's gradient (one more for guided Grad-CAM,
    one more for each map ``describe`` or the shared scale compares with); a new layer, method, scale
    or "before ReLU" runs none. After every move, text and picture are those of a new picker."""
    picker = GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.3", "features.6"])
    panel = picker.widget()
    assert picker.predicted.tolist() == [7, 7, 7] and panel.target.value == 7
    passes = count_passes(monkeypatch, model)
    for name, value, expected in MOVES:
        before = dict(passes)
        getattr(panel, name).value = value
        assert (passes["forward"] - before["forward"], passes["backward"] - before["backward"]) == expected, name
        monkeypatch.undo()
        fresh = GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.3", "features.6"])
        args = (panel.layer.value, panel.target.value, panel.index.value)
        parts = fresh.compute(*args, method=panel.method.value, weights=panel.weights.value)
        assert panel.text == fresh.describe(parts) + "\n"
        assert panel.png == fresh.picture(parts, scale=panel.scale.value, signed=panel.signed.value).png
        passes = count_passes(monkeypatch, model)
    assert leftover_hooks(model, picker._model("random")) == []


def test_maps_after_moves_are_those_of_hooklab_saliency(model, x):
    picker = GradCamPicker(model, x, torch.tensor([1, 2, 3]), ["features.1", "features.3", "features.6"])
    for layer, target, index in [("features.6", 1, 0), ("features.3", 1, 0), ("features.1", 5, 0),
                                 ("features.6", 5, 2), ("features.3", 1, 0), ("features.6", 5, 0)]:  # fmt: skip
        for method in ("HiResCAM", "guided Grad-CAM", "Grad-CAM"):
            parts = picker.compute(layer, target, index, method=method)
        assert torch.equal(parts["map"], grad_cam(model, x[index : index + 1], layer, target).maps[0])
        guided = picker.compute(layer, target, index)["guided"]
        assert torch.equal(guided, guided_grad_cam(model, x[index : index + 1], layer, target)[0])


def test_writing_into_the_weights_runs_the_passes_again(model, x):
    """Kept passes belong to the weights they were made with: re-drawn weights (``reset_parameters``),
    ``load_state_dict`` or an optimiser step bump the parameters' version counters."""
    import copy

    net = copy.deepcopy(model)
    picker = GradCamPicker(net, x, torch.tensor([1, 2, 3]), ["features.3", "features.6"])
    before = picker.compute("features.6", 4, 1)
    random_before = picker.compute("features.6", 4, 1, weights="random")
    saved = copy.deepcopy(net.state_dict())
    with torch.random.fork_rng():
        torch.manual_seed(5)
        for module in net.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    after = picker.compute("features.6", 4, 1)
    fresh = GradCamPicker(net, x, torch.tensor([1, 2, 3]), ["features.3", "features.6"]).compute("features.6", 4, 1)
    assert not torch.equal(after["raw"], before["raw"])
    for key in ("raw", "saliency", "guided"):
        assert torch.equal(after[key], fresh[key])
    assert int(picker.predicted[1]) == int(net(x[1:2]).argmax())  # kept up to date with the trained pass
    net.load_state_dict(saved)
    for key in ("raw", "saliency", "guided", "score"):
        assert torch.equal(torch.as_tensor(picker.compute("features.6", 4, 1)[key]), torch.as_tensor(before[key]))
    random_after = picker.compute("features.6", 4, 1, weights="random")  # re-drawn again from the weights as they are
    assert torch.equal(random_after["raw"], random_before["raw"])
    optimiser = torch.optim.SGD(net.parameters(), lr=0.5)
    nn.functional.cross_entropy(net(x), torch.tensor([1, 2, 3])).backward()
    optimiser.step()
    stepped = GradCamPicker(net, x, torch.tensor([1, 2, 3]), ["features.6"]).compute("features.6", 4, 1)
    assert torch.equal(picker.compute("features.6", 4, 1)["raw"], stepped["raw"])


def test_in_place_writes_after_a_layer_and_second_calls_on_resnet18():
    """ResNet writes into a block's ``bn2`` output (``out += identity``) and calls each block's ReLU
    twice (``inplace=True``): the picker explains what each layer returned at its last call, as
    ``grad_cam`` does, with one backward pass for all of them."""
    resnet = torchvision.models.resnet18(weights=None).eval()
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    layers = ["layer1.0.bn2", "layer1.0.relu", "layer2", "layer4.1.conv2"]
    picker = GradCamPicker(resnet, x, [1], layers)
    for layer in layers:
        for method in ("guided Grad-CAM", "Grad-CAM"):
            parts = picker.compute(layer, 3, method=method)
        assert torch.equal(parts["map"], grad_cam(resnet, x, layer, 3).maps[0]), layer
    assert torch.equal(picker.compute("layer2", 3)["guided"], guided_grad_cam(resnet, x, "layer2", 3)[0])
    assert leftover_hooks(resnet) == []


def count_passes(monkeypatch, model) -> dict:
    """Count ``model``'s forward passes (by its forward method) and every backward pass (every
    ``torch.autograd.grad`` and ``Tensor.backward`` call) until the test ends."""
    passes = {"forward": 0, "backward": 0}
    forward, grad, backward = type(model).forward, torch.autograd.grad, torch.Tensor.backward

    def counted(kind, fn):
        def call(*args, **kwargs):
            passes[kind] += 1
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(type(model), "forward", counted("forward", forward))
    monkeypatch.setattr(torch.autograd, "grad", counted("backward", grad))
    monkeypatch.setattr(torch.Tensor, "backward", counted("backward", backward))
    return passes


def test_picker_explains_an_rgb_photo_on_resnet18():
    resnet = torchvision.models.resnet18(weights=None).eval()  # random weights: nothing is downloaded
    cat = photo("chelsea", size=112)
    picker = GradCamPicker(resnet, cat, [281], ["layer3", "layer4"])
    parts = picker.compute("layer4", None, 0, method="Grad-CAM")
    assert torch.equal(parts["map"], grad_cam(resnet, cat, "layer4").maps[0]) and parts["map"].shape == (4, 4)
    panel = picker.widget()
    assert panel.text.startswith(f"image 0: label 281, predicted {int(picker.predicted[0])}")
    shown = picker._image(0, (176, 176))  # 112 pixels enlarged to 176: blocks of 1 or 2 pixels
    photo_pixels = np.round(to_display(cat) * 255).astype(np.uint8)
    assert np.array_equal(shown, photo_pixels[np.arange(176) * 112 // 176][:, np.arange(176) * 112 // 176])
    canvas = np.asarray(picker._canvas(parts, "own", False).image).astype(int)
    top, left = 6 + 15 * 3, 8 + 176 + 16
    over = canvas[top : top + 176, left : left + 176]
    blocks = picture.rgb(picture.fit(parts["map"], (176, 176)), "inferno", 0.0, float(parts["map"].max()))
    assert np.abs(over - (0.55 * blocks + 0.45 * shown)).max() <= 0.5 + 1e-9  # the map half transparent
    assert np.array_equal(canvas[top : top + 176, 8 : 8 + 176], shown)
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

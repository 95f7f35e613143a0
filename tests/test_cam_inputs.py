"""Bad input to hooklab.saliency, hooklab.cam_widgets and the layer explorer: clear errors, early, nothing left open."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
import torchvision
from torch import nn

from hooklab import NoGradientError
from hooklab.cam_widgets import GradCamPicker, draw_cam
from hooklab.models import DigitsCNN
from hooklab.saliency import GradCAM, GuidedBackprop, grad_cam, guided_grad_cam
from hooklab.widgets import LayerExplorer


@pytest.fixture(scope="module")
def model():
    return DigitsCNN(seed=2).eval()


@pytest.fixture
def x():
    return torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(4))


def every_entry_point_raises(model, images, layer, error, message):
    """Grad-CAM, guided Grad-CAM, the explorer and guided backprop all refuse ``images`` alike."""
    for call in (
        lambda: grad_cam(model, images, layer),
        lambda: guided_grad_cam(model, images, layer),
        lambda: LayerExplorer(model, images),
    ):
        with pytest.raises(error, match=message):
            call()
    with GuidedBackprop(model) as gb, pytest.raises(error, match=message):
        gb.saliency(images)


class _SideBranch(nn.Module):
    """A convolution whose output the score never uses."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.side = nn.Conv2d(1, 2, 3, padding=1)
            self.fc = nn.Linear(4, 3)

    def forward(self, x):
        self.side(x)
        return self.fc(self.conv(x).relu().mean(dim=(2, 3)))


class _FunctionalReLU(nn.Module):
    """Has an nn.ReLU module but calls torch.relu instead."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.relu, self.fc = nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Linear(2, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def _three_classes() -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(4, 3)).eval()


def test_1_guided_backprop_refuses_a_nested_with_block(model, x):
    gb = GuidedBackprop(model)
    with gb:
        with pytest.raises(RuntimeError, match="already inside a `with` block"), gb:
            pass
        assert gb.saliency(x).shape == x.shape  # the outer block's hooks are still there


def test_2_a_target_list_must_have_one_entry_per_image(model, x):
    with pytest.raises(ValueError, match="target has 2 entries for a batch of 4 images"):
        grad_cam(model, x, "features.6", [1, 2])
    with pytest.raises(ValueError, match="target has 5 entries for a batch of 4 images"):
        grad_cam(model, x, "features.6", [1, 2, 3, 4, 5])
    with GuidedBackprop(model) as gb, pytest.raises(ValueError, match="target has 3 entries"):
        gb.saliency(x, torch.tensor([1, 2, 3]))
    assert grad_cam(model, x, "features.6", [1, 2, 3, 4]).targets.tolist() == [1, 2, 3, 4]


def test_3_draw_cam_wants_one_map_and_creates_no_figure_for_a_wrong_one(model, x):
    maps = grad_cam(model, x, "features.6").maps
    with pytest.raises(ValueError, match=r"expects an \(h, w\) map; got \(1, 4, 4\): use result\.maps\[0\]"):
        draw_cam(x[0, 0], maps[:1])
    for wrong in (maps[0, 0], maps[None, :1]):
        with pytest.raises(ValueError, match=r"expects an \(h, w\) map"):
            draw_cam(x[0, 0], wrong)
    with pytest.raises(ValueError, match=r"expects an \(H, W\) image; got \(1, 8, 8\): use image\[0\]"):
        draw_cam(x[0], maps[0])
    assert plt.get_fignums() == []
    assert draw_cam(x[0, 0], maps[0]).number in plt.get_fignums()


@pytest.mark.parametrize("target", [10, -1, [0, 1, 2, 10]])
def test_4_a_class_index_out_of_range(model, x, target):
    message = r"out of range: the model gives 10 class scores \(0\.\.9\)"
    with pytest.raises(IndexError, match=message):
        grad_cam(model, x, "features.6", target)


def test_4_class_index_type_and_range_everywhere(model, x):
    with pytest.raises(IndexError, match=r"target 12 is out of range: the model gives 10 class scores \(0\.\.9\)"):
        guided_grad_cam(model, x, "features.6", 12)
    with pytest.raises(TypeError, match="target must be a class index"):
        grad_cam(model, x, "features.6", 2.7)
    with pytest.raises(TypeError, match="target must be a class index"):
        grad_cam(model, x, "features.6", True)
    with pytest.raises(IndexError, match="target -1 is out of range"):
        LayerExplorer(model, x, target=-1)
    with pytest.raises(TypeError, match="target must be a class index"):
        LayerExplorer(model, x, target=2.5)
    assert LayerExplorer(model, x, target=9).target == 9


def test_4_picker_class_slider_follows_the_number_of_class_scores(x):
    picker = GradCamPicker(_three_classes(), x, torch.tensor([0, 1, 2, 0]), ["1"])
    assert picker.classes == 3
    panel = picker.widget()
    assert (panel.target.min, panel.target.max) == (0, 2)


@pytest.mark.parametrize(("images", "error", "message"), [
    (lambda x: x[0], ValueError, r"got shape \(1, 8, 8\): add a batch dimension with x\[None\]"),
    (lambda x: (x * 10).long(), TypeError, r"floating-point images, got torch\.int64"),
    (lambda x: x.double(), TypeError, r"torch\.float64 but the model's parameters are torch\.float32"),
    (lambda x: x[:0], ValueError, "empty batch"),
    (lambda x: x[0, 0].tolist(), TypeError, "got list"),
])
def test_5_image_shape_and_dtype_are_checked_at_every_entry_point(model, x, images, error, message):
    every_entry_point_raises(model, images(x), "features.6", error, message)


def test_6_gradients_are_computed_under_no_grad_and_refused_under_inference_mode(model, x):
    expected = grad_cam(model, x, "features.3").maps
    with GuidedBackprop(model) as gb:
        saliency = gb.saliency(x)
    explorer = LayerExplorer(model, x)
    picker = GradCamPicker(model, x, [0, 1, 2, 3], ["features.3"])
    parts = picker.compute("features.3", 5, 1)
    with torch.no_grad():
        assert torch.equal(grad_cam(model, x, "features.3").maps, expected)
        with GuidedBackprop(model) as gb:
            assert torch.equal(gb.saliency(x), saliency)
        assert torch.equal(LayerExplorer(model, x).gradients["features.3"], explorer.gradients["features.3"])
        fresh = GradCamPicker(model, x, [0, 1, 2, 3], ["features.3"]).compute("features.3", 5, 1)
        assert torch.equal(fresh["map"], parts["map"]) and torch.equal(fresh["guided"], parts["guided"])
        assert torch.equal(picker.compute("features.3", 6, 1)["map"], grad_cam(model, x[1:2], "features.3", 6).maps[0])
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match="GradCamPicker needs gradients"):
            picker.compute("features.3", 7, 1)
        with pytest.raises(RuntimeError, match=r"Grad-CAM needs gradients; call it outside torch\.inference_mode\(\)"):
            grad_cam(model, x, "features.3")
        with pytest.raises(RuntimeError, match="LayerExplorer needs gradients"):
            LayerExplorer(model, x)
        with GuidedBackprop(model) as gb, pytest.raises(RuntimeError, match="guided backprop needs gradients"):
            gb.saliency(x)


def test_7_a_layer_off_the_path_to_the_score(x):
    model = _SideBranch().eval()
    with pytest.raises(NoGradientError, match="layer 'side' does not contribute to the score of class 2") as err:
        grad_cam(model, x, "side", target=2)
    assert "record(" not in str(err.value)
    explorer = LayerExplorer(model, x)
    assert explorer.layers == ["side", "conv"] and explorer.no_gradient == {"side"}
    assert not explorer.gradients["side"].any() and explorer.gradients["conv"].any()
    assert "(zero: the score of class" in explorer.describe("side", 0, "gradient")
    assert "zero:" not in explorer.describe("conv", 0, "gradient")
    explorer.picture("side", 1, "gradient")
    picker = GradCamPicker(model, x, [0, 1, 2, 0], ["side", "conv"])
    with pytest.raises(NoGradientError, match="layer 'side' does not contribute to the score of class 2"):
        picker.compute("side", 2)
    assert picker.compute("conv", 2, method="Grad-CAM")["map"].shape == (8, 8)  # the other layer: its gradient came
    with pytest.raises(ValueError, match=r"_SideBranch has no nn\.ReLU module: guided backprop needs them"):
        picker.compute("conv", 2)  # guided Grad-CAM


def test_8_train_mode_is_refused_before_anything_changes():
    resnet = torchvision.models.resnet18(weights=None).train()
    before = resnet.bn1.running_mean.clone()
    x = torch.rand(2, 3, 32, 32)
    with pytest.raises(ValueError, match=r"model is in train mode; call model\.eval\(\) first \(its BatchNorm2d 'bn1'"):
        grad_cam(resnet, x, "layer4")
    with pytest.raises(ValueError, match="train mode"):
        LayerExplorer(resnet, x)
    assert torch.equal(resnet.bn1.running_mean, before)
    dropout = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(), nn.Linear(144, 3))
    with pytest.raises(ValueError, match=r"Dropout '2' would drop other units"):
        guided_grad_cam(dropout, torch.rand(2, 1, 8, 8), "1")
    with pytest.raises(ValueError, match="train mode"):
        GradCamPicker(dropout, torch.rand(2, 1, 8, 8), [0, 1], ["1"])
    assert grad_cam(dropout.eval(), torch.rand(2, 1, 8, 8), "1").maps.shape == (2, 6, 6)
    lazy = nn.Sequential(nn.Conv2d(1, 4, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))
    with pytest.raises(ValueError, match=r"train mode; call model\.eval\(\) first \(its LazyBatchNorm2d '1'"):
        grad_cam(lazy, torch.rand(2, 1, 8, 8), "2")
    lazy.eval()(torch.rand(2, 1, 8, 8))  # the first pass gives the lazy layers their shapes and drops their own hooks


def test_8b_the_picker_names_an_unknown_layer_wherever_it_is_asked_for(model, x):
    picker = GradCamPicker(model, x, torch.tensor([1, 2, 3, 4]), ["features.3", "features.6"])
    for ask in (lambda: picker.compute("head.2", None), lambda: picker.widget("features.7")):
        with pytest.raises(LookupError, match=r"is not one of this picker's layers; .*features\.[36]"):
            ask()


def test_9_a_layer_is_one_name(model, x):
    with pytest.raises(TypeError, match=r"layer names are strings such as 'features\.0', not 5 \(int\)"):
        grad_cam(model, x, 5)
    with pytest.raises(TypeError, match=r"not \['features\.5'\] \(list\)"):
        grad_cam(model, x, ["features.5"])


class _Returns(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind, self.conv, self.relu = kind, nn.Conv2d(1, 2, 3), nn.ReLU()

    def forward(self, x):
        scores = self.relu(self.conv(x)).mean(dim=(2, 3))
        return scores.sum() if self.kind == "scalar" else (scores, scores)


@pytest.mark.parametrize(("kind", "got"), [("scalar", r"gave shape \(\)"), ("tuple", "gave a tuple")])
def test_10_the_model_must_return_class_scores(x, kind, got):
    model = _Returns(kind).eval()
    message = rf"must return an \(N, classes\) tensor of scores; for \d images it {got}"
    every_entry_point_raises(model, x, "conv", ValueError, message)


def test_11_picker_checks_its_arguments_when_built(model, x):
    labels = torch.tensor([1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"layer 'head\.2' returns shape \(4, 10\); Grad-CAM needs .* \(N, C, H, W\)"):
        GradCamPicker(model, x, labels, ["features.6", "head.2"])
    with pytest.raises(ValueError, match="one class label per image: got None for 4 images"):
        GradCamPicker(model, x, None, ["features.6"])
    with pytest.raises(ValueError, match="got 2 labels for 4 images"):
        GradCamPicker(model, x, labels[:2], ["features.6"])
    with pytest.raises(ValueError, match="empty batch"):
        GradCamPicker(model, x[:0], labels[:0], ["features.6"])
    picker = GradCamPicker(model, x, labels, ["features.6"])
    with pytest.raises(IndexError, match=r"index 4 is out of range for 4 images \(0\.\.3\)"):
        picker.render("features.6", 1, index=4)
    with pytest.raises(TypeError, match="index must be an int"):
        picker.compute("features.6", 1, index=1.0)
    with pytest.raises(IndexError, match="target 10 is out of range"):
        picker.render("features.6", 10)
    assert plt.get_fignums() == []


def test_12_a_channel_is_an_int(model, x, capsys):
    explorer = LayerExplorer(model, x)
    for wrong in (True, 2.0, "2"):
        with pytest.raises(TypeError, match="channel must be an int"):
            explorer.view("features.0", wrong)
    with pytest.raises(TypeError, match="layer must be one of this explorer's layer names"):
        explorer.describe(["features.0"])
    assert capsys.readouterr().out == "" and plt.get_fignums() == []
    assert "channel 2 of 16" in explorer.describe("features.0", torch.tensor(2))


def test_13_figure_is_not_tracked_render_is_and_errors_leave_nothing_open(model, x, capsys):
    explorer = LayerExplorer(model, x)
    picker = GradCamPicker(model, x, torch.tensor([1, 2, 3, 4]), ["features.6"])
    for _ in range(3):
        picker.figure(picker.compute("features.6", 3, 0))
    assert plt.get_fignums() == []
    shown = picker.render("features.6", 3, 0)
    assert plt.get_fignums() == [shown.number]  # plt.show() displays what render returned
    plt.close(shown)
    with pytest.raises(IndexError, match="channel 16 is out of range"):
        explorer.view("features.1", 16)
    with pytest.raises(LookupError):
        explorer.view("features.9", 0)
    with pytest.raises(ValueError, match="scale must be"):
        picker.render("features.6", 3, 0, scale="global")
    for panel in (explorer.widget(), picker.widget()):
        panel.index.value = 3
    assert plt.get_fignums() == []


def test_14_no_silent_mixing_with_guided_backprop(model, x):
    with GuidedBackprop(model):
        with pytest.raises(RuntimeError, match=r"Grad-CAM inside `with GuidedBackprop\(model\):`"):
            grad_cam(model, x, "features.3")
        with pytest.raises(RuntimeError, match="LayerExplorer inside"):
            LayerExplorer(model, x)
    with GradCAM(model, "features.3") as cam:
        assert cam(x).maps.shape == (4, 8, 8)  # fine again once the block has ended
    with GuidedBackprop(_FunctionalReLU()) as gb, pytest.raises(ValueError, match=r"no nn\.ReLU ran in the forward"):
        gb.saliency(x)


# ----- the mistakes of issue 25's bad-input table -----------------------------------------------
def test_15_a_grey_image_into_resnet18_is_refused_before_running():
    resnet = torchvision.models.resnet18(weights=None, num_classes=4).eval()
    grey = torch.rand(1, 1, 32, 32)
    message = r"ResNet wants 3 channels \(its first convolution 'conv1' takes 3\).*have 1: .*x\.expand\(-1, 3, -1, -1\)"
    every_entry_point_raises(resnet, grey, "layer4", ValueError, message)
    with pytest.raises(ValueError, match=message):
        GradCamPicker(resnet, grey, [0], ["layer4"])
    assert grad_cam(resnet, grey.expand(-1, 3, -1, -1), "layer4").maps.shape == (1, 1, 1)  # the fix works


def test_16_a_model_on_the_meta_device_is_told_to_load_real_weights(x):
    meta = DigitsCNN().to("meta").eval()
    message = r"'meta' device: meta tensors hold no data.*to_empty\(device='cpu'\).*load_state_dict"
    every_entry_point_raises(meta, x, "features.6", ValueError, message)
    with pytest.raises(ValueError, match=r"images are on the 'meta' device"):
        grad_cam(DigitsCNN().eval(), x.to("meta"), "features.6")


def test_17_swapped_arguments_are_named_without_a_tensor_dump(model, x):
    for call, name in ((lambda: grad_cam(model, "features.6", x), "grad_cam"),
                       (lambda: guided_grad_cam(model, "features.6", x), "guided_grad_cam")):
        with pytest.raises(TypeError, match=rf"{name}\(model, x, layer\) takes the images before the layer name") as e:
            call()
        assert r"a float32 tensor of shape (4, 1, 8, 8)" in str(e.value) and "tensor([" not in str(e.value)
        assert len(str(e.value)) < 250
    with pytest.raises(TypeError, match=r"not a float32 tensor of shape \(4, 1, 8, 8\)") as e:
        GradCAM(model, x)
    assert "tensor([" not in str(e.value)
    with pytest.raises(TypeError, match=r"got str 'features.6': is it a layer name\?"):
        LayerExplorer(model, "features.6")
    with pytest.raises(TypeError, match=r"target must be .*got a float32 tensor of shape \(4, 10\)") as e:
        grad_cam(model, x, "features.6", torch.rand(4, 10))
    assert "tensor([" not in str(e.value)


def test_18_a_nan_pixel_is_said_not_explained_silently(model, x):
    bad = x.clone()
    bad[1, 0, 2, 3] = float("nan")
    with pytest.warns(UserWarning, match=r"the input holds NaN in 1 value of image 1: every score"):
        explorer = LayerExplorer(model, bad)
    assert "the input holds NaN" not in explorer.summary("features.0", index=0)  # image 0 is fine
    assert "the input holds NaN: every score and gradient" in explorer.summary("features.0", index=1)
    with pytest.warns(UserWarning, match="the input holds NaN"):
        picker = GradCamPicker(model, bad, [0, 1, 2, 3], ["features.6"])
    assert "the input holds NaN" in picker.describe(picker.compute("features.6", 1, 1))
    bad[3, 0, 0, 0] = float("inf")
    with pytest.warns(UserWarning, match=r"NaN and inf in 2 values of 2 images \(first: 1\)"):
        grad_cam(model, bad, "features.6")


class _Scaled(nn.Module):
    """A digits CNN whose scores a bare parameter multiplies."""

    def __init__(self) -> None:
        super().__init__()
        self.net = DigitsCNN(seed=2)
        self.scale = nn.Parameter(torch.tensor([2.0]))

    def forward(self, x):
        return self.net(x) * self.scale


def test_19_random_weights_re_draw_bare_parameters_too(x):
    from hooklab.cam_widgets import bare_parameters

    model = _Scaled().eval()
    assert list(bare_parameters(model)) == ["scale"]
    picker = GradCamPicker(model, x, [0, 1, 2, 3], ["net.features.6"])
    parts = picker.compute("net.features.6", 1, 0, weights="random")
    assert not torch.equal(picker._random.scale, model.scale) and torch.equal(model.scale, torch.tensor([2.0]))
    assert all(not torch.equal(a, b) for a, b in zip(picker._random.parameters(), model.parameters(), strict=True))
    said = "parameters outside any layer, re-drawn from a normal of their own mean and std: 'scale'"
    assert said in picker.describe(parts)

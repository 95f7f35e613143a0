"""hooklab.record on a broad sample of real architectures: every record holds what a hand-made
``.detach().clone()`` recorder saw, every gradient a tensor hook on a module's output receives is
recorded (EfficientNet's and ConvNeXt's StochasticDepth returns its input, which the block then
changes in place), and no hook is left. Random weights, batch 1, small inputs where the model allows."""

from __future__ import annotations

import pytest
import torch
import torchvision.models as tv
from torch import nn

from hooklab import NoGradientError, record
from hooklab.audit import leftover_hooks
from hooklab.recording import tensors_in


def hand_recorder(model: nn.Module, x: torch.Tensor, names: list[str]):
    """Outputs (copied) and the gradients that tensor hooks on them receive, per (name, call)."""
    outputs, grads, calls, handles = {}, {}, {}, []

    def forward_hook(name):
        def keep(module, args, output):
            key = (name, calls.setdefault(name, 0))
            calls[name] += 1
            tensors = tensors_in(output)
            outputs[key] = [t.detach().clone() for t in tensors]
            for i, t in enumerate(tensors):
                if t.requires_grad:
                    handles.append(t.register_hook(lambda g, at=(key, i): grads.__setitem__(at, g.detach().clone())))

        return keep

    try:
        for name in names:
            handles.append(model.get_submodule(name).register_forward_hook(forward_hook(name)))
        run(model, x)
    finally:
        for handle in handles:
            handle.remove()
    return outputs, grads


def run(model: nn.Module, x: torch.Tensor) -> None:
    out = model(x)
    if isinstance(out, tuple):  # LSTM: (output, (h, c))
        out = out[0]
    out.float().sum().backward()


def check_against_hand_hooks(model: nn.Module, x: torch.Tensor) -> None:
    model.eval()
    with record(model, backward=True) as rec:
        run(model, x)
    names = list(dict.fromkeys(r.name for r in rec))
    outputs, grads = hand_recorder(model, x, names)
    assert [(r.name, r.call) for r in rec] == list(outputs), "the same calls, in the same order"
    for r in rec:
        got = tensors_in(r.output)
        assert len(got) == len(outputs[r.name, r.call])
        for mine, hand in zip(got, outputs[r.name, r.call], strict=True):
            assert torch.equal(mine, hand), f"{r.name} call {r.call}: output differs"
    assert grads, "the hand-made hooks must see gradients"
    for ((name, call), i), grad in grads.items():
        r = rec.calls(name)[call]
        try:
            mine = r.grad_output[i]
        except NoGradientError as error:
            raise AssertionError(f"{name} call {call}: a tensor hook got a gradient, record did not: {error}") from None
        torch.testing.assert_close(mine, grad, msg=f"{name} call {call}: grad_output[{i}] differs")
    assert not leftover_hooks(model)


def images(size: int) -> torch.Tensor:
    return torch.randn(1, 3, size, size)


# (builder, input size): each builds with random weights (weights=None is the default)
ZOO = {
    "resnet18": (tv.resnet18, 64),
    "efficientnet_b0": (tv.efficientnet_b0, 64),
    "efficientnet_v2_s": (tv.efficientnet_v2_s, 64),
    "convnext_tiny": (tv.convnext_tiny, 64),
    "vit_b_16": (lambda: tv.vit_b_16(image_size=32), 32),
    "swin_t": (tv.swin_t, 64),
    "swin_v2_t": (tv.swin_v2_t, 64),
    "densenet121": (tv.densenet121, 64),
    "mobilenet_v3_small": (tv.mobilenet_v3_small, 64),
    "regnet_y_400mf": (tv.regnet_y_400mf, 64),
    "inception_v3": (lambda: tv.inception_v3(init_weights=False), 75),
    "googlenet": (lambda: tv.googlenet(init_weights=False), 64),
    "shufflenet_v2_x0_5": (tv.shufflenet_v2_x0_5, 64),
    "squeezenet1_1": (tv.squeezenet1_1, 64),
    "mnasnet0_5": (tv.mnasnet0_5, 64),
}
SLOW = {
    "maxvit_t": (tv.maxvit_t, 224),  # MaxViT needs 224×224
    "vgg11": (tv.vgg11, 32),  # 133 million parameters to build
}


@pytest.mark.parametrize("name", list(ZOO))
def test_torchvision_classifiers(name):
    build, size = ZOO[name]
    check_against_hand_hooks(build(), images(size))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW))
def test_slow_torchvision_classifiers(name):
    build, size = SLOW[name]
    check_against_hand_hooks(build(), images(size))


def test_transformer_encoder():
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    check_against_hand_hooks(model, torch.randn(1, 5, 16, requires_grad=True))


def test_lstm():
    model = nn.Sequential(nn.Linear(4, 8), nn.LSTM(8, 6, num_layers=2, batch_first=True))
    check_against_hand_hooks(model, torch.randn(1, 7, 4))


class Twice(nn.Module):
    """One Linear layer called twice, with an in-place write into its first output in between."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.lin(x)
        y += 1
        return self.act(self.lin(y))


def test_a_layer_called_twice():
    model = Twice()
    check_against_hand_hooks(model, torch.randn(1, 4))
    with record(model, backward=True) as rec:
        model(torch.randn(1, 4)).sum().backward()
    assert [r.call for r in rec.calls("lin")] == [0, 1]


def test_stochastic_depth_gets_its_input_back_and_grad_input_equals_grad_output():
    model = tv.efficientnet_b0().eval()
    with record(model, "features.2.1.stochastic_depth", backward=True) as rec:
        model(images(64)).sum().backward()
    r = rec["features.2.1.stochastic_depth"]
    torch.testing.assert_close(r.grad_input[0], r.grad_output[0], rtol=0, atol=0)
    assert torch.equal(r.inputs[0], r.output)

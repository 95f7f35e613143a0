"""hooklab.record: what it records, that it never returns overwritten values, that it cleans up."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from hooklab import NoGradientError, UnknownLayerError, record
from hooklab.audit import leftover_hooks
from hooklab.recording import Record


def mlp(inplace: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.ReLU(inplace=inplace), nn.Linear(5, 2), nn.Tanh())


def full_hook_reference(model: nn.Module, x: torch.Tensor):
    """grad_input/grad_output of every child from PyTorch's own full backward hooks."""
    got = {}
    handles = [
        m.register_full_backward_hook(lambda m, gi, go, n=n: got.__setitem__(n, (gi, go)))
        for n, m in model.named_children()
    ]
    try:
        model(x).sum().backward()
    finally:
        for h in handles:
            h.remove()
    return got


def test_records_every_leaf_in_execution_order():
    model = mlp()
    with record(model) as rec:
        model(torch.randn(4, 3))
    assert [r.name for r in rec] == ["0", "1", "2", "3"]
    assert [r.module_type for r in rec] == ["Linear", "ReLU", "Linear", "Tanh"]
    assert [r.call for r in rec] == [0, 0, 0, 0]
    assert rec["2"].output.shape == (4, 2)
    assert not rec["2"].output.requires_grad


def test_select_by_name_and_type():
    model = mlp()
    with record(model, ["2", "0"]) as by_name, record(model, types=nn.Linear) as by_type:
        model(torch.randn(1, 3))
    assert [r.name for r in by_name] == ["0", "2"]  # execution order, not the order asked
    assert by_type.names == ["0", "2"]


def test_in_place_relu_does_not_overwrite_the_linear_record():
    model = mlp(inplace=True)
    x = torch.randn(8, 3)
    expected = model[0](x).detach()
    assert (expected < 0).any(), "the test needs negative pre-activations"
    with record(model) as rec:
        model(x)
    torch.testing.assert_close(rec["0"].output, expected, rtol=0, atol=0)
    torch.testing.assert_close(rec["1"].output, expected.clamp(min=0), rtol=0, atol=0)


def test_resnet_block_records_survive_out_plus_identity_and_in_place_relu():
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    block = model.layer1[0]
    with record(model, ["layer1.0.bn2", "layer1.0.relu"]) as rec:
        model(x)
    # recompute bn2's true output from the block's own layers
    with torch.no_grad():
        stem = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        expected = block.bn2(block.conv2(block.relu(block.bn1(block.conv1(stem)))))
    torch.testing.assert_close(rec["layer1.0.bn2"].output, expected)
    assert (rec["layer1.0.bn2"].output < 0).any()


def test_module_called_twice_has_two_records():
    model = torchvision.models.resnet18(weights=None).eval()
    with record(model, "layer1.0.relu") as rec:
        model(torch.randn(1, 3, 32, 32))
    calls = rec.calls("layer1.0.relu")
    assert [r.call for r in calls] == [0, 1]
    assert rec["layer1.0.relu"] is calls[1]
    assert not torch.equal(calls[0].output, calls[1].output)


def test_a_layers_output_and_the_next_layers_input_share_one_copy_until_a_write():
    model = mlp(inplace=True)
    with torch.no_grad(), record(model) as rec:
        model(torch.randn(4, 3))
    assert rec["1"].inputs[0] is rec["0"].output, "no in-place write in between: one copy"
    assert rec["2"].inputs[0] is rec["1"].output
    assert not torch.equal(rec["1"].inputs[0], rec["1"].output), "the in-place ReLU wrote: a second copy"


def test_backward_records_match_full_backward_hooks():
    model = mlp(inplace=False)
    x = torch.randn(4, 3, requires_grad=True)
    reference = full_hook_reference(model, x)
    with record(model, backward=True) as rec:
        model(x).sum().backward()
    for name, (grad_input, grad_output) in reference.items():
        torch.testing.assert_close(rec[name].grad_output[0], grad_output[0])
        torch.testing.assert_close(rec[name].grad_input[0], grad_input[0])


def test_a_layers_grad_input_and_the_previous_layers_grad_output_share_one_copy():
    """The same gradient tensor reaches both tensor hooks (the ReLU's input is the Linear's output):
    one copy serves both records, as for a layer's output and the next layer's input."""
    model = mlp(inplace=False)
    with record(model, backward=True) as rec:
        model(torch.randn(4, 3)).sum().backward()
    assert rec["1"].grad_input[0] is rec["0"].grad_output[0]


def test_backward_through_in_place_relu_and_resnet_does_not_crash_and_is_right():
    inplace, plain = mlp(inplace=True), mlp(inplace=False)
    x = torch.randn(6, 3, requires_grad=True)
    reference = full_hook_reference(plain, x)
    with record(inplace, backward=True) as rec:
        inplace(x).sum().backward()
    for name, (grad_input, grad_output) in reference.items():
        torch.testing.assert_close(rec[name].grad_input[0], grad_input[0])
        torch.testing.assert_close(rec[name].grad_output[0], grad_output[0])

    model = torchvision.models.resnet18(weights=None).eval()
    img = torch.randn(1, 3, 32, 32)
    with record(model, ["layer1.0.bn2", "fc"], backward=True) as rec:
        model(img)[0, 3].backward()
    assert rec["fc"].grad_output[0][0, 3] == 1
    assert rec["layer1.0.bn2"].grad_output[0].shape == (1, 64, 8, 8)


def test_grad_input_is_per_module_when_an_input_has_two_users():
    lin1, lin2 = nn.Linear(3, 3), nn.Linear(3, 3)
    model = nn.ModuleDict({"a": lin1, "b": lin2})
    x = torch.randn(2, 3, requires_grad=True)
    with record(model, backward=True) as rec:
        (lin1(x).sum() + 10 * lin2(x).sum()).backward()
    torch.testing.assert_close(rec["a"].grad_input[0], torch.ones(2, 3) @ lin1.weight)
    torch.testing.assert_close(rec["b"].grad_input[0], 10 * torch.ones(2, 3) @ lin2.weight)


def test_first_layer_grad_input_is_none_when_input_needs_no_grad():
    model = mlp()
    with record(model, backward=True) as rec:
        model(torch.randn(2, 3)).sum().backward()
    assert rec["0"].grad_input == (None,)


def test_no_gradient_errors_say_why():
    model = mlp()
    with pytest.warns(UserWarning, match="built no graph"), record(model, backward=True) as rec:
        with torch.no_grad():
            model(torch.randn(2, 3))
    with pytest.raises(NoGradientError, match="gradients disabled"):
        _ = rec["0"].grad_output
    with record(model, backward=True) as rec:
        model(torch.randn(2, 3))
    with pytest.raises(NoGradientError, match="call backward"):
        _ = rec["0"].grad_output


def test_a_write_after_the_block_leaves_the_record_as_it_was():
    model = nn.Sequential(nn.Linear(2, 2))
    with record(model) as rec:
        out = model(torch.randn(1, 2))
    expected = out.detach().clone()
    with torch.no_grad():
        out.mul_(0)
    assert out.abs().sum() == 0
    torch.testing.assert_close(rec["0"].output, expected, rtol=0, atol=0)


def test_hooks_removed_on_normal_exit_and_on_error():
    model = mlp()
    with record(model, backward=True):
        assert leftover_hooks(model)
        model(torch.randn(1, 3))
    assert leftover_hooks(model) == []
    with pytest.raises(ValueError, match="boom"):
        with record(model, backward=True):
            model(torch.randn(1, 3))
            raise ValueError("boom")
    assert leftover_hooks(model) == []


def test_a_record_shows_what_a_student_reads():
    """Its public fields are the ones the course uses; the repr stays the one notebooks print."""
    public = [f.name for f in dataclasses.fields(Record) if not f.name.startswith("_")]
    assert public == ["name", "module_type", "call", "inputs", "kwargs", "output"]
    model = mlp()
    with record(model, "0") as rec:
        model(torch.randn(4, 3))
        model(torch.randn(4, 3))
    assert repr(rec.calls("0")[0]) == "Record('0', Linear, output (4, 5))"
    assert repr(rec["0"]) == "Record('0', call=1, Linear, output (4, 5))"


def test_repeated_forwards_are_all_recorded_and_clear_forgets_them():
    model = mlp()
    with record(model, "0") as rec:
        for _ in range(3):
            model(torch.randn(1, 3))
        assert [r.call for r in rec] == [0, 1, 2]
        rec.clear()
        model(torch.randn(1, 3))
    assert len(rec) == 1 and rec["0"].call == 0


def test_unknown_layer_lists_close_matches():
    model = torchvision.models.resnet18(weights=None)
    with pytest.raises(UnknownLayerError) as info:
        record(model, "layer4.2.conv1")
    message = str(info.value)
    assert message.startswith("ResNet has no layer named 'layer4.2.conv1'; close matches:")
    assert "'layer4.1.conv1'" in message
    with pytest.raises(UnknownLayerError, match="its layers are"):
        record(mlp(), "encoder")


def test_summary_lists_each_call():
    model = mlp()
    with record(model) as rec:
        model(torch.randn(2, 3))
    lines = rec.summary().splitlines()
    assert len(lines) == 5
    assert lines[1].split() == ["0", "0", "0", "Linear", "(2,", "5)"]
    # every column starts where its header does, also with names shorter than "layer"
    header, row = lines[0], lines[1]
    assert row.index("Linear") == header.index("type")
    assert row.index("(2, 5)") == header.index("output shape")
    assert row[: header.index("call") + len("call")].endswith("0")  # the call number ends under "call"


def test_an_in_place_module_records_the_input_it_received():
    """A forward hook sees ``args`` after forward ran; the record keeps them from before."""
    model = mlp(inplace=True)
    x = torch.randn(8, 3)
    pre_activation = model[0](x).detach()
    assert (pre_activation < 0).any(), "the test needs negative pre-activations"
    with record(model) as rec:
        model(x)
    torch.testing.assert_close(rec["1"].inputs[0], pre_activation, rtol=0, atol=0)
    torch.testing.assert_close(rec["1"].output, pre_activation.clamp(min=0), rtol=0, atol=0)


def test_without_gradients_records_hold_what_was_produced():
    """Under no_grad too, writes inside the block (the in-place ReLU, your own code) and after it
    leave the records as they were."""
    model = mlp(inplace=True)
    x = torch.randn(8, 3)
    expected = model[0](x).detach()
    with torch.no_grad(), record(model) as rec:
        out = model(x)
        out.mul_(0)  # the Tanh's output
    torch.testing.assert_close(rec["0"].output, expected, rtol=0, atol=0)
    torch.testing.assert_close(rec["1"].inputs[0], expected, rtol=0, atol=0)  # before the in-place ReLU
    torch.testing.assert_close(rec["1"].output, expected.clamp(min=0), rtol=0, atol=0)
    assert rec["3"].output.abs().sum() > 0 and out.abs().sum() == 0


def test_under_inference_mode_records_hold_what_was_produced():
    model = mlp(inplace=True)
    x = torch.randn(8, 3)
    expected = model[0](x).detach()
    with torch.inference_mode(), record(model) as rec:
        out = model(x)
        out.mul_(0)
    with torch.inference_mode():
        out.add_(1)  # after the block too
    torch.testing.assert_close(rec["0"].output, expected, rtol=0, atol=0)
    torch.testing.assert_close(rec["1"].inputs[0], expected, rtol=0, atol=0)
    assert rec["3"].output.abs().sum() > 0


class AddOneInPlace(nn.Module):
    """A custom module that writes into its input and has no `inplace` flag to say so."""

    def forward(self, x):
        return x.add_(1)


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_a_custom_module_writing_into_its_input_records_the_input_it_received(grad):
    model = nn.Sequential(nn.Linear(2, 2), AddOneInPlace())
    x = torch.randn(3, 2)
    with torch.set_grad_enabled(grad), record(model) as rec:
        model(x)
    before = model[0](x).detach()
    torch.testing.assert_close(rec["1"].inputs[0], before, rtol=0, atol=0)
    torch.testing.assert_close(rec["1"].output, before + 1, rtol=0, atol=0)
    torch.testing.assert_close(rec["0"].output, before, rtol=0, atol=0)


class MulZeroInPlace(torch.autograd.Function):
    """A custom autograd function writing into its input from inside."""

    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x.mul_(0)

    @staticmethod
    def backward(ctx, grad):
        return grad * 0


OVERWRITES = {
    "method_": lambda t: t.mul_(0),
    "+=": lambda t: t.__iadd__(100),
    "setitem": lambda t: t.__setitem__(0, 42.0),
    "inplace=True": lambda t: F.relu(t, inplace=True),
    "out=": lambda t: torch.mul(t, 0, out=t),
    "view": lambda t: t[:1].zero_(),
    "foreach": lambda t: torch._foreach_mul_([t], 0.0),  # what optimizers do
    ".data": lambda t: t.data.mul_(0),  # no version bump
    "numpy": lambda t: t.numpy().__setitem__(slice(None), 0.0),
    "autograd.Function": lambda t: MulZeroInPlace.apply(t),
}


@pytest.mark.parametrize("after_the_block", [False, True], ids=["inside", "after"])
@pytest.mark.parametrize("overwrite", OVERWRITES.values(), ids=OVERWRITES.keys())
def test_records_keep_the_value_the_module_produced(overwrite, after_the_block):
    model = nn.Linear(3, 3)
    x = torch.randn(2, 3)
    with torch.no_grad():
        expected = model(x)
        with record(model) as rec:
            out = model(x)
            if not after_the_block:
                overwrite(out)
        if after_the_block:
            overwrite(out)
    assert not torch.equal(out, expected), "the overwrite must really change the output"
    torch.testing.assert_close(rec[""].output, expected, rtol=0, atol=0)


IN_PLACE_LAYERS = {
    "ReLU": lambda: nn.ReLU(inplace=True),
    "LeakyReLU": lambda: nn.LeakyReLU(0.1, inplace=True),
    "ReLU6": lambda: nn.ReLU6(inplace=True),
    "ELU": lambda: nn.ELU(inplace=True),
    "SiLU": lambda: nn.SiLU(inplace=True),
    "Hardswish": lambda: nn.Hardswish(inplace=True),
    "Threshold": lambda: nn.Threshold(0.1, 20.0, inplace=True),
    "Dropout": lambda: nn.Dropout(0.5, inplace=True).train(),
}


@pytest.mark.parametrize("make", IN_PLACE_LAYERS.values(), ids=IN_PLACE_LAYERS.keys())
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_every_in_place_layer_leaves_the_records_before_it_intact(make, grad):
    model = nn.Sequential(nn.Linear(3, 6), make())
    x = torch.randn(5, 3)
    expected = model[0](x).detach()
    with torch.set_grad_enabled(grad), record(model) as rec:
        out = model(x)
    assert not torch.equal(out.detach(), expected), "the layer must really write into its input"
    torch.testing.assert_close(rec["0"].output, expected, rtol=0, atol=0)
    torch.testing.assert_close(rec["1"].inputs[0], expected, rtol=0, atol=0)
    torch.testing.assert_close(rec["1"].output, out.detach(), rtol=0, atol=0)


def test_a_compiled_model_is_recorded():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(5, 3)
    with torch.no_grad():
        expected = model[0](x)
    torch._dynamo.reset()
    try:
        with record(compiled) as rec:
            compiled(x)
        torch.testing.assert_close(rec["_orig_mod.0"].output, expected, rtol=0, atol=0)
        torch.testing.assert_close(rec["_orig_mod.1"].inputs[0], expected, rtol=0, atol=0)
    finally:  # compiled code must not outlive the test
        torch._dynamo.reset()


def test_an_output_is_returned_as_the_module_made_it_when_recording_gradients():
    """With backward=True the recorder hands each module views of its inputs and swaps its real
    inputs back into the output where the module returned them; any other output, a dict subclass
    included, is passed on as the very object the module returned."""
    from collections import OrderedDict

    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 2), nn.Linear(3, 1)

        def forward(self, x):
            self.made = OrderedDict(a=self.a(x), b=self.b(x), x=x)
            return self.made

    model, x = Heads(), torch.randn(4, 3, requires_grad=True)
    with record(model, [""], backward=True) as rec:
        out = model(x)
        out["a"].sum().backward()
    assert type(out) is OrderedDict and out["x"] is x  # the real input came back, in the module's own type
    assert type(rec[""].output) is OrderedDict
    with record(model, ["a"], backward=True):
        assert model(x) is model.made

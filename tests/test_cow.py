"""hooklab.cow: which calls count as writes, and what happens to a write the guard cannot see."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hooklab import StaleRecordError, record
from hooklab.cow import CopyOnWrite, writes_into


def writes(fn) -> int:
    """How many tensors the guard is told about while ``fn`` runs."""
    seen = []
    with CopyOnWrite(seen.append):
        fn()
    return len(seen)


def test_in_place_calls_are_writes_and_others_are_not():
    x, y = torch.randn(3), torch.randn(3)

    def augmented():
        z = x.clone()
        z += 1

    def item():
        z = x.clone()
        z[0] = 1

    assert writes(lambda: x.clone().add_(1)) == 1
    assert writes(augmented) == 1
    assert writes(item) == 1
    assert writes(lambda: F.relu(x.clone(), inplace=True)) == 1
    assert writes(lambda: torch.add(x, y, out=torch.empty(3))) == 1
    assert writes(lambda: (torch.relu(x), x.add(1), x * y, F.relu(x))) == 0


def test_writes_into_names_the_written_tensor():
    a, b = torch.zeros(2), torch.zeros(2)
    assert writes_into(torch.Tensor.add_, (a, b), {}) == [a]
    assert writes_into(torch.add, (a, b), {"out": b}) == [b]
    assert writes_into(torch.add, (a, b), {}) == []


@pytest.mark.parametrize(
    "overwrite",
    [
        lambda t: t.mul_(0),
        lambda t: t.__iadd__(100),
        lambda t: t.__setitem__(0, 42.0),
        lambda t: F.relu(t, inplace=True),
        lambda t: torch.mul(t, 0, out=t),
        lambda t: t[:1].zero_(),  # a write through a view
    ],
    ids=["method_", "+=", "setitem", "inplace=True", "out=", "view"],
)
def test_records_keep_the_value_the_module_produced(overwrite):
    model = nn.Linear(3, 3)
    x = torch.randn(2, 3)
    expected = model(x).detach()
    with record(model) as rec:
        out = model(x)  # part of the graph: kept by reference, guarded
        with torch.no_grad():
            overwrite(out)
    assert not torch.equal(out.detach(), expected), "the overwrite must really change the output"
    torch.testing.assert_close(rec[""].output, expected, rtol=0, atol=0)


def test_a_write_the_guard_cannot_see_is_reported_not_returned():
    model = nn.Linear(3, 3)
    with record(model) as rec:
        out = model(torch.randn(2, 3))
        with torch.no_grad():
            torch.ops.aten.mul_.Tensor(out, torch.tensor(0.0))  # its name has no trailing "_"
    with pytest.raises(StaleRecordError):
        _ = rec[""].output


IN_PLACE_LAYERS = {
    "ReLU": lambda: nn.ReLU(inplace=True),
    "LeakyReLU": lambda: nn.LeakyReLU(0.1, inplace=True),  # passes its flag by position to F.leaky_relu
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
    """The guard sees every in-place layer's write, however the layer passes its flag."""
    model = nn.Sequential(nn.Linear(3, 6), make())
    x = torch.randn(5, 3)
    expected = model[0](x).detach()
    with torch.set_grad_enabled(grad), record(model) as rec:
        out = model(x)
    assert not torch.equal(out.detach(), expected), "the layer must really write into its input"
    torch.testing.assert_close(rec["0"].output, expected, rtol=0, atol=0)
    torch.testing.assert_close(rec["1"].inputs[0], expected, rtol=0, atol=0)
    torch.testing.assert_close(rec["1"].output, out.detach(), rtol=0, atol=0)


def test_a_layer_that_raises_leaves_the_guard_on_for_the_rest_of_the_block():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3).eval(), nn.ReLU(inplace=True))
    x = torch.randn(4, 3)
    with record(model) as rec:
        with pytest.raises(RuntimeError):
            model[1](torch.randn(4, 5))  # raises: wrong size
        assert torch._C._len_torch_function_stack() == 1, "the guard must be back on"
        out = model(x)
        expected = out.detach().clone()
        with torch.no_grad():
            out.mul_(0)  # caught by the guard: the ReLU's record is copied first
    assert torch._C._len_torch_function_stack() == 0
    assert [r.name for r in rec] == ["0", "1", "2"], "the failed call leaves no record"
    torch.testing.assert_close(rec["2"].output, expected, rtol=0, atol=0)


def test_another_function_mode_inside_the_block_is_kept_and_keeps_the_guard_on():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3).eval())
    recording = record(model)
    recording.__enter__()
    device = torch.device("cpu")  # a torch function mode of its own
    device.__enter__()
    try:
        out = model(torch.randn(4, 3))
        expected = out.detach().clone()
        with torch.no_grad():
            out.add_(1)
    finally:
        recording.__exit__(None, None, None)  # ends before the mode entered inside it
    try:
        assert torch._C._len_torch_function_stack() == 1, "only the device mode is left"
    finally:
        device.__exit__(None, None, None)
    torch.testing.assert_close(recording["1"].output, expected, rtol=0, atol=0)

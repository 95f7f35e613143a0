"""hooklab.keep: records hold lazy copies that keep what the module produced, whatever writes
into the model's tensors later and however it writes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hooklab import record
from hooklab.keep import LAZY_COPIES


def address(t: torch.Tensor) -> int:
    """Where a tensor's numbers are, without asking for write access (``data_ptr()`` would, and a
    lazy copy answers that by copying)."""
    return torch._C._data_address(t)


def test_this_pytorch_makes_lazy_copies_that_copy_on_the_first_write():
    """The private PyTorch function hooklab.keep relies on: if an upgrade changes it, this fails
    (and records fall back to copies made at once when it is gone)."""
    assert LAZY_COPIES
    a = torch.randn(1000)
    b = torch._lazy_clone(a)
    assert address(a) == address(b), "a lazy copy shares the memory"
    expected = a.clone()
    a.mul_(0)
    assert address(a) != address(b), "the first write gives the writer memory of its own"
    assert torch.equal(b, expected) and a.abs().sum() == 0


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
    "aten op": lambda t: torch.ops.aten.mul_.Tensor(t, torch.tensor(0.0)),  # no Python function at all
    "foreach": lambda t: torch._foreach_mul_([t], 0.0),  # what optimizers do
    ".data": lambda t: t.data.mul_(0),  # no version bump either
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


def test_records_share_memory_until_a_write_and_then_one_copy_is_made():
    model = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))
    x = torch.randn(4, 3)
    with torch.no_grad(), record(model) as rec:
        out = model(x)
    hidden = rec["0"].output
    # the first Linear's output is the ReLU's input: two records, one block of memory, no copy
    assert address(rec["1"].inputs[0]) == address(hidden)
    assert address(rec["2"].output) == address(out)
    out.zero_()  # the model's tensor gets new memory; the record keeps the old
    assert address(rec["2"].output) != address(out) and rec["2"].output.abs().sum() > 0


def test_a_layer_that_raises_leaves_recording_working_for_the_rest_of_the_block():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3).eval(), nn.ReLU(inplace=True))
    x = torch.randn(4, 3)
    with record(model) as rec:
        with pytest.raises(RuntimeError):
            model[1](torch.randn(4, 5))  # raises: wrong size
        out = model(x)
        expected = out.detach().clone()
        with torch.no_grad():
            out.mul_(0)
    assert [r.name for r in rec] == ["0", "1", "2"], "the failed call leaves no record"
    torch.testing.assert_close(rec["2"].output, expected, rtol=0, atol=0)


def test_without_lazy_copies_records_are_copied_at_once(monkeypatch):
    """What a PyTorch without torch._lazy_clone gets: the same records, each its own copy."""
    monkeypatch.setattr("hooklab.keep.LAZY_COPIES", False)
    model = nn.Sequential(nn.Linear(3, 6), nn.ReLU(inplace=True))
    x = torch.randn(4, 3)
    with torch.no_grad():
        expected = model[0](x)
        with record(model) as rec:
            out = model(x)
            out.zero_()
    torch.testing.assert_close(rec["0"].output, expected, rtol=0, atol=0)
    torch.testing.assert_close(rec["1"].inputs[0], expected, rtol=0, atol=0)
    assert not torch._C._is_cow_tensor(rec["0"].output)
    assert address(rec["1"].output) != address(out)


def test_memory_pytorch_does_not_own_is_copied_at_once():
    """torch.from_numpy shares NumPy's memory, of which PyTorch cannot make a lazy copy."""
    array = np.ones((2, 3), dtype=np.float32)
    x = torch.from_numpy(array)
    with pytest.raises(RuntimeError):
        torch._lazy_clone(x)  # what keep falls back from
    model = nn.Sequential(nn.ReLU(inplace=True))
    with record(model, backward=True) as rec:  # backward=True keeps every input in a pre-hook
        model(x)
    array[:] = 5.0
    torch.testing.assert_close(rec["0"].inputs[0], torch.ones(2, 3), rtol=0, atol=0)


class WritesThroughData(nn.Module):
    """Runs ``a``, doubles its output through ``.data`` (no version bump), then runs ``b``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Identity(), nn.Identity()

    def forward(self, x):
        t = self.a(x * 1)
        t.data.mul_(2)
        return self.b(t)


@pytest.mark.parametrize("clone", [False, True], ids=["lazy", "clone"])
def test_a_write_between_two_layers_that_bumps_no_version_is_seen(clone):
    with record(WritesThroughData(), clone=clone) as rec:
        rec.model(torch.ones(3))
    assert torch.equal(rec["a"].output, torch.ones(3))
    assert torch.equal(rec["b"].inputs[0], torch.full((3,), 2.0))


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_a_small_view_of_a_large_block_is_copied_so_the_block_can_be_freed(grad):
    """A lazy copy of a view shares the view's whole memory block: the class token x[:, 0] of a
    (256, 197, 64) activation would keep 197 times its own size alive."""

    class ClassToken(nn.Module):
        def forward(self, x):
            return x[:, 0]

    model = nn.Sequential(nn.Identity(), ClassToken())
    with torch.set_grad_enabled(grad), record(model, "1") as rec:
        model(torch.randn(256, 197, 64, requires_grad=grad) * 1)
    token = rec["1"].output
    assert token.untyped_storage().nbytes() == token.numel() * token.element_size()
    small = torch.randn(4, 3)  # small blocks are not worth a copy: shared as usual
    with torch.no_grad(), record(model, "1") as rec:
        model(small)
    assert address(rec["1"].output) == address(small)


def test_a_numpy_array_made_before_recording_is_not_seen_by_lazy_copies():
    """What the module docstring warns about: PyTorch cannot see an array that already points at
    the memory. Writes through it change the record, and once the tensor is written through
    PyTorch it moves to new memory and the array stops following it. clone=True avoids both."""
    model = nn.Sequential(nn.Identity())
    for clone in (False, True):
        x = torch.ones(3)
        array = x.numpy()
        with record(model, clone=clone) as rec:
            model(x)
        array[:] = 7.0
        assert torch.equal(rec["0"].output, torch.full((3,), 1.0 if clone else 7.0))
        x.add_(1)
        assert array[0] == (8.0 if clone else 7.0), "the array still follows x only with clone=True"


def test_a_compiled_model_is_recorded_with_copies_dynamo_can_trace():
    """Dynamo cannot trace torch._lazy_clone (it warns and breaks the graph): under torch.compile
    records are copied at once, and still hold what each layer produced."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(5, 3)
    with torch.no_grad():
        expected = model[0](x)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with record(compiled) as rec:
            compiled(x)
    assert not [w for w in caught if "Dynamo does not know how to trace" in str(w.message)]
    torch.testing.assert_close(rec["_orig_mod.0"].output, expected, rtol=0, atol=0)
    torch.testing.assert_close(rec["_orig_mod.1"].inputs[0], expected, rtol=0, atol=0)
    torch._dynamo.reset()

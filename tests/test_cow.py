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

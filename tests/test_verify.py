"""hooklab.backprop.verify: the per-layer comparison table, every supported layer type, clear refusals."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hooklab.backprop import BACKWARD, UnsupportedLayerError, compare, sigmoid_backward, verify
from hooklab.models import DigitsCNN, TinyConvNet, TinySigmoidNet


def test_compare_rows_say_exact_close_and_how_far():
    t = torch.tensor([1.0, 2.0])
    same = compare("a", t.clone(), t)
    assert (same.exact, same.close, same.max_diff, same.shape) == (True, True, 0.0, (2,))
    near = compare("b", t + 1e-7, t)
    assert (near.exact, near.close) == (False, True) and 0 < near.max_diff < 1e-6
    far = compare("c", t + 0.1, t)
    assert (far.exact, far.close) == (False, False) and far.max_diff == pytest.approx(0.1)
    with pytest.raises(ValueError, match="shape"):
        compare("d", t[:1], t)


def test_float64_is_compared_at_float64_tolerances():
    t = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert compare("rounding", t + 1e-15, t).close
    wrong = compare("wrong at 1e-6", t + 1e-6, t)  # accepted at float32's tolerances, not at float64's
    assert not wrong.close and wrong.diff_text == "1.0e-06"
    assert compare("float32", t.float() + 1e-6, t.float()).close


def test_rounding_sized_differences_are_printed_as_a_bound():
    t = torch.tensor([1.0, 2.0])
    assert compare("a", t.clone(), t).diff_text == "0"
    near = compare("b", t + 1e-7, t)  # the digits of such a difference change with the CPU
    assert near.diff_text == "< 1e-05" and near.line().endswith(" < 1e-05")
    assert compare("c", t.double() + 1e-9, t.double()).diff_text == "< 1e-07"  # float64's atol
    big = torch.tensor([1e3, 2e3])
    relative = compare("d", big + 1e-3, big)  # close by rtol, above atol: printed as it is
    assert relative.close and relative.diff_text == f"{relative.max_diff:.1e}"
    assert compare("e", t + 0.1, t).diff_text == "1.0e-01"


# One small model per supported layer type (the last test checks that none is missing).
CASES = {
    nn.Linear: (lambda: nn.Sequential(nn.Linear(4, 3)), (5, 4)),
    nn.Sigmoid: (lambda: nn.Sequential(nn.Linear(4, 3), nn.Sigmoid()), (5, 4)),
    nn.Tanh: (lambda: nn.Sequential(nn.Linear(4, 3), nn.Tanh()), (5, 4)),
    nn.ReLU: (lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU(inplace=True)), (5, 4)),
    nn.LeakyReLU: (lambda: nn.Sequential(nn.Linear(4, 3), nn.LeakyReLU(0.1, inplace=True)), (5, 4)),
    nn.Conv2d: (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2),
                                      nn.Conv2d(4, 3, 3, padding="same", dilation=2)), (2, 2, 7, 6)),
    nn.MaxPool2d: (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(3, 2, 1, ceil_mode=True)), (2, 1, 8, 8)),
    nn.AvgPool2d: (lambda: nn.Sequential(nn.Conv2d(1, 2, 1), nn.AvgPool2d(3, 2, 1, count_include_pad=False)),
                   (2, 1, 7, 7)),
    nn.AdaptiveAvgPool2d: (lambda: nn.Sequential(nn.Conv2d(1, 2, 1), nn.AdaptiveAvgPool2d((2, 3))), (2, 1, 5, 7)),
    nn.BatchNorm1d: (lambda: nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)), (6, 4)),
    nn.BatchNorm2d: (lambda: nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3)), (4, 1, 5, 5)),
    nn.LayerNorm: (lambda: nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6)), (5, 4)),
    nn.Flatten: (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(18, 2)), (3, 1, 5, 5)),
    nn.Dropout: (lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 2)), (6, 4)),
    nn.Identity: (lambda: nn.Sequential(nn.Linear(4, 3), nn.Identity()), (5, 4)),
}


@pytest.mark.parametrize("layer_type", list(CASES), ids=lambda t: t.__name__)
def test_every_supported_layer_type_verifies(layer_type):
    make, shape = CASES[layer_type]
    model = make()
    result = verify(model, torch.randn(*shape), loss="mse", target=torch.randn_like(model(torch.randn(*shape))))
    assert result.ok, result.table()
    names = [r.name for r in result.rows]
    for name, module in model.named_children():
        assert f"{name}.grad_input" in names
        for pname, _ in module.named_parameters():
            assert f"{name}.{pname}.grad" in names
    assert any(isinstance(m, layer_type) for m in model.modules())


def test_every_table_entry_has_a_case():
    assert set(CASES) == set(BACKWARD)


def test_a_wrong_formula_shows_up_in_the_table(monkeypatch):
    monkeypatch.setitem(BACKWARD, nn.Sigmoid, lambda m, x, out, dout: (dout * out * (1 + out), {}))
    result = verify(TinySigmoidNet(), torch.tensor([[0.05, 0.1]]))
    bad = [r.name for r in result.rows if not r.close]
    assert bad == ["s1.grad_input", "s2.grad_input"] and not result.ok


def test_seed_net_matches_to_the_last_bit():
    result = verify(TinySigmoidNet(), torch.tensor([[0.05, 0.1]]))
    assert all(r.exact for r in result.rows) and len(result.rows) == 8
    assert sigmoid_backward(torch.tensor([0.5]), torch.tensor([1.0])).item() == 0.25


def test_table_columns_line_up_for_any_name_and_shape_length():
    model = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
    table = verify(model, torch.randn(12, 16, 10, 10)).table().splitlines()  # shape wider than 14
    assert table[0].split() == ["tensor", "shape", "exact", "allclose", "max", "|diff|"]
    for column in ("exact", "allclose", "max |diff|"):
        start = table[0].index(column)
        for line in table[1:]:  # each value starts where its header does, after a blank
            assert line[start - 1] == " " and line[start] != " ", (column, line)
    assert "(12, 16, 10, 10) " in table[1] and "0.grad_input " in table[1]


def test_seed_conv_net_with_in_place_relus():
    result = verify(TinyConvNet(seed=9), torch.arange(1.0, 10.0).reshape(1, 1, 3, 3))
    assert result.ok
    assert [r.name for r in result.rows if "relu" in r.name] == ["relu1.grad_input", "relu2.grad_input"]


def test_digits_cnn_is_close_but_not_everywhere_exact_in_float32():
    x, y = torch.rand(6, 1, 8, 8), torch.tensor([0, 1, 2, 3, 4, 5])
    result = verify(DigitsCNN(), x, loss="cross_entropy", target=y)
    assert result.ok, result.table()
    assert not all(r.exact for r in result.rows)  # unfold + einsum adds in another order than PyTorch's conv
    assert verify(DigitsCNN().double(), x.double(), loss="cross_entropy", target=y).ok


def test_unsupported_layer_is_named():
    model = nn.Sequential(nn.Linear(2, 2), nn.GELU())
    with pytest.raises(UnsupportedLayerError, match=r"'1' \(GELU\).*supported types: AdaptiveAvgPool2d"):
        verify(model, torch.randn(1, 2))


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize(("layer", "setting"), [
    (nn.Conv2d(1, 1, 3, padding=1, padding_mode="reflect"), "padding_mode='reflect'"),
    (nn.AvgPool2d(2, ceil_mode=True), "ceil_mode=True"),
    (nn.Conv2d(1, 1, 2, padding="same"), "uneven padding"),
])
def test_unsupported_setting_is_named(layer, setting):
    with pytest.raises(UnsupportedLayerError, match=rf"layer '0' \({type(layer).__name__}\): .*{setting}"):
        verify(nn.Sequential(layer), torch.randn(1, 1, 5, 5))


class Scaled(nn.Module):
    """A parameter that belongs to no leaf layer: its gradient can't be checked layer by layer."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.fc(x) * self.scale


def test_parameters_outside_leaf_layers_are_refused():
    with pytest.raises(UnsupportedLayerError, match="parameters outside any leaf layer: scale"):
        verify(Scaled(), torch.randn(1, 2))


class Twice(nn.Module):
    """The same Linear and ReLU used twice, plus a layer whose output is thrown away."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.act = nn.ReLU()
        self.unused = nn.Tanh()

    def forward(self, x):
        self.unused(x)
        return self.act(self.fc(self.act(self.fc(x))))


def test_layers_called_twice_and_layers_without_gradient():
    result = verify(Twice(), torch.randn(4, 3))
    assert result.ok
    names = [r.name for r in result.rows]
    assert "fc[call 1].grad_input" in names and "act[call 1].grad_input" in names
    assert names.count("fc.weight.grad") == 1  # summed over both calls, compared once
    assert result.notes == ["unused: no gradient reached it, nothing to compare"]


def test_verify_leaves_model_state_rng_and_grads_alone():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    x = torch.randn(8, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    assert verify(model, x).ok
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())


def test_batch_norm_in_eval_mode_and_unknown_loss():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).eval()
    with torch.no_grad():
        model[1].running_var.fill_(2.0)
    assert verify(model, torch.randn(4, 3)).ok
    with pytest.raises(ValueError, match="loss must be"):
        verify(model, torch.randn(4, 3), loss="hinge")

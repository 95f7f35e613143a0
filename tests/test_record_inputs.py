"""What the recorder and its helpers do with unusual or wrong input: say what is wrong, never
return a wrong value silently, and leave no hook or mode behind."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hooklab import NoGradientError, record
from hooklab.audit import leftover_hooks
from hooklab.layers import get_layer, select_layers
from hooklab.order import trace_firing_order
from hooklab.param_hooks import param_hooks


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 2))


# ----- the recording itself ----------------------------------------------------------------------
def test_a_recording_is_one_with_block():
    """Entered again, while active or after its block, it would mix two blocks' records and call
    numbers (the second pass would show up as call 1)."""
    model, x = mlp(), torch.randn(3, 4)
    rec = record(model, "0")
    with rec:
        with pytest.raises(RuntimeError, match="already used in a `with` block; call record"):
            rec.__enter__()
        model(x)
    with pytest.raises(RuntimeError, match="already used in a `with` block"), rec:
        model(x)
    assert len(rec) == 1 and rec["0"].call == 0 and not leftover_hooks(model)


class Scale(nn.Module):
    def forward(self, x, *, factor=1.0):
        return x * factor


class ListSum(nn.Module):
    def forward(self, xs):
        return xs[0] + xs[1]


def test_keyword_arguments_are_recorded():
    model = nn.Sequential(Scale())
    x = torch.randn(2, 3)
    with record(model, "0") as rec:
        model[0](x, factor=torch.tensor(2.0))
    assert torch.equal(rec["0"].kwargs["factor"], torch.tensor(2.0)) and torch.equal(rec["0"].inputs[0], x)
    with record(model, "0") as rec:
        model[0](x)
    assert rec["0"].kwargs == {}


@pytest.mark.parametrize("how", ["list", "keyword"])
def test_grad_input_says_when_input_tensors_came_in_a_list_or_as_keywords(how):
    a, b = torch.randn(2, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True)
    module = ListSum() if how == "list" else Scale()
    model = nn.Sequential(module)
    with record(model, "0", backward=True) as rec:
        out = module([a, b]) if how == "list" else module(a, factor=b)
        out.sum().backward()
    assert rec["0"].grad_output[0].shape == (2, 3)  # the output side is fine
    expected = "inside a list or dict" if how == "list" else "as keyword arguments"
    with pytest.raises(NoGradientError, match=expected):
        _ = rec["0"].grad_input


class DoubleInPlace(nn.Module):  # writes into its input, without an `inplace` attribute
    def forward(self, x):
        return x.mul_(2)


def test_a_module_writing_into_its_input_is_named_instead_of_a_silent_none():
    model = nn.Sequential(nn.Linear(3, 3), DoubleInPlace(), nn.Linear(3, 1))
    with record(model, backward=True) as rec:
        model(torch.randn(2, 3)).sum().backward()
    assert rec["1"].grad_output[0].shape == (2, 3)
    with pytest.raises(NoGradientError, match="wrote into its input in place"):
        _ = rec["1"].grad_input


def test_a_view_output_modified_in_place_later_gets_its_own_reason():
    model = nn.Sequential(nn.Conv1d(2, 2, 1), nn.Flatten(), nn.ReLU(inplace=True), nn.Linear(4, 1))
    with record(model, backward=True) as rec:
        model(torch.randn(3, 2, 2)).sum().backward()
    with pytest.raises(NoGradientError, match=r"a view that a later in-place operation modified.*inplace=False"):
        _ = rec["1"].grad_output
    assert torch.equal(rec["0"].output.flatten(1), rec["1"].output)  # forward values are still right


def test_gradients_without_backward_true_say_so():
    model = mlp()
    with record(model) as rec:
        model(torch.randn(3, 4)).sum().backward()
    with pytest.raises(NoGradientError, match="without backward=True"):
        _ = rec["0"].grad_output


def test_backward_on_a_frozen_model_gets_a_note_with_the_reason():
    model = mlp().requires_grad_(False)
    with pytest.raises(RuntimeError, match="does not require grad") as caught:
        with record(model, backward=True):
            model(torch.randn(3, 4)).sum().backward()
    assert any("unfreeze a parameter" in note for note in caught.value.__notes__)
    assert not leftover_hooks(model)


class ToInt(nn.Module):
    def forward(self, x):
        return x.argmax(dim=1)


class Nothing(nn.Module):
    def forward(self, x):
        return None


@pytest.mark.parametrize(("module", "reason"), [(ToInt(), "torch.int64 tensor"), (Nothing(), "NoneType")])
def test_outputs_that_cannot_carry_a_gradient_are_described(module, reason):
    model = nn.Sequential(nn.Linear(3, 3), module)
    with record(model, backward=True) as rec:
        model[1](model[0](torch.randn(2, 3)))
    with pytest.raises(NoGradientError, match=reason):
        _ = rec["1"].grad_output


def test_a_foreach_write_leaves_the_record_as_it_was():
    model = mlp()
    with torch.no_grad(), record(model, "3") as rec:
        y = model(torch.randn(3, 4))
        expected = y.clone()
        torch._foreach_mul_([y], 0.0)  # what optimizers do
    assert torch.equal(rec["3"].output, expected)


def test_a_sparse_input_is_copied():
    model = nn.Sequential(nn.Identity())
    x = torch.eye(3).to_sparse()
    with record(model) as rec:
        model(x)
        x.mul_(0)
    assert torch.equal(rec["0"].inputs[0].to_dense(), torch.eye(3))


def test_a_compiled_models_layers_are_named_in_the_error():
    compiled = torch.compile(mlp())  # nothing is compiled until it runs
    rec = record(compiled)
    with pytest.raises(KeyError, match=r"'_orig_mod\.0'"):
        rec.calls("0")


# ----- choosing layers ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"layers": [0, 1]}, TypeError, "did you mean '0'"),
        ({"layers": 123}, TypeError, "layer names are strings"),
        ({"layers": []}, ValueError, "no layer names given"),
        ({"types": "Linear"}, TypeError, "module classes such as nn.Linear"),
        ({"types": nn.Conv2d}, ValueError, "matches no module of Sequential; its module types are Linear"),
        ({"layers": "0", "types": nn.ReLU}, ValueError, "'0' is a Linear, not one of types=ReLU"),
    ],
)
def test_wrong_layer_choices_say_what_is_wrong(kwargs, error, match):
    with pytest.raises(error, match=match):
        select_layers(mlp(), **kwargs)


def test_get_layer_and_leftover_hooks_check_their_argument_types():
    with pytest.raises(TypeError, match="layer names are strings"):
        get_layer(mlp(), None)
    with pytest.raises(TypeError, match=r"nn\.Module objects, not str"):
        leftover_hooks("model")


# ----- parameter hooks and the firing-order tracer ----------------------------------------------------
def test_param_hooks_check_the_hook_and_name_the_parameter():
    model = mlp()
    with pytest.raises(TypeError, match=r"hook\(name, grad\)"):
        param_hooks(model, None)
    with param_hooks(model, lambda name, grad: grad[:1], params=["0.weight"]):  # wrong shape
        with pytest.raises(TypeError, match=r"parameter '0\.weight' returned shape"):
            model(torch.randn(3, 4)).sum().backward()
    seen = []
    with param_hooks(model, lambda name, p: seen.append(name) or p.grad.mul_(1), when="accumulated"):
        model(torch.randn(3, 4)).sum().backward()  # the value returned is ignored, as documented
    assert "0.weight" in seen and not leftover_hooks(model)


class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        y = self.lin(x)
        return y, y.detach()


def test_trace_firing_order_explains_a_tuple_output_and_a_frozen_model():
    with pytest.raises(TypeError, match="pass loss="):
        trace_firing_order(TwoOutputs(), torch.randn(2, 3))
    frozen = nn.Sequential(nn.Linear(3, 2)).requires_grad_(False)
    with pytest.raises(RuntimeError, match="nothing to run backward through"):
        trace_firing_order(frozen, torch.randn(2, 3))
    assert not leftover_hooks(frozen)


# ----- the mistakes of issue 25's bad-input table -----------------------------------------------
def test_a_recording_used_without_with_says_so():
    """``rec = record(m); m(x); rec[...]``: the with block was forgotten, not the layer's call."""
    model, x = mlp(), torch.randn(3, 4)
    rec = record(model)
    model(x)
    for read in (lambda: rec["0"], lambda: rec.calls("0"), rec.summary):
        with pytest.raises(RuntimeError, match=r"never entered.*`with record\(model\) as rec:`"):
            read()
    with pytest.raises(LookupError, match="close matches: '0'"):  # a wrong name still says so first
        rec["00"]
    assert not leftover_hooks(model)


def test_a_forward_pass_under_no_grad_with_backward_true_warns_at_the_end_of_the_block():
    """backward() after the block then fails in torch's words; hooklab has said why already."""
    model, x = mlp(), torch.randn(3, 4)
    with (pytest.warns(UserWarning, match=r"ran under torch.no_grad\(\).*built no graph.*torch.enable_grad"),
          torch.no_grad(), record(model, backward=True) as rec):
        out = model(x)
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()
    with pytest.raises(NoGradientError, match=r"built no graph.*call backward\(\) inside"):
        _ = rec["0"].grad_output


def test_no_warning_when_gradients_were_on(recwarn):
    model, x = mlp(), torch.randn(3, 4)
    with record(model, backward=True):
        model(x).sum().backward()
    with torch.no_grad(), record(model):  # no_grad without backward=True is the usual way to look
        model(x)
    assert not recwarn.list


@pytest.mark.parametrize("layers", ["module", "list"])
def test_a_container_passed_as_a_module_is_named_not_its_first_child(layers):
    model = nn.Sequential()
    model.add_module("features", nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    chosen = model.features if layers == "module" else [model.features]
    with pytest.raises(TypeError, match=r"the Sequential 'features' itself; pass its name, 'features'") as error:
        record(model, chosen)
    assert "Linear(" not in str(error.value)
    with pytest.raises(TypeError, match="you passed the model itself"):
        record(model, model)
    with pytest.raises(TypeError, match="a Linear that is not a submodule of Sequential"):
        get_layer(model, nn.Linear(2, 2))


def test_a_tensor_passed_as_a_layer_name_is_described_not_dumped():
    x = torch.randn(2, 3, 32, 32)
    for call in (lambda: record(mlp(), x), lambda: get_layer(mlp(), x), lambda: record(mlp(), [x])):
        described = r"not a float32 tensor of shape \(2, 3, 32, 32\).*order of the arguments"
        with pytest.raises(TypeError, match=described) as e:
            call()
        assert len(str(e.value)) < 200 and "tensor([" not in str(e.value)


def bn_net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def test_a_model_in_train_mode_with_batchnorm_warns_once(recwarn):
    from hooklab import TrainModeWarning

    model, x = bn_net(), torch.randn(5, 4)
    with pytest.warns(TrainModeWarning, match=r"train mode.*running statistics.*'1'.*model.eval\(\)"):
        with record(model, "3"):
            model(x)
    assert len([w for w in recwarn.list if issubclass(w.category, TrainModeWarning)]) == 0  # pytest.warns took it
    with record(model):  # the same model again: said once already
        model(x)
    with record(model.eval()):  # eval mode: nothing to say
        model(x)
    with record(bn_net().eval()), record(mlp()):  # eval mode, or no BatchNorm
        pass
    assert not [w for w in recwarn.list if issubclass(w.category, TrainModeWarning)]


def test_hooklabs_own_tools_do_not_warn_about_train_mode(recwarn):
    """verify() runs a model in train mode on purpose (and puts the statistics back)."""
    from hooklab.backprop.verify import verify

    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    verify(model, torch.randn(5, 4))
    assert not [w for w in recwarn.list if "train mode" in str(w.message)]


def test_trace_firing_order_under_no_grad_says_gradients_are_off():
    model = mlp()
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"gradients are disabled here \(torch.no_grad\(\)"):
        trace_firing_order(model, torch.randn(2, 4))
    assert not leftover_hooks(model)

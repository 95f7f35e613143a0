"""Each checker of notebook 05 accepts a correct answer and rejects wrong ones."""

from __future__ import annotations

import torch
from answers import failed, run_then_remove

import hooklab
from hooklab.exercises import grade
from hooklab.saliency import GuidedBackprop


def test_05_3_deconvnet_hook():
    passed = grade("05.3", lambda m, gi, go: (go[0].clamp(min=0),))
    assert passed.passed and "deconvnet gradients of 3 digits match" in passed.detail
    assert grade("05.3", lambda m, gi, go: [torch.relu(go[0])]).passed
    failed("05.3", lambda m, gi, go: None, "returned None")
    failed("05.3", lambda m, gi, go: gi, "grad_input unchanged")
    failed("05.3", lambda m, gi, go: go, "negative gradient")
    failed("05.3", lambda m, gi, go: (gi[0].abs(),), "off by")
    failed("05.3", lambda m, gi, go: go[0].clamp(min=0), "tuple", "bare tensor")


def test_05_3_the_guided_hook_shown_above_the_exercise_is_not_the_answer():
    failed("05.3", lambda m, gi, go: (gi[0].clamp(min=0),), "guided backprop's rule")
    failed("05.3", GuidedBackprop.hook, "guided backprop's rule")


def test_05_3_a_hook_that_changes_its_arguments_in_place_fails():
    def clamp_grad_input_in_place(module, grad_input, grad_output):
        grad_input[0].clamp_(min=0)

    def clamp_grad_output_in_place(module, grad_input, grad_output):
        grad_output[0].clamp_(min=0)
        return grad_output

    failed("05.3", clamp_grad_input_in_place, "changed grad_input in place")
    failed("05.3", clamp_grad_output_in_place, "changed grad_output in place")


def test_05_3_wrong_return_values_get_a_message_instead_of_a_pytorch_error():
    failed("05.3", lambda m, gi, go: (None,), "one tensor", "its entry is None")
    failed("05.3", lambda m, gi, go: go[0].clamp(min=0).numpy(), "one tensor", "got ndarray")
    failed("05.3", lambda m, gi, go: 0, "one tensor", "got int")
    failed("05.3", lambda m, gi, go: (t.clamp(min=0) for t in go), "one tensor", "got generator")
    failed("05.3", lambda m, gi, go: (go[0].clamp(min=0), go[0]), "one input", "not 2 entries")
    failed("05.3", lambda m, gi, go: (go[0].clamp(min=0).double(),), "float64, expected float32")
    failed("05.3", lambda m, gi, go: (go[0].clamp(min=0).flatten(),), "shape (8,), expected (2, 4)")


def test_05_3_the_hook_is_also_checked_on_a_model():
    def only_on_the_sample(module, grad_input, grad_output):
        return (grad_output[0].clamp(min=0),) if grad_output[0].dim() == 2 else None

    failed("05.3", only_on_the_sample, "did not change the gradient")


def _layer_cam(a, g):
    return (g.clamp(min=0) * a).sum(dim=1).clamp(min=0)


def test_05_5_layer_cam():
    passed = grade("05.5", _layer_cam)
    assert passed.passed and "(3, 5, 4) and (1, 3, 3)" in passed.detail
    assert grade("05.5", lambda a, g: torch.relu((torch.relu(g) * a).sum(1))).passed
    failed("05.5", lambda a, g: _layer_cam(a, g).tolist(), "as a tensor, got list")
    failed("05.5", lambda a, g: (g.abs() * a).sum(1).clamp(min=0), "max |difference|", "its own gradient")


def test_05_5_the_grad_cam_shown_in_the_notebook_is_not_the_answer():
    def grad_cam_maps(a, g):  # the last lines of the notebook's grad_cam_by_hand
        return (g.mean(dim=(2, 3), keepdim=True) * a).sum(dim=1).clamp(min=0)

    failed("05.5", grad_cam_maps, "that is Grad-CAM", "its own position")


def test_05_5_a_mean_over_channels_is_told_to_sum():
    failed("05.5", lambda a, g: (g.clamp(min=0) * a).mean(1).clamp(min=0), "sum over channels, not mean")
    failed("05.5", lambda a, g: torch.relu((torch.relu(g) * a).mean(dim=1)), "sum over channels, not mean")


def test_05_5_each_relu_in_its_place():
    failed("05.5", lambda a, g: (g * a).sum(1).clamp(min=0), "positive part of its gradient")
    failed("05.5", lambda a, g: (g.clamp(min=0) * a).sum(1), "after summing")
    failed("05.5", lambda a, g: (g.clamp(min=0) * a.clamp(min=0)).sum(1).clamp(min=0), "keep their sign")


def test_05_5_changing_the_inputs_in_place_fails():
    def scale_activations_in_place(a, g):
        return a.mul_(g.clamp(min=0)).sum(1).clamp(min=0)

    def clear_gradients_afterwards(a, g):
        maps = _layer_cam(a, g)
        g.zero_()
        return maps

    failed("05.5", scale_activations_in_place, "changed the activations in place")
    failed("05.5", clear_gradients_afterwards, "changed the gradients in place")
    assert grade("05.5", lambda a, g: _layer_cam(a.clone(), g.clone())).passed


def test_05_5_shape_and_normalisation_hints():
    def keepdim(a, g):
        return (g.clamp(min=0) * a).sum(1, keepdim=True).clamp(min=0)

    def normalised(a, g):
        maps = _layer_cam(a, g)
        return maps / maps.flatten(1).amax(dim=1)[:, None, None]

    failed("05.5", keepdim, "shape (3, 1, 5, 4), expected (3, 5, 4)", "channel dimension (dim 1)")
    failed("05.5", lambda a, g: _layer_cam(a, g)[0], "one map per image")
    failed("05.5", lambda a, g: (g.clamp(min=0) * a).sum(0).clamp(min=0), "dim 1")
    failed("05.5", normalised, "as they are")


def test_05_5_tries_a_second_batch():
    def only_three_images(a, g):
        return _layer_cam(a, g) if len(a) == 3 else torch.zeros(a.shape[0], *a.shape[2:])

    failed("05.5", only_three_images, "(1, 2, 3, 3)")


def _dead(model, layer, x, remove=True, images="all", positions="all", grad=False, finally_=True, keep=None):
    outputs = []
    handle = model.get_submodule(layer).register_forward_hook(lambda m, i, o: outputs.append(o.detach()))

    def run():
        with torch.set_grad_enabled(grad):
            model(x)

    run_then_remove(run, [handle] if remove else [], in_finally=finally_)
    out = outputs[0] if keep is None else outputs[0][keep]
    per_image = getattr((out == 0).flatten(2), positions)(dim=2)
    return getattr(per_image, images)(dim=0).nonzero().flatten().tolist()


def test_05_1_dead_channels():
    passed = grade("05.1", _dead)
    assert passed.passed and "[2, 9, 10, 13]" in passed.detail
    failed("05.1", lambda m, layer, x: _dead(m, layer, x, remove=False), "left registered")
    failed("05.1", lambda m, layer, x: [2, 9])
    failed("05.1", lambda m, layer, x: _dead(m, layer, x, images="any"), "every image")
    failed("05.1", lambda m, layer, x: torch.arange(16).tolist(), "the model ran 0 times")


def test_05_1_accepts_hooklab_record_and_a_tensor_of_indices():
    def with_record(model, layer, x):
        with hooklab.record(model, [layer]) as rec, torch.no_grad():
            model(x)
        return (rec[layer].output == 0).flatten(2).all(dim=2).all(dim=0).nonzero()

    assert grade("05.1", with_record).passed


def test_05_1_the_hook_must_be_removed_when_the_forward_pass_raises():
    failed("05.1", lambda m, layer, x: _dead(m, layer, x, finally_=False), "when the forward pass raised")


def test_05_1_every_image_counts():
    failed("05.1", lambda m, layer, x: _dead(m, layer, x, keep=slice(0, 1)), "first image")
    failed("05.1", lambda m, layer, x: _dead(m, layer, x, keep=slice(0, -1)), "got channels [2, 9, 10, 12, 13]")


def test_05_1_one_forward_pass_without_gradients_with_a_forward_hook():
    def twice(model, layer, x):
        with torch.no_grad():
            model(x)
        return _dead(model, layer, x)

    def in_two_halves(model, layer, x):
        return sorted(set(_dead(model, layer, x[:3])) & set(_dead(model, layer, x[3:])))

    def without_a_hook(model, layer, x):
        with torch.no_grad():
            model(x)
            out = model.features[:2](x)
        return (out == 0).flatten(2).all(dim=2).all(dim=0).nonzero().flatten().tolist()

    failed("05.1", lambda m, layer, x: _dead(m, layer, x, grad=True), "gradients enabled", "torch.no_grad()")
    failed("05.1", twice, "ran 2 times")
    failed("05.1", in_two_halves, "ran 2 times")
    failed("05.1", lambda m, layer, x: _dead(m, layer, x[:-1]), "whole batch")
    failed("05.1", lambda m, layer, x: _dead(m, "features.0", x), "no forward hook of yours was on the layer")
    failed("05.1", without_a_hook, "no forward hook of yours was on the layer")
    failed("05.1", lambda m, layer, x: (m.features[:2](x) == 0).flatten(2).all(2).all(0).nonzero(), "ran 0 times")


def test_05_1_messages():
    def no_return(model, layer, x):
        _dead(model, layer, x)

    def mask(model, layer, x):
        outputs = []
        handle = hooklab.get_layer(model, layer).register_forward_hook(lambda m, i, o: outputs.append(o))
        try:
            with torch.no_grad():
                model(x)
        finally:
            handle.remove()
        return (outputs[0] == 0).flatten(2).all(dim=2).all(dim=0)

    def hook_returns_a_value(model, layer, x):
        kept = {}
        handle = hooklab.get_layer(model, layer).register_forward_hook(lambda m, a, o: kept.setdefault("z", o == 0))
        try:
            with torch.no_grad():
                model(x)
        finally:
            handle.remove()
        return kept["z"].flatten(2).all(dim=2).all(dim=0).nonzero().flatten().tolist()

    failed("05.1", no_return, "returned None")
    failed("05.1", lambda m, layer, x: _dead(m, layer, x, positions="any"), "zero at every position")
    failed("05.1", mask, "not a mask")
    failed("05.1", lambda m, layer, x: mask(m, layer, x).int().tolist(), "not a mask")
    failed("05.1", hook_returns_a_value, "return value replaces the layer's output")


class DeadWatch:
    """A right answer to 05.2; the keyword arguments plant the usual mistakes."""

    def __init__(self, model, layers, *, per="all", fraction=False, remove=True, enter_returns_self=True):
        self.model, self.layers, self.counts, self.handles = model, layers, {name: [] for name in layers}, []
        self.per, self.fraction, self.remove, self.enter_returns_self = per, fraction, remove, enter_returns_self

    def _hook(self, name):
        def count(module, args, output):
            dead = getattr((output == 0).flatten(2).all(dim=2), self.per)(dim=0)
            self.counts[name].append(dead.float().mean().item() if self.fraction else int(dead.sum()))

        return count

    def __enter__(self):
        for name in self.layers:
            self.handles.append(self.model.get_submodule(name).register_forward_hook(self._hook(name)))
        return self if self.enter_returns_self else None

    def __exit__(self, *exc):
        for handle in self.handles if self.remove else []:
            handle.remove()
        self.handles.clear()


def _watch(**options):
    def make(model, layers):
        return DeadWatch(model, layers, **options)

    return make


def test_05_2_dead_watch():
    passed = grade("05.2", DeadWatch)
    assert passed.passed and "features.1" in passed.detail and "also when the block raised" in passed.detail


def test_05_2_typical_mistakes_get_a_hint():
    failed("05.2", _watch(per="any"), "not the number of channels that are zero for every image")
    failed("05.2", _watch(fraction=True), "not their fraction")
    failed("05.2", _watch(remove=False), "stayed on the model", "__exit__")
    failed("05.2", _watch(enter_returns_self=False), "return self")
    failed("05.2", DeadWatch(torch.nn.Linear(1, 1), []), "pass the class DeadWatch itself")


def test_05_2_one_count_per_pass_and_hooks_removed_on_errors():
    class FirstPassOnly(DeadWatch):
        def _hook(self, name):
            count = super()._hook(name)
            return lambda m, a, o: count(m, a, o) if not self.counts[name] else None

    class RemovesOnlyWithoutError(DeadWatch):
        def __exit__(self, exc_type, *rest):
            if exc_type is None:
                super().__exit__(exc_type, *rest)

    failed("05.2", FirstPassOnly, "1 entries after 3 forward passes")
    failed("05.2", RemovesOnlyWithoutError, "when the body of the with block raised")


def _cascade(model, names, *, cumulative=True, deep=True, reseed=True):
    """A right answer to 05.4; the keyword arguments plant the usual mistakes."""
    import copy

    if reseed:
        torch.manual_seed(0)
    copies, current = [], model
    for name in names:
        current = copy.deepcopy(current if cumulative else model) if deep else current
        current.get_submodule(name).reset_parameters()
        copies.append(current)
    return copies


def test_05_4_cascade():
    passed = grade("05.4", _cascade)
    assert passed.passed and "head.2, features.5, features.2" in passed.detail


def test_05_4_typical_mistakes_get_a_hint():
    failed("05.4", lambda m, names: _cascade(m, names, cumulative=False), "keeps the layers above")
    failed("05.4", lambda m, names: _cascade(m, names, deep=False), "changed", "copy.deepcopy")
    failed("05.4", lambda m, names: _cascade(m, names, reseed=False), "torch.manual_seed(0)")
    failed("05.4", lambda m, names: _cascade(m, names[:2]), "3 names, 2 models")
    failed("05.4", lambda m, names: _cascade(m, names)[-1], "a list of models")
    failed("05.4", lambda m, names: _cascade(m, ["features.0", *names[1:]]), "re-draw exactly")
    failed("05.4", lambda m, names: [m] * len(names), "its own copy")


def test_05_4_only_the_seeding_the_text_asks_for_passes():
    import copy

    def seed_before_each_layer(model, names):
        copies, current = [], model
        for name in names:
            current = copy.deepcopy(current)
            torch.manual_seed(0)
            current.get_submodule(name).reset_parameters()
            copies.append(current)
        return copies

    def every_copy_from_the_model(model, names):
        torch.manual_seed(0)
        copies = []
        for k in range(len(names)):
            current = copy.deepcopy(model)
            for name in names[: k + 1]:
                current.get_submodule(name).reset_parameters()
            copies.append(current)
        return copies

    failed("05.4", seed_before_each_layer, "at the start only")
    failed("05.4", every_copy_from_the_model, "each copy from the previous one")


def test_05_2_a_late_bound_name_is_told_about_the_loop_variable():
    class LateBound(DeadWatch):
        def __enter__(self):
            for name in self.layers:
                def count(module, args, output):
                    dead = (output == 0).flatten(2).all(dim=2).all(dim=0)
                    self.counts[name].append(int(dead.sum()))  # noqa: B023 - the mistake under test

                self.handles.append(self.model.get_submodule(name).register_forward_hook(count))
            return self

    failed("05.2", LateBound, "loop variable", "name=name")

"""Predictions and checkers of notebook 02: each checker accepts worked answers and rejects the wrong
ones a student is likely to write, naming the slip; each prediction computes what the lesson shows."""

from __future__ import annotations

import pytest
import torch
from answers import failed, run_then_remove
from torch import nn

from hooklab.exercises import exercises, grade

IDS = sorted(id for id in exercises() if id.startswith("02."))


def test_notebook_02_has_five_predictions_and_five_exercises():
    assert IDS == ["02.1", "02.2", "02.3", "02.4", "02.5", "02.a", "02.b", "02.c", "02.d", "02.e"]


# ----- predictions ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("id", "truth"), [("02.a", 100_000), ("02.b", 14.0), ("02.c", 75), ("02.d", 0.0),
                                           ("02.e", 1.0)])  # fmt: skip
def test_each_prediction_computes_what_the_lesson_shows(id, truth):
    assert grade(id, truth).passed
    assert exercises()[id].checker.__wrapped__.truth() == truth


@pytest.mark.parametrize(("id", "guess", "words"), [
    ("02.a", 1_000, "four layers"), ("02.b", 8.0, "pre-hook ran too"), ("02.b", 7.0, "replaces the output"),
    ("02.c", 67, "twice"), ("02.d", -1.0, "shares its memory"), ("02.e", 0.5, "biases"),
])  # fmt: skip
def test_a_common_wrong_guess_gets_its_own_hint(id, guess, words):
    failed(id, guess, words)


# ----- 02.1 -------------------------------------------------------------------------------------------
def stds_answer(which="leaves", late=False, of="output", key="name", in_finally=True):
    """An answer to 02.1: one forward hook per leaf keeps its output's std (variations: wrong)."""
    def output_stds(model, x):
        stds, handles = {}, []

        def run():
            items = list(model.named_modules())[1:] if which != "children" else list(model.named_children())
            for name, module in items:
                if which == "leaves" and next(module.children(), None) is not None:
                    continue
                if late:
                    hook = lambda m, args, out: stds.__setitem__(name, out.std().item())  # noqa: B023, E731
                else:
                    def hook(m, args, out, name=name):
                        value = out if of == "output" else args[0]
                        stds[name if key == "name" else m] = value.std().item()
                handles.append(module.register_forward_hook(hook))
            model(x)

        run_then_remove(run, handles, in_finally=in_finally)
        return stds

    return output_stds


def test_02_1_accepts_one_hook_per_leaf_and_tensor_values():
    result = grade("02.1", stds_answer())
    assert result.passed, result.detail

    def tensors(model, x):
        stds, handles = {}, []
        for name, module in model.named_modules():
            if name and not list(module.children()):
                keep = lambda m, a, out, name=name: stds.update({name: out.std()})  # noqa: E731
                handles.append(module.register_forward_hook(keep))
        run_then_remove(lambda: model(x), handles)
        return stds

    assert grade("02.1", tensors).passed


def test_02_1_names_the_slip():
    failed("02.1", stds_answer(late=True), "name=name", "loop variable")
    failed("02.1", stds_answer(which="children"), "container", "leaves")
    failed("02.1", stds_answer(which="all"), "container")
    failed("02.1", stds_answer(of="input"), "spreads of the inputs")
    failed("02.1", stds_answer(key="module"), "keys are modules")
    outcome = failed("02.1", stds_answer(in_finally=False), "finally", "forward hook is still registered on layer")
    assert "_forward" not in outcome.detail
    failed("02.1", lambda model, x: None, "None (missing return?)")


# ----- 02.2 -------------------------------------------------------------------------------------------
def rescaling(how="in place", grad_off=True, one_pass=False, passes=1, in_finally=True):
    """An answer to 02.2: one layer per pass, its forward hook divides its weight by its output's std."""
    def unit_std(module, args, output):
        if how == "in place":
            module.weight.div_(output.std())
        elif how == "new Parameter":
            module.weight = nn.Parameter(module.weight.detach() / output.std())
        elif how == "output":
            return output / output.std()
        return None

    def forward(model, x):
        if grad_off:
            with torch.no_grad():
                model(x)
        else:
            model(x)

    def rescale_to_unit_std(model, x):
        layers = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
        if one_pass:
            handles = []
            run_then_remove(lambda: [handles.append(m.register_forward_hook(unit_std)) for m in layers]
                            and [forward(model, x) for _ in range(passes)], handles, in_finally=in_finally)
            return
        for layer in layers:
            handles = [layer.register_forward_hook(unit_std)]
            run_then_remove(lambda: forward(model, x), handles, in_finally=in_finally)

    return rescale_to_unit_std


def test_02_2_accepts_one_layer_per_pass_or_enough_passes_with_every_hook():
    for answer in (rescaling(), rescaling(one_pass=True, passes=3)):
        result = grade("02.2", answer)
        assert result.passed, result.detail


def test_02_2_names_the_slip():
    failed("02.2", rescaling(how="new Parameter"), "new weight Parameter", "in place")
    failed("02.2", rescaling(grad_off=False), "torch.no_grad()")
    failed("02.2", rescaling(one_pass=True), "gives std", "one layer per forward pass")
    failed("02.2", rescaling(how="output"), "no weight changed")
    failed("02.2", rescaling(in_finally=False), "finally")


# ----- 02.3 and 02.4: recorders -------------------------------------------------------------------------
def recorder(inputs=False, where="pre", copy=lambda t: t.detach().clone(), copy_out=None, late=False,
             leaves_only=False, records_as="list", append_at="end", enter_returns_self=True):
    """A recorder class: one record per call (variations: wrong). ``inputs``: also keep the inputs, copied
    in a pre-hook (``where="pre"``) or, wrong for in-place layers, in the forward hook."""
    copy_out = copy_out or copy

    class Recorder:
        def __init__(self, model):
            self.model, self.handles, self.waiting = model, [], {}
            self.records = {} if records_as == "dict" else []

        def keep(self, name, inputs_, output):
            entry = (name, inputs_, copy_out(output)) if inputs else (name, copy_out(output))
            if records_as == "dict":
                self.records[name] = entry
            else:
                self.records.append(entry)

        def __enter__(self):
            for name, module in self.model.named_modules():
                if not name or (leaves_only and next(module.children(), None) is not None):
                    continue
                if late:  # the slip: both hooks read the loop variable after the loop has ended
                    def before(m, args):
                        self.waiting.setdefault(name, []).append(tuple(copy(a) for a in args))  # noqa: B023

                    def after(m, args, output):
                        kept = self.waiting[name].pop() if inputs else ()  # noqa: B023
                        self.keep(name, kept, output)  # noqa: B023
                else:
                    def before(m, args, name=name):
                        self.waiting.setdefault(name, []).append(tuple(copy(a) for a in args))

                    def after(m, args, output, name=name):
                        pre = inputs and where == "pre"
                        kept = self.waiting[name].pop() if pre else tuple(copy(a) for a in args)
                        self.keep(name, kept, output)

                if inputs and (where == "pre" or late):
                    self.handles.append(module.register_forward_pre_hook(before))
                if append_at == "start":
                    hook = lambda m, args, name=name: self.records.append((name, args[0].detach().clone()))  # noqa: E731
                    self.handles.append(module.register_forward_pre_hook(hook))
                else:
                    self.handles.append(module.register_forward_hook(after))
            return self if enter_returns_self else None

        def __exit__(self, *exc):
            for handle in self.handles:
                handle.remove()

    return Recorder


def test_02_3_accepts_one_record_per_call():
    result = grade("02.3", recorder())
    assert result.passed, result.detail


def test_02_3_names_the_slip():
    failed("02.3", recorder(late=True), "name=name")
    failed("02.3", recorder(records_as="dict"), "can run twice")
    failed("02.3", recorder(leaves_only=True), "containers too")
    failed("02.3", recorder(append_at="start"), "wrong order", "when each call ends")
    failed("02.3", recorder(copy=lambda t: t.clone()), "autograd graph")
    failed("02.3", recorder(enter_returns_self=False), "return self")

    class Forgets(recorder()):
        def __exit__(self, *exc):
            pass

    outcome = failed("02.3", Forgets, "forward hook is still registered on layer", "__exit__")
    assert "_forward" not in outcome.detail


def test_02_4_accepts_inputs_copied_in_a_pre_hook():
    result = grade("02.4", recorder(inputs=True))
    assert result.passed, result.detail


def test_02_4_names_the_slip():
    failed("02.4", recorder(inputs=True, where="forward"), "forward pre-hook", "overwrote")
    failed("02.4", recorder(inputs=True, copy=lambda t: t.detach(), copy_out=lambda t: t.detach().clone()),
           "clone")
    failed("02.4", recorder(inputs=True, copy_out=lambda t: t.detach()), "output kept for record", "clone")
    failed("02.4", recorder(inputs=True, copy=lambda t: t.clone()), "autograd graph")
    failed("02.4", recorder(), "(name, inputs, output) triple")
    failed("02.4", recorder(inputs=True, late=True), "name=name")


# ----- 02.5 -------------------------------------------------------------------------------------------
def step_stats(late=False, as_tensor=False, of="output"):
    """An answer to 02.5: one forward hook per named layer appends three numbers (variations: wrong)."""
    class StepStats:
        def __init__(self, model, names):
            self.model, self.names, self.handles = model, names, []
            self.means = {name: [] for name in names}
            self.stds = {name: [] for name in names}
            self.zeros = {name: [] for name in names}

        def __enter__(self):
            for name in self.names:
                def keep(module, args, output, name=name):
                    key = self.names[-1] if late else name
                    out = (output if of == "output" else args[0]).detach()
                    value = (lambda t: t) if as_tensor else (lambda t: t.item())
                    self.means[key].append(value(out.mean()))
                    self.stds[key].append(value(out.std()))
                    self.zeros[key].append(value((out == 0).float().mean()))

                self.handles.append(self.model.get_submodule(name).register_forward_hook(keep))
            return self

        def __exit__(self, *exc):
            for handle in self.handles:
                handle.remove()

    return StepStats


def test_02_5_accepts_numbers_per_call():
    result = grade("02.5", step_stats())
    assert result.passed, result.detail


def test_02_5_names_the_slip():
    failed("02.5", step_stats(late=True), "name=name", "last name")
    failed("02.5", step_stats(as_tensor=True), "keeps tensors", ".item()")
    failed("02.5", step_stats(of="input"), "expected")


def test_no_message_names_a_private_attribute():
    """A student reads 'a forward hook is still registered on layer ...', never PyTorch's dict names."""
    details = [grade("02.1", stds_answer(in_finally=False)).detail, grade("02.2", rescaling(in_finally=False)).detail]
    assert all("still registered" in d and "_forward" not in d and "hooks_dict" not in d for d in details)


def test_02_1_says_which_leaves_are_missing_and_when_nothing_ran():
    def only_linear(model, x):
        stds, handles = {}, []
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                keep = lambda m, a, out, name=name: stds.update({name: out.std().item()})  # noqa: E731
                handles.append(module.register_forward_hook(keep))
        run_then_remove(lambda: model(x), handles)
        return stds

    failed("02.1", only_linear, "every leaf", "whatever its type")
    failed("02.1", lambda model, x: {}, "empty")

"""Exercise checkers of notebook 00 accept a right answer and reject typical wrong ones; its predictions
compute what the lesson shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from answers import failed

from hooklab.exercises import grade

LESSON = Path(__file__).resolve().parents[1] / "notebooks" / "00_start_here.ipynb"


# ----- 00.1: what module(x) does with its forward hooks ------------------------------------------
def call_right(module, x):
    output = module.forward(x)
    for hook in module._forward_hooks.values():
        result = hook(module, (x,), output)
        if result is not None:
            output = result
    return output


def test_00_1_accepts_the_worked_answer():
    assert grade("00.1", call_right).passed


def test_00_1_rejects_an_answer_that_lets_pytorch_call_the_hooks():
    def calls_the_module(module, x):
        return module(x)

    def calls_the_implementation(module, x):
        return module._call_impl(x)

    failed("00.1", calls_the_module, "called module(x), which runs the hooks itself", "module.forward(x)")
    failed("00.1", calls_the_implementation, "PyTorch called the hooks, not your function")


def test_00_1_names_slips_in_the_loop():
    def ignores_results(module, x):
        output = module.forward(x)
        for hook in module._forward_hooks.values():
            hook(module, (x,), output)
        return output

    def same_output_for_every_hook(module, x):
        output, last = module.forward(x), None
        for hook in module._forward_hooks.values():
            result = hook(module, (x,), output)
            last = result if result is not None else last
        return last

    def reversed_order(module, x):
        output = module.forward(x)
        for hook in reversed(module._forward_hooks.values()):
            result = hook(module, (x,), output)
            output = output if result is None else result
        return output

    def args_not_a_tuple(module, x):
        output = module.forward(x)
        for hook in module._forward_hooks.values():
            result = hook(module, x, output)
            output = output if result is None else result
        return output

    def truthiness(module, x):
        output = module.forward(x)
        for hook in module._forward_hooks.values():
            result = hook(module, (x,), output)
            if result:
                output = result
        return output

    def two_arguments(module, x):
        output = module.forward(x)
        for hook in module._forward_hooks.values():
            output = hook(module, output) or output
        return output

    def keeps_every_result(module, x):
        output = module.forward(x)
        for hook in module._forward_hooks.values():
            output = hook(module, (x,), output)
        return output

    def no_hooks(module, x):
        return module.forward(x)

    failed("00.1", ignores_results, "returned forward's own output", "replaces the output")
    failed("00.1", same_output_for_every_hook, "look_again received another output", "as the hooks before it left it")
    failed("00.1", reversed_order, "the reverse of the order they were registered in")
    failed("00.1", args_not_a_tuple, "received Tensor as args", "(x,)")
    failed("00.1", truthiness, "result is not None")
    failed("00.1", two_arguments, "hook(module, args, output)")
    failed("00.1", no_hooks, "no hook ran")
    failed("00.1", keeps_every_result, "a hook that returns None leaves the output as it was")
    def no_return(module, x):
        call_right(module, x)

    failed("00.1", no_return, "missing return?")


def test_00_1_stub_is_not_solved_yet():
    def stub(module, x):
        output = module.forward(x)  # noqa: F841  (the lesson's stub)
        raise NotImplementedError

    from hooklab.exercises import check, checked

    check("00.1", stub)
    assert checked()["00.1"] == ("not solved yet", "")


# ----- 00.2 -------------------------------------------------------------------------------------
def run_right(module, hook, x):
    with module.register_forward_hook(hook):
        return module(x)


def test_00_2_accepts_a_handle_used_as_context_manager():
    assert grade("00.2", run_right).passed


def test_00_2_accepts_try_finally():
    def with_finally(module, hook, x):
        handle = module.register_forward_hook(hook)
        try:
            output = module(x)
        finally:
            handle.remove()
        return output

    assert grade("00.2", with_finally).passed


def test_00_2_rejects_wrong_answers():
    def happy_path_only(module, hook, x):
        handle = module.register_forward_hook(hook)
        out = module(x)
        handle.remove()
        return out

    def swallows(module, hook, x):
        try:
            return run_right(module, hook, x)
        except ValueError:
            return None

    def never_removes(module, hook, x):
        module.register_forward_hook(hook)
        return module(x)

    def ignores_hook(module, hook, x):
        return module(x)

    def removes_before_running(module, hook, x):
        module.register_forward_hook(hook).remove()
        return module(x)

    for wrong, words in [
        (happy_path_only, "finally"),
        (swallows, "swallowed"),
        (never_removes, "still registered"),
        (ignores_hook, "10 times"),
        (removes_before_running, "while your hook is registered"),
    ]:
        failed("00.2", wrong, words)


def test_00_2_wants_the_output_alone():
    def with_a_count(module, hook, x):
        return run_right(module, hook, x), 1

    def detached(module, hook, x):
        with module.register_forward_hook(hook):
            return module(x).detach()

    def without_grad(module, hook, x):
        with module.register_forward_hook(hook), torch.no_grad():
            return module(x)

    failed("00.2", detached, "cut from the autograd graph (.detach()", "could not call backward through it")
    failed("00.2", without_grad, "cut from the autograd graph", "torch.no_grad()?")

    def nothing(module, hook, x):
        run_right(module, hook, x)

    failed("00.2", with_a_count, "return only the output of module(x), got (Tensor, int)")
    failed("00.2", nothing, "missing return?")


def test_00_2_names_a_global_hook():
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    def global_hook(module, hook, x):
        with register_module_forward_hook(hook):
            return module(x)

    def global_pre_hook(module, hook, x):
        with register_module_forward_pre_hook(hook):
            return module(x)

    failed("00.2", global_hook, "registered as a global forward hook (register_module_forward_hook)",
           "module.register_forward_hook(hook)")
    failed("00.2", global_pre_hook, "registered as a global forward pre-hook (register_module_forward_pre_hook)")


# ----- 00.2: only its own hook, called by the module, whatever forward raises -------------------
def test_00_2_rejects_an_answer_that_clears_every_hook_of_the_module():
    def clears_all(module, hook, x):
        module.register_forward_hook(hook)
        try:
            return module(x)
        finally:
            module._forward_hooks.clear()

    result = grade("00.2", clears_all)
    assert not result.passed and "did not register" in result.detail


def test_00_2_rejects_cleanup_for_some_errors_only():
    def only_value_errors(module, hook, x):
        handle = module.register_forward_hook(hook)
        try:
            out = module(x)
        except ValueError:
            handle.remove()
            raise
        handle.remove()
        return out

    def not_on_stop(module, hook, x):
        handle = module.register_forward_hook(hook)
        try:
            out = module(x)
        except Exception:
            handle.remove()
            raise
        handle.remove()
        return out

    def swallows_errors(module, hook, x):
        try:
            return run_right(module, hook, x)
        except Exception:
            return None

    for wrong, *words in [
        (only_value_errors, "another type, the hook was left"),
        (not_on_stop, "KeyboardInterrupt (as pressing stop does), the hook was left"),
        (not_on_stop, "`except Exception` lets it through", "finally: block"),
        (swallows_errors, "your code swallowed it"),
    ]:
        failed("00.2", wrong, *words)


def test_00_2_wants_one_module_call_that_calls_the_hook():
    def calls_the_hook_itself(module, hook, x):
        return hook(module, (x,), module(x))

    def runs_twice(module, hook, x):
        with module.register_forward_hook(hook):
            module(x)
            return module(x)

    for wrong, words in [(calls_the_hook_itself, "called the hook itself"), (runs_twice, "ran 2 times")]:
        failed("00.2", wrong, words)


def test_00_2_says_when_the_hook_was_registered_as_a_pre_hook():
    def as_pre_hook(module, hook, x):
        with module.register_forward_pre_hook(hook):
            return module(x)

    result = grade("00.2", as_pre_hook)
    assert not result.passed and "registered as a pre-hook?" in result.detail


# ----- 00.3: the student's own recorder ---------------------------------------------------------
class Recorder:
    """The worked answer: a forward hook per leaf module keeps a detached copy; __exit__ removes them all."""

    def __init__(self, model):
        self.model, self.outputs, self.handles = model, {}, []

    def copy(self, output):
        return output.detach().clone()

    def layers(self):
        return [(name, m) for name, m in self.model.named_modules() if not list(m.children())]

    def __enter__(self):
        self.outputs, self.handles = {}, []  # a fresh recording each with block
        for name, module in self.layers():

            def keep(module, args, output, name=name):
                self.outputs[name] = self.copy(output)

            self.handles.append(module.register_forward_hook(keep))
        return self

    def __exit__(self, exc_type, exc, tb):
        for handle in self.handles:
            handle.remove()


def test_00_3_accepts_the_worked_answer_and_its_variants():
    class CloneThenDetach(Recorder):
        def copy(self, output):
            return output.clone().detach()

    class WithHooks(Recorder):  # the handles owned by a hooklab.Hooks
        def __enter__(self):
            import hooklab

            self.hooks, self.outputs = hooklab.Hooks(), {}
            for name, module in self.layers():
                self.hooks.add(module.register_forward_hook(
                    lambda m, args, output, name=name: self.outputs.__setitem__(name, output.detach().clone())))
            return self

        def __exit__(self, *exc):
            self.hooks.remove()

    class ByModules(Recorder):  # leaves found with modules() and a name lookup
        def layers(self):
            names = {m: n for n, m in self.model.named_modules()}
            return [(names[m], m) for m in self.model.modules() if len(m._modules) == 0]

    for right in (Recorder, CloneThenDetach, WithHooks, ByModules):
        outcome = grade("00.3", right)
        assert outcome.passed, (right.__name__, outcome.detail)


def test_00_3_wants_every_leaf_under_its_dotted_name():
    class Children(Recorder):  # the top level only: 'body' holds two leaves
        def layers(self):
            return list(self.model.named_children())

    class EveryModule(Recorder):  # containers and the model itself too
        def layers(self):
            return list(self.model.named_modules())

    class ShortNames(Recorder):
        def layers(self):
            return [(name.rsplit(".", 1)[-1], m) for name, m in super().layers()]

    class LinearsOnly(Recorder):
        def layers(self):
            return [(name, m) for name, m in super().layers() if isinstance(m, torch.nn.Linear)]

    failed("00.3", Children, "nothing was kept for layer 'body.early'", "without children",
           "named_children() gives only the top level")
    failed("00.3", EveryModule, "'body', a module with children", "leaf modules only")
    failed("00.3", ShortNames, "kept under 'early'", "dotted name", "'body.early'")

    class Underscores(Recorder):
        def layers(self):
            return [(name.replace(".", "_"), m) for name, m in super().layers()]

    class ByModule(Recorder):
        def layers(self):
            return [(m, m) for _, m in super().layers()]

    failed("00.3", Underscores, "the key 'body_early', which is not the name of a module", "dotted name")
    failed("00.3", ByModule, "the key a Linear, which is not the name of a module")
    failed("00.3", LinearsOnly, "nothing was kept for layer 'body.act'")


def test_00_3_wants_the_leaves_a_filter_by_type_or_parameters_misses():
    """The check model holds a parameterless leaf of its own class (an RMSNorm): a recorder that
    picks Linear and ReLU layers, or layers with parameters, must not pass."""

    class ByType(Recorder):
        def layers(self):
            kinds = (torch.nn.Linear, torch.nn.ReLU)
            return [(name, m) for name, m in self.model.named_modules() if isinstance(m, kinds)]

    class WithParameters(Recorder):
        def layers(self):
            return [(name, m) for name, m in self.model.named_modules() if list(m.parameters(recurse=False))]

    failed("00.3", ByType, "nothing was kept for layer 'norm', an RMSNorm", "having no children", "not by their type")
    failed("00.3", WithParameters, "nothing was kept for layer 'body.act'")


def test_00_3_wants_no_hook_before_the_with_block():
    class HooksInInit(Recorder):  # a recorder made and never entered would leave them on the model
        def __init__(self, model):
            super().__init__(model)
            Recorder.__enter__(self)

        def __enter__(self):
            return self

    failed("00.3", HooksInInit, "right after Recorder(model), before any with block", "on layer 'late'",
           "Register them in __enter__")


def test_00_3_explains_the_copy_that_is_not_a_detached_clone():
    class DetachOnly(Recorder):
        def copy(self, output):
            return output.detach()

    class CloneOnly(Recorder):
        def copy(self, output):
            return output.clone()

    class Shape(Recorder):
        def copy(self, output):
            return output.shape

    failed("00.3", DetachOnly, "changed after the layer ran", "in-place ReLU that runs right after it",
           "shares that memory", ".clone() gives the copy memory of its own", "02_forward_hooks.ipynb")
    failed("00.3", CloneOnly, "still part of the autograd graph", "detach().clone()")
    failed("00.3", Shape, "what was kept for layer 'body.early' is (int, int), not a tensor")


def test_00_3_hints_at_name_equals_name():
    class LateName(Recorder):
        def __enter__(self):
            for name, module in self.layers():

                def keep(module, args, output):
                    self.outputs[name] = output.detach().clone()  # noqa: B023  (the slip under test)

                self.handles.append(module.register_forward_hook(keep))
            return self

    failed("00.3", LateName, "every output was kept under one name, 'body.act'", "name=name")


def test_00_3_keeps_the_last_output_of_a_module_called_twice():
    class FirstCall(Recorder):
        def __enter__(self):
            for name, module in self.layers():

                def keep(module, args, output, name=name):
                    self.outputs.setdefault(name, output.detach().clone())

                self.handles.append(module.register_forward_hook(keep))
            return self

    failed("00.3", FirstCall, "the output of its first call", "calls norm twice", "keep the output of the last call")


def test_00_3_keeps_a_module_called_twice_at_the_place_of_its_first_call():
    class MovesToLastCall(Recorder):  # pops the name and writes it again: norm moves after late
        def __enter__(self):
            for name, module in self.layers():

                def keep(module, args, output, name=name):
                    self.outputs.pop(name, None)
                    self.outputs[name] = output.detach().clone()

                self.handles.append(module.register_forward_hook(keep))
            return self

    failed("00.3", MovesToLastCall, "'norm' after 'late', at the place of its second call", "do not pop",
           "first_nan would blame")


def test_00_3_wants_the_order_the_layers_ran_in():
    class Prefilled(Recorder):  # the names written in definition order, before anything ran
        def __enter__(self):
            super().__enter__()
            self.outputs = dict.fromkeys(name for name, _ in self.layers())
            return self

    failed("00.3", Prefilled, "the order they were defined in", "add each name when its hook runs")


def test_00_3_wants_every_hook_removed_in_every_case():
    class NeverRemoves(Recorder):
        def __exit__(self, *exc):
            pass

    class OnlyOnSuccess(Recorder):
        def __exit__(self, exc_type, exc, tb):
            if exc_type is None:
                super().__exit__(exc_type, exc, tb)

    class NotOnStop(Recorder):
        def __exit__(self, exc_type, exc, tb):
            if exc_type is None or issubclass(exc_type, Exception):
                super().__exit__(exc_type, exc, tb)

    class Swallows(Recorder):
        def __exit__(self, *exc):
            super().__exit__(*exc)
            return True

    class ReturnsSelf(Recorder):
        def __exit__(self, *exc):
            super().__exit__(*exc)
            return self

    class ClearsEverything(Recorder):
        def __exit__(self, *exc):
            for module in self.model.modules():
                module._forward_hooks.clear()

    failed("00.3", NeverRemoves, "after the with block, a forward hook is still registered on layer 'late'", "__exit__")
    failed("00.3", ClearsEverything, "also removed hooks that were on layer 'late' before", "only the handles you kept")
    failed("00.3", OnlyOnSuccess, "when the with block raised an error", "whatever was raised")
    failed("00.3", NotOnStop, "raised KeyboardInterrupt (as pressing stop does)", "whatever was raised")
    for swallows in (Swallows, ReturnsSelf):
        failed("00.3", swallows, "`__exit__` returned a true value (self?), which swallows the error: return None")


def test_00_3_names_other_slips():
    class NoSelf(Recorder):
        def __enter__(self):
            super().__enter__()

    class ReturnsTheCopy(Recorder):
        def __enter__(self):
            for name, module in self.layers():
                self.handles.append(module.register_forward_hook(
                    lambda m, args, output, name=name: self.outputs.setdefault(name, output.detach().clone())))
            return self

    class Shared(Recorder):
        outputs = {}  # noqa: RUF012  (the slip under test: one dict for every recorder)

        def __init__(self, model):
            self.model, self.handles = model, []

        def __enter__(self):  # writes into the class's dict
            self.handles = []
            for name, module in self.layers():
                self.handles.append(module.register_forward_hook(
                    lambda m, args, output, name=name: self.outputs.__setitem__(name, output.detach().clone())))
            return self

    failed("00.3", NoSelf, "__enter__ returned None", "return self")
    failed("00.3", ReturnsTheCopy, "the hook must return None")
    failed("00.3", Shared, "two recorders share one outputs dict", "__init__")
    failed("00.3", Recorder(torch.nn.Linear(1, 1)), "pass the class itself")


def test_00_3_wants_a_fresh_recording_in_each_with_block():
    class KeepsOldOutputs(Recorder):  # outputs and handles made only in __init__
        def __enter__(self):
            for name, module in self.layers():
                self.handles.append(module.register_forward_hook(
                    lambda m, args, output, name=name: self.outputs.__setitem__(name, output.detach().clone())))
            return self

    failed("00.3", KeepsOldOutputs, "second with block", "still held", "empty dict", "in __enter__")


def test_00_3_stub_is_not_solved_yet():
    from hooklab.exercises import check, checked

    class Stub(Recorder):
        def __enter__(self):
            raise NotImplementedError

    check("00.3", Stub)
    assert checked()["00.3"] == ("not solved yet", "")


# ----- 00.4: the first layer whose output holds a NaN -------------------------------------------
def first_nan_right(model, x):
    with Recorder(model) as rec:
        model(x)
    return next((name for name, output in rec.outputs.items() if torch.isnan(output).any()), None)


def test_00_4_accepts_the_worked_answer_and_a_hook_of_its_own():
    def own_hooks(model, x):
        found = []

        def look(module, args, output, name):
            if not found and torch.isnan(output).any():
                found.append(name)

        import hooklab

        with hooklab.Hooks() as hooks:
            for name, module in model.named_modules():
                if not list(module.children()):
                    hooks.add(module.register_forward_hook(lambda m, a, o, name=name: look(m, a, o, name)))
            model(x)
        return found[0] if found else None

    for right in (first_nan_right, own_hooks):
        outcome = grade("00.4", right)
        assert outcome.passed, (right.__name__, outcome.detail)


def test_00_4_rejects_the_order_of_definition_and_the_last_nan():
    def by_definition(model, x):
        with Recorder(model) as rec:
            model(x)
        leaves = [name for name, m in model.named_modules() if not list(m.children())]
        return next((name for name in leaves if torch.isnan(rec.outputs[name]).any()), None)

    def last_nan(model, x):
        with Recorder(model) as rec:
            model(x)
        return ([name for name, output in rec.outputs.items() if torch.isnan(output).any()] or [None])[-1]

    def all_nan(model, x):
        with Recorder(model) as rec:
            model(x)
        return next((name for name, output in rec.outputs.items() if torch.isnan(output).all()), None)

    def sorted_names(model, x):
        with Recorder(model) as rec:
            model(x)
        return next((name for name in sorted(rec.outputs) if torch.isnan(rec.outputs[name]).any()), None)

    failed("00.4", by_definition, "the first layer with a NaN in the order the layers are defined",
           "'blocks.front.norm' here")
    failed("00.4", last_nan, "'head' is the last layer whose output holds a NaN", "'blocks.front.norm' here")
    failed("00.4", sorted_names, "'blocks.back.act' is the first layer with a NaN in alphabetical order",
           "'blocks.front.norm' here")
    failed("00.4", all_nan, "returned None", "torch.isnan(output).any()")


def test_00_4_names_other_slips():
    class ChildRecorder(Recorder):
        def layers(self):
            return list(self.model.named_children())

    def with_children(model, x):
        with ChildRecorder(model) as rec:
            model(x)
        return next((name for name, output in rec.outputs.items() if torch.isnan(output).any()), None)

    def the_module(model, x):
        name = first_nan_right(model, x)
        return None if name is None else model.get_submodule(name)

    def empty_for_none(model, x):
        return first_nan_right(model, x) or ""

    def leaves_hooks(model, x):
        recorder = Recorder(model).__enter__()
        model(x)
        return next((name for name, output in recorder.outputs.items() if torch.isnan(output).any()), None)

    failed("00.4", with_children, "'head' is the last layer whose output holds a NaN", "Record every leaf")
    failed("00.4", the_module, "return the layer's name", "got RMSNorm")
    failed("00.4", empty_for_none, "no layer's output holds a NaN here", "return None")
    failed("00.4", leaves_hooks, "after first_nan, a forward hook is still registered on layer")


def test_00_4_cases_are_what_the_checker_says():
    from hooklab.exercises import nb00

    found, by_definition, by_name, last = [], [], [], []
    for sign, rows, head_last in nb00._NAN_CASES:
        model = nb00._NanCase(sign, head_last)
        ran = nb00._run_order(model, torch.tensor(rows))
        found.append(nb00._first_nan(ran)[0])
        with_nan = [name for name, _, out in ran if torch.isnan(out).any()]
        by_definition.append(next((name for name, _ in nb00._leaves(model) if name in with_nan), None))
        by_name.append(next((name for name in sorted(n for n, _, _ in ran) if name in with_nan), None))
        last.append(with_nan[-1] if with_nan else None)
    assert found == ["blocks.front.norm", "blocks.front.norm", None, "blocks.back.norm"]
    # the first case tells the four apart: first by definition, first by name, last to run, and the answer
    assert (by_definition[0], by_name[0], last[0]) == ("blocks.back.linear", "blocks.back.act", "head")


# ----- predictions -------------------------------------------------------------------------------
def truth(id):
    from hooklab.exercises import exercises

    return exercises()[id].checker.__wrapped__.truth()


def test_the_predictions_compute_what_the_lesson_shows():
    assert truth("00.c") == ["embed"]
    assert truth("00.f") == "1"
    assert truth("00.a") == [11.0, 1.0]
    assert truth("00.b") == [1, 2, 3]
    assert truth("00.d") == ["embed", "head"]
    assert truth("00.e") == ["RMSNorm", 6]


def test_the_predictions_answer_right_and_give_hints_for_common_wrong_guesses():
    assert grade("00.a", [11, 1]).passed and grade("00.b", [1.0, 2.0, 3.0]).passed
    assert grade("00.d", ["Embed", "'head'"]).passed and grade("00.e", ["rmsnorm", 6.0]).passed
    assert "received times_ten's result" in grade("00.a", [2.0, 1.0]).detail
    assert "the plain method" in grade("00.a", [11, 11]).detail
    assert "does not replace it" in grade("00.b", [1, 1, 1]).detail
    assert "the order the model defines its layers in" in grade("00.d", ["head", "embed"]).detail
    assert "does not make one" in grade("00.e", ["Linear", 0]).detail
    assert "it makes the row of zeros" in grade("00.e", ["ReLU", 6]).detail
    assert "which row makes the root mean square 0" in grade("00.e", ["RMSNorm", 1]).detail
    assert not grade("00.d", ["embed"]).passed


def test_a_guess_of_the_wrong_form_is_told_what_to_write_not_the_answer():
    for id, guess, words in [("00.a", [11.0], "two numbers"), ("00.a", "eleven", "two numbers"),
                             ("00.b", 6, "a list of three numbers"), ("00.d", "embed", "a list of two names"),
                             ("00.e", "RMSNorm", "a class name and a number")]:
        detail = grade(id, guess).detail
        assert words in detail, (id, guess, detail)
        assert str(truth(id)) not in detail and "11" not in detail
    assert "two numbers" in grade("00.a", "11").detail


def lesson_source(marker: str) -> str:
    return next("".join(c["source"]) for c in json.loads(LESSON.read_text())["cells"]
                if c["cell_type"] == "code" and marker in "".join(c["source"]))  # fmt: skip


def test_the_opening_model_of_the_lesson_is_the_one_the_predictions_record(capsys):
    """00.d and 00.e compute their truth on a copy of the lesson's opening model and batch: both
    must define and run the same layers, from the same seed."""
    from hooklab.exercises import nb00

    namespace = {}
    exec(lesson_source("class Block(nn.Module)"), namespace)
    exec(lesson_source("class Net(nn.Module)"), namespace)  # draws model and x as the lesson does
    theirs, x = namespace["model"], namespace["x"]
    ours, our_x = nb00._opening()
    assert [(n, type(m).__name__) for n, m in theirs.named_modules()] == \
        [(n, type(m).__name__) for n, m in ours.named_modules()]
    assert torch.equal(x, our_x)
    assert all(torch.equal(a, b) for a, b in zip(theirs.state_dict().values(), ours.state_dict().values(), strict=True))
    assert torch.equal(theirs(x).isnan(), ours(x).isnan())
    assert torch.allclose(theirs(x).nan_to_num(), ours(x).nan_to_num())
    assert "nan" in capsys.readouterr().out


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_opening_nan_does_not_hang_on_the_last_bit(sign):
    """The NaN comes from a row whose every value before block 3's ReLU is clearly negative, and no
    other row comes near zero: other CPUs, summing in another order, find the same NaN."""
    from hooklab.exercises import nb00

    model, x = nb00._opening()
    ran = {name: out for name, _, out in nb00._run_order(model, x)}
    row_max = {name: out.max(dim=1).values for name, out in ran.items() if name.endswith(".linear")}
    dead = row_max["blocks.3.linear"] < 0
    assert dead.tolist() == [True, False, False, False]
    before = [v for name, v in row_max.items() if name <= "blocks.3.linear"]
    assert all(v.nan_to_num(sign).abs().min() > 0.1 for v in before)


def test_00_a_and_00_e_say_which_part_of_the_guess_is_wrong():
    assert "identity(x) is right" in grade("00.a", [11, 3]).detail
    assert "identity.forward(x) is right" in grade("00.a", [7, 1]).detail
    assert "the layer is right; the number is not" in grade("00.e", ["RMSNorm", 5]).detail
    assert "the number is right; the layer is not" in grade("00.e", ["Linear", 6]).detail
    assert "RMSNorm is right" in grade("00.e", ["nn.RMSNorm", 1]).detail
    for guess in (["nn.RMSNorm", 6], ["torch.nn.RMSNorm", 6.0], ["'rmsnorm'", 6]):
        assert grade("00.e", guess).passed, guess
    assert not grade("00.e", ["nn.ReLU", 6]).passed


def test_00_e_accepts_the_name_of_a_layer_of_the_right_kind():
    for guess in (["blocks.3.norm", 6], ["'blocks.0.norm'", 6.0]):
        assert grade("00.e", guess).passed, guess
    assert "it makes the row of zeros" in grade("00.e", ["blocks.3.act", 6]).detail
    assert "does not make one" in grade("00.e", ["blocks.3.linear", 0]).detail
    assert "the layer is right; the number is not" in grade("00.e", ["blocks.3.norm", 5]).detail
    assert not grade("00.e", ["blocks.9.norm", 6]).passed
    assert grade("00.e", ["RMSNorm", "6"]).form and grade("00.a", [11.0]).form  # "not in the form asked"
    for guess in (["nn.RMSNorm", "6"], ["RMSNorm", " 5 "]):
        detail = grade("00.e", guess).detail
        assert "a number, not a string" in detail and "6" not in detail, detail


def test_the_lesson_falls_back_on_the_worked_answers_until_yours_pass():
    from hooklab.exercises.nb00 import Recorder, first_nan, yours_or_worked

    assert grade("00.3", Recorder).passed and grade("00.4", first_nan).passed
    mine = type("Recorder", (), {})
    assert yours_or_worked({"Recorder": mine}, "Recorder") in (mine, Recorder)
    assert yours_or_worked({}, "Recorder", "first_nan") == (Recorder, first_nan)


def test_00_c_and_00_f_give_hints_for_common_wrong_guesses():
    from hooklab.exercises import nb00

    every = [name for name, _ in nb00._leaves(nb00._opening()[0])]
    assert grade("00.c", ["'embed'"]).passed and grade("00.f", "'1'").passed
    assert "one key per leaf is what you want" in grade("00.c", every).detail
    assert "the loop's last name" in grade("00.c", ["head"]).detail
    assert "a list of names" in grade("00.c", "embed").detail
    assert "a finite number" in grade("00.f", "0").detail
    assert "its hook sees a NaN" in grade("00.f", None).detail
    assert "a string, '1'" in grade("00.f", 1).detail
    assert "write one name" in grade("00.f", ["1"]).detail


def test_the_lesson_shows_the_models_its_predictions_compute_on():
    """00.c runs the loop the lesson shows; 00.f the lesson's LogBetween."""
    assert "kept[name] = output.detach().clone()" in lesson_source("def keep(module, args, output):")
    assert "return self[1](torch.log(self[0](x)))" in lesson_source("class LogBetween(nn.Sequential)")


def test_00_2_rejects_removing_every_registration_of_the_function():
    def by_function(module, hook, x):
        module.register_forward_hook(hook)
        try:
            return module(x)
        finally:
            for key in [key for key, registered in module._forward_hooks.items() if registered is hook]:
                del module._forward_hooks[key]

    failed("00.2", by_function, "registered the same function as a forward hook first",
           "remove only your own, with the handle")

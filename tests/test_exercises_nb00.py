"""Exercise checkers of notebook 00 accept a right answer and reject typical wrong ones; its predictions
compute what the lesson shows."""

from __future__ import annotations

import torch
from answers import failed

from hooklab.exercises import grade


# ----- 00.1 -------------------------------------------------------------------------------------
def counter_right(module):
    calls = []
    return calls, module.register_forward_hook(lambda m, args, output: calls.append(1))


def test_00_1_accepts_a_counting_hook():
    assert grade("00.1", counter_right).passed


def test_00_1_rejects_wrong_answers():
    failed("00.1", lambda m: ([], m.register_forward_hook(lambda *a: None)))  # counts nothing
    result = grade("00.1", lambda m: counter_right(m)[0])  # forgot the handle
    assert not result.passed and "(calls, handle)" in result.detail
    result = grade("00.1", lambda m: ([], None))
    assert not result.passed and "handle" in result.detail


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

    def nothing(module, hook, x):
        run_right(module, hook, x)

    failed("00.2", with_a_count, "return only the output of module(x), got (Tensor, int)")
    failed("00.2", nothing, "missing return?")


# ----- 00.1: return values, the output, and hooks left behind -----------------------------------
def test_00_1_says_what_is_wrong_with_the_returned_pair():
    def swapped(module):
        calls, handle = counter_right(module)
        return handle, calls

    def count_as_int(module):
        count = [0]
        handle = module.register_forward_hook(lambda m, args, output: count.__setitem__(0, count[0] + 1))
        return count[0], handle

    for wrong, words in [(swapped, "wrong way round"), (count_as_int, "first item must be the list")]:
        failed("00.1", wrong, words)
    failed("00.1", lambda m: None, "missing return?")


def test_00_1_accepts_the_pair_as_a_list():
    assert grade("00.1", lambda m: list(counter_right(m))).passed


def test_00_1_rejects_a_hook_that_changes_the_output():
    def returns_the_pair(module):
        calls = []
        return calls, module.register_forward_hook(lambda m, args, output: (calls.append(1), output))

    def returns_zero(module):
        calls = []
        return calls, module.register_forward_hook(lambda m, args, output: calls.append(1) or 0)

    for wrong in (returns_the_pair, returns_zero):
        failed("00.1", wrong, "must return None")


def test_00_1_rejects_an_extra_hook_left_on_the_layer():
    def with_debug_print(module):
        module.register_forward_pre_hook(lambda m, args: None)
        return counter_right(module)

    result = grade("00.1", with_debug_print)
    assert not result.passed and "a forward pre-hook is still registered on the Linear" in result.detail


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

    for wrong, words in [
        (only_value_errors, "another type, the hook was left"),
        (not_on_stop, "KeyboardInterrupt (as pressing stop does), the hook was left"),
        (swallows_errors, "your code swallowed it"),
    ]:
        failed("00.2", wrong, words)


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
    """The worked answer: a forward hook per child keeps a detached copy; __exit__ removes them all."""

    def __init__(self, model):
        self.model, self.outputs, self.handles = model, {}, []

    def copy(self, output):
        return output.detach().clone()

    def __enter__(self):
        for name, child in self.model.named_children():

            def keep(module, args, output, name=name):
                self.outputs[name] = self.copy(output)

            self.handles.append(child.register_forward_hook(keep))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


def test_00_3_accepts_the_worked_answer_and_its_variants():
    class CloneThenDetach(Recorder):
        def copy(self, output):
            return output.clone().detach()

    class EveryModule(Recorder):  # named_modules(): the model itself is recorded too, under ''
        def __enter__(self):
            for name, module in self.model.named_modules():
                self.handles.append(module.register_forward_hook(
                    lambda m, args, output, name=name: self.outputs.__setitem__(name, output.detach().clone())))
            return self

    class WithHooks(Recorder):  # the handles owned by a hooklab.Hooks
        def __enter__(self):
            import hooklab

            self.hooks = hooklab.Hooks()
            for name, child in self.model.named_children():
                self.hooks.add(child.register_forward_hook(
                    lambda m, args, output, name=name: self.outputs.__setitem__(name, output.detach().clone())))
            return self

        def __exit__(self, *exc):
            self.hooks.remove()

    for right in (Recorder, CloneThenDetach, EveryModule, WithHooks):
        outcome = grade("00.3", right)
        assert outcome.passed, (right.__name__, outcome.detail)


def test_00_3_names_the_copy_that_is_not_a_detached_clone():
    class DetachOnly(Recorder):
        def copy(self, output):
            return output.detach()

    class CloneOnly(Recorder):
        def copy(self, output):
            return output.clone()

    class Shape(Recorder):
        def copy(self, output):
            return output.shape

    failed("00.3", DetachOnly, "changed after the layer ran", "in-place ReLU", "detach().clone()")
    failed("00.3", CloneOnly, "still part of the autograd graph", "detach().clone()")
    failed("00.3", Shape, "what was kept for layer 'early' is (int, int), not a tensor")


def test_00_3_hints_at_name_equals_name():
    class LateName(Recorder):
        def __enter__(self):
            for name, child in self.model.named_children():

                def keep(module, args, output):
                    self.outputs[name] = output.detach().clone()  # noqa: B023  (the slip under test)

                self.handles.append(child.register_forward_hook(keep))
            return self

    failed("00.3", LateName, "every output was kept under one name, 'act'", "name=name")


def test_00_3_wants_the_order_the_layers_ran_in():
    class Prefilled(Recorder):  # the names written in definition order, before anything ran
        def __init__(self, model):
            super().__init__(model)
            self.outputs = dict.fromkeys(name for name, _ in model.named_children())

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

    failed("00.3", NeverRemoves, "after the with block, a forward hook is still registered on layer 'late'", "__exit__")
    failed("00.3", OnlyOnSuccess, "when the with block raised an error", "whatever was raised")
    failed("00.3", NotOnStop, "raised KeyboardInterrupt (as pressing stop does)", "whatever was raised")
    failed("00.3", Swallows, "your recorder swallowed it", "must not return True")


def test_00_3_names_other_slips():
    class NoSelf(Recorder):
        def __enter__(self):
            super().__enter__()

    class ReturnsTheCopy(Recorder):
        def __enter__(self):
            for name, child in self.model.named_children():
                self.handles.append(child.register_forward_hook(
                    lambda m, args, output, name=name: self.outputs.setdefault(name, output.detach().clone())))
            return self

    class Shared(Recorder):
        outputs = {}  # noqa: RUF012  (the slip under test: one dict for every recorder)

        def __init__(self, model):
            self.model, self.handles = model, []

    class Children(Recorder):  # forgot the ReLU: registers on the Linear layers only
        def __enter__(self):
            for name, child in self.model.named_children():
                if isinstance(child, torch.nn.Linear):
                    self.handles.append(child.register_forward_hook(
                        lambda m, args, output, name=name: self.outputs.__setitem__(name, output.detach().clone())))
            return self

    failed("00.3", NoSelf, "__enter__ returned None", "return self")
    failed("00.3", ReturnsTheCopy, "the hook must return None")
    failed("00.3", Shared, "two recorders share one outputs dict", "__init__")
    failed("00.3", Children, "nothing was kept for layer 'act'")
    failed("00.3", Recorder(torch.nn.Linear(1, 1)), "pass the class itself")


def test_00_3_stub_is_not_solved_yet():
    from hooklab.exercises import check, checked

    class Stub(Recorder):
        def __enter__(self):
            raise NotImplementedError

    check("00.3", Stub)
    assert checked()["00.3"] == ("not solved yet", "")


# ----- predictions -------------------------------------------------------------------------------
def truth(id):
    from hooklab.exercises import exercises

    return exercises()[id].checker.__wrapped__.truth()


def test_the_predictions_compute_what_the_lesson_shows():
    assert truth("00.a") == 11.0
    assert truth("00.b") == [1, 2, 3]
    assert truth("00.c") == ["embed", "act", "norm", "head"]


def test_the_predictions_answer_right_and_give_hints_for_common_wrong_guesses():
    assert grade("00.a", 11).passed and grade("00.b", [1.0, 2.0, 3.0]).passed
    assert grade("00.c", ["Embed", "act", "'norm'", " head"]).passed
    assert "received times_ten's result" in grade("00.a", 2.0).detail
    assert "does not replace it" in grade("00.b", [1, 1, 1]).detail
    assert "the order the model defines its layers in" in grade("00.c", ["head", "norm", "embed", "act"]).detail
    assert not grade("00.c", ["embed", "act", "norm"]).passed


def test_the_opening_model_of_the_lesson_is_the_one_prediction_00c_records():
    """00.c computes its truth on a copy of the lesson's opening model: both must define and run
    the same layers."""
    import json
    from pathlib import Path

    from torch import nn

    from hooklab.exercises import nb00

    lesson = Path(__file__).resolve().parents[1] / "notebooks" / "00_start_here.ipynb"
    source = next("".join(c["source"]) for c in json.loads(lesson.read_text())["cells"]
                  if "class Net(nn.Module)" in "".join(c["source"]))  # fmt: skip
    namespace = {}
    exec(source, namespace)
    ours, theirs = nb00._OpeningNet(), namespace["Net"]()
    assert [(n, type(m).__name__) for n, m in theirs.named_children()] == \
        [(n, type(m).__name__.lstrip("_")) for n, m in ours.named_children()]
    x = torch.randn(3, 4)
    theirs.load_state_dict(ours.state_dict())
    assert torch.equal(theirs(x), ours(x))
    assert isinstance(theirs.embed, nn.Linear) and theirs.embed.bias is None

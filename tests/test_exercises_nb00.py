"""Exercise checkers of notebook 00 accept a right answer and reject typical wrong ones."""

from __future__ import annotations

import torch
from answers import failed

from hooklab import record
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


# ----- 00.3 -------------------------------------------------------------------------------------
def first_nan_right(model, x):
    with record(model) as rec:
        model(x)
    return next((r.name for r in rec if torch.isnan(r.output).any()), None)


def test_00_3_accepts_the_first_nan_in_execution_order():
    assert grade("00.3", first_nan_right).passed


def test_00_3_rejects_wrong_answers():
    def registration_order(model, x):
        with record(model) as rec:
            model(x)
        names = [name for name, _ in model.named_modules()]
        bad = [r.name for r in rec if torch.isnan(r.output).any()]
        return min(bad, key=names.index) if bad else None

    def last_nan(model, x):
        with record(model) as rec:
            model(x)
        return next((r.name for r in reversed(rec.records) if torch.isnan(r.output).any()), None)

    def never_none(model, x):
        return first_nan_right(model, x) or "log"

    result = grade("00.3", registration_order)
    assert not result.passed and "execution order" in result.detail
    failed("00.3", last_nan, "execution order")
    result = grade("00.3", never_none)
    assert not result.passed and "None" in result.detail


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
    assert not result.passed and "still on the layer" in result.detail


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


# ----- 00.3: record blocks left open, orders, NaN versus inf ------------------------------------
def test_00_3_says_when_a_record_block_was_not_exited():
    def never_exits(model, x):
        rec = record(model).__enter__()
        model(x)
        return next((r.name for r in rec if torch.isnan(r.output).any()), None)

    def exits_only_when_found(model, x):
        recorder = record(model)
        rec = recorder.__enter__()
        model(x)
        for r in rec:
            if torch.isnan(r.output).any():
                recorder.__exit__(None, None, None)
                return r.name
        return None

    for wrong in (never_exits, exits_only_when_found):
        failed("00.3", wrong, "record block was not exited")
    assert torch._C._len_torch_function_stack() == 0


def test_00_3_rejects_the_reversed_definition_order():
    def reversed_definition(model, x):
        with record(model) as rec:
            model(x)
        bad = {r.name for r in rec if torch.isnan(r.output).any()}
        return next((name for name, _ in reversed(list(model.named_children())) if name in bad), None)

    result = grade("00.3", reversed_definition)
    assert not result.passed and "execution order" in result.detail


def test_00_3_rejects_looking_for_any_non_finite_value():
    def first_non_finite(model, x):
        with record(model) as rec:
            model(x)
        return next((r.name for r in rec if not torch.isfinite(r.output).all()), None)

    result = grade("00.3", first_non_finite)
    assert not result.passed and "torch.isnan" in result.detail

"""Exercise checkers of notebook 00 accept a right answer and reject typical wrong ones."""

from __future__ import annotations

import torch

from hooklab import record
from hooklab.exercises import grade


# ----- 00.1 -------------------------------------------------------------------------------------
def counter_right(module):
    calls = []
    return calls, module.register_forward_hook(lambda m, args, output: calls.append(1))


def test_00_1_accepts_a_counting_hook():
    assert grade("00.1", counter_right).passed


def test_00_1_rejects_wrong_answers():
    assert not grade("00.1", lambda m: ([], m.register_forward_hook(lambda *a: None))).passed  # counts nothing
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

    for wrong, words in [
        (happy_path_only, "finally"),
        (swallows, "swallowed"),
        (never_removes, "still registered"),
        (ignores_hook, "10 times"),
    ]:
        result = grade("00.2", wrong)
        assert not result.passed and words in result.detail, (wrong.__name__, result.detail)


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
    assert not grade("00.3", last_nan).passed
    result = grade("00.3", never_none)
    assert not result.passed and "None" in result.detail

"""Checkers of notebook 02: each accepts a worked answer and rejects a typical wrong one."""

from __future__ import annotations

from hooklab.exercises import exercises, grade

IDS = sorted(id for id in exercises() if id.startswith("02."))


def test_notebook_02_has_four_exercises():
    assert IDS == ["02.1", "02.2", "02.3", "02.4"]


# ----- 02.1 -----------------------------------------------------------------------------------
def order_right(model, x):
    calls, handles = [], []
    try:
        for name, module in list(model.named_modules())[1:]:
            handles.append(module.register_forward_hook(lambda m, a, o, name=name: calls.append(name)))
        model(x)
    finally:
        for h in handles:
            h.remove()
    return calls


def order_leaves_only(model, x):
    calls, handles = [], []
    try:
        for name, module in model.named_modules():
            if next(module.children(), None) is None:
                handles.append(module.register_forward_hook(lambda m, a, o, name=name: calls.append(name)))
        model(x)
    finally:
        for h in handles:
            h.remove()
    return calls


def order_from_named_modules(model, x):
    return [name for name, _ in model.named_modules()][1:]


def order_leaking(model, x):
    calls = []
    for name, module in list(model.named_modules())[1:]:
        module.register_forward_hook(lambda m, a, o, name=name: calls.append(name))
    model(x)
    return calls


def test_02_1_accepts_hooks_on_every_submodule():
    assert grade("02.1", order_right).passed


def test_02_1_rejects_leaves_only_registration_order_and_leaks():
    assert not grade("02.1", order_leaves_only).passed
    wrong_order = grade("02.1", order_from_named_modules)
    assert not wrong_order.passed
    leaking = grade("02.1", order_leaking)
    assert not leaking.passed and "left" in leaking.detail


# ----- 02.2 -----------------------------------------------------------------------------------
def test_02_2_accepts_clamp_and_rejects_detached_or_missing_handle():
    assert grade("02.2", lambda m, limit: m.register_forward_hook(lambda mod, a, out: out.clamp(-limit, limit))).passed
    detached = grade(
        "02.2",
        lambda m, limit: m.register_forward_hook(lambda mod, a, out: out.detach().clamp(-limit, limit))
    )
    assert not detached.passed
    no_return = grade("02.2", lambda m, limit: m.register_forward_hook(lambda mod, a, out: None))
    assert not no_return.passed


# ----- 02.3 -----------------------------------------------------------------------------------
def keeper(copy):
    def keep_output(module):
        kept = []
        return kept, module.register_forward_hook(lambda m, a, out: kept.append(copy(out)))

    return keep_output


def test_02_3_accepts_a_detached_clone():
    assert grade("02.3", keeper(lambda t: t.detach().clone())).passed


def test_02_3_rejects_plain_detach_and_graph_keeping():
    overwritten = grade("02.3", keeper(lambda t: t.detach()))
    assert not overwritten.passed and "in-place" in overwritten.detail
    assert not grade("02.3", keeper(lambda t: t.clone())).passed


# ----- 02.4 -----------------------------------------------------------------------------------
def test_02_4_accepts_a_with_kwargs_pre_hook():
    def force_keyword(module, name, value):
        hook = lambda m, args, kwargs: (args, {**kwargs, name: value})  # noqa: E731
        return module.register_forward_pre_hook(hook, with_kwargs=True)

    assert grade("02.4", force_keyword).passed


def test_02_4_rejects_a_hook_that_only_fills_missing_keywords():
    def fill_missing(module, name, value):
        hook = lambda m, args, kwargs: (args, {name: value, **kwargs})  # noqa: E731
        return module.register_forward_pre_hook(hook, with_kwargs=True)

    assert not grade("02.4", fill_missing).passed


def test_02_1_names_the_late_binding_bug():
    def late_binding(model, x):
        calls, handles = [], []
        try:
            for name, module in list(model.named_modules())[1:]:
                handles.append(module.register_forward_hook(lambda m, a, o: calls.append(name)))  # noqa: B023
            model(x)
        finally:
            for h in handles:
                h.remove()
        return calls

    result = grade("02.1", late_binding)
    assert not result.passed and "name=name" in result.detail

"""Checkers of the field guide G2: each accepts a worked answer and rejects a typical wrong one."""

from __future__ import annotations

import torch
from answers import failed, run_then_remove
from torch import nn

from hooklab.exercises import exercises, grade

IDS = sorted(id for id in exercises() if id.startswith("G2."))


def test_guide_g2_has_five_exercises():
    assert IDS == ["G2.1", "G2.2", "G2.3", "G2.4", "G2.5"]


# ----- G2.4 -----------------------------------------------------------------------------------
def hook_every_submodule(
    name_of=lambda name, module: name,
    skip_root=True,
    give_back=True,
    cleanup_in_finally=True,
    late_binding=False,
    count_down=True,
    when="start",
):
    """An answer to G2.4: a pre-hook lists each call with its depth and counts one level up, a forward
    hook counts one level down (variations: wrong)."""
    def call_tree(model, x):
        calls, handles, depth = [], [], [0]

        def enter(label):
            def hook(m, args):
                if when == "start":
                    calls.append((depth[0], label))
                depth[0] += 1

            return hook

        def leave(label):
            def hook(m, args, out):
                if count_down:
                    depth[0] -= 1
                if when == "end":
                    calls.append((depth[0], label))

            return hook

        def run():
            for name, module in model.named_modules():
                if name or not skip_root:
                    label = name_of(name, module)
                    if late_binding:  # the bug the exercise warns about: every hook sees the last label
                        pre = lambda m, args: enter(label)(m, args)  # noqa: B023, E731
                    else:
                        pre = enter(label)
                    handles.append(module.register_forward_pre_hook(pre))
                    handles.append(module.register_forward_hook(leave(label)))
            model(x)

        run_then_remove(run, handles, in_finally=cleanup_in_finally)
        return calls if give_back else None

    return call_tree


tree_right = hook_every_submodule()


def names_in_finishing_order(model, x):
    """The guide's walk of resnet18, the same hooks: names only, in the order the calls end."""
    calls, handles = [], []

    def run():
        for name, module in model.named_modules():
            if name:
                handles.append(module.register_forward_hook(lambda m, a, o, name=name: calls.append(name)))
        model(x)

    run_then_remove(run, handles)
    return calls


def tree_from_named_modules(model, x):
    return [(name.count("."), name) for name, _ in model.named_modules()][1:]


def tree_leaking(model, x):
    calls = []
    for name, module in list(model.named_modules())[1:]:
        module.register_forward_pre_hook(lambda m, a, name=name: calls.append((name.count("."), name)))
    model(x)
    return calls


def test_g2_4_accepts_pre_and_forward_hooks_counting_the_depth():
    result = grade("G2.4", tree_right)
    assert result.passed, result.detail


def test_g2_4_rejects_the_notebooks_walk_registration_order_and_leaks():
    names_only = grade("G2.4", names_in_finishing_order)
    assert not names_only.passed and "(depth, name)" in names_only.detail
    registration = grade("G2.4", tree_from_named_modules)
    assert not registration.passed and "calls" in registration.detail  # a module called twice is listed once
    leaking = grade("G2.4", tree_leaking)
    assert not leaking.passed and "still registered" in leaking.detail and "_forward" not in leaking.detail


def test_g2_4_says_when_a_call_must_be_listed_and_how_to_count():
    at_the_end = grade("G2.4", hook_every_submodule(when="end"))
    assert not at_the_end.passed and "pre-hook" in at_the_end.detail and "wrong order" in at_the_end.detail
    never_down = grade("G2.4", hook_every_submodule(count_down=False))
    assert not never_down.passed and "depth" in never_down.detail and "one level down" in never_down.detail


# ----- G2.2 -----------------------------------------------------------------------------------
def clipping(hook):
    """An answer to G2.2 whose forward hook returns ``hook(out, limit)`` in training mode, None in eval mode."""
    def clip_output(module, limit):
        def clip(m, args, out):
            return hook(out, limit) if m.training else None

        return module.register_forward_hook(clip)

    return clip_output


def test_g2_2_accepts_clamp_and_rejects_detached_or_missing_handle():
    result = grade("G2.2", clipping(lambda out, limit: out.clamp(-limit, limit)))
    assert result.passed, result.detail
    detached = grade("G2.2", clipping(lambda out, limit: out.detach().clamp(-limit, limit)))
    assert not detached.passed
    no_return = grade("G2.2", clipping(lambda out, limit: None))
    assert not no_return.passed


def test_g2_2_rejects_clipping_in_eval_mode():
    always = grade("G2.2", lambda m, limit: m.register_forward_hook(lambda mod, a, out: out.clamp(-limit, limit)))
    assert not always.passed and "module.training" in always.detail


# ----- G2.3 -----------------------------------------------------------------------------------
def test_g2_3_accepts_a_pre_hook_filling_in_a_missing_keyword():
    def default_keyword(module, name, value):
        hook = lambda m, args, kwargs: (args, {name: value, **kwargs})  # noqa: E731
        return module.register_forward_pre_hook(hook, with_kwargs=True)

    result = grade("G2.3", default_keyword)
    assert result.passed, result.detail

    def only_when_missing(module, name, value):
        def hook(m, args, kwargs):
            if name not in kwargs:
                return args, {**kwargs, name: value}
            return None

        return module.register_forward_pre_hook(hook, with_kwargs=True)

    assert grade("G2.3", only_when_missing).passed


def test_g2_3_rejects_a_hook_that_always_forces_the_keyword():
    def force_keyword(module, name, value):  # the guide's pre-hook that always sets the keyword
        hook = lambda m, args, kwargs: (args, {**kwargs, name: value})  # noqa: E731
        return module.register_forward_pre_hook(hook, with_kwargs=True)

    result = grade("G2.3", force_keyword)
    assert not result.passed and "only when the caller left it out" in result.detail


def test_g2_4_names_the_late_binding_bug():
    result = grade("G2.4", hook_every_submodule(late_binding=True))
    assert not result.passed and "name=name" in result.detail


# ----- review findings ------------------------------------------------------------------------
def test_g2_4_rejects_hooks_left_when_the_forward_raises():
    result = grade("G2.4", hook_every_submodule(cleanup_in_finally=False))
    assert not result.passed and "raised" in result.detail and "finally" in result.detail


def test_g2_4_says_what_is_wrong_with_the_names():
    failed("G2.4", hook_every_submodule(give_back=False),
           "return the list of (depth, name) pairs (got None (missing return?))")
    root = grade("G2.4", hook_every_submodule(skip_root=False))
    assert not root.passed and "leave out the root" in root.detail
    class_names = grade("G2.4", hook_every_submodule(name_of=lambda name, module: type(module).__name__))
    assert not class_names.passed and "named_modules()" in class_names.detail and "name=name" not in class_names.detail


def test_g2_2_rejects_clips_outside_the_graph():
    def through_data(out, limit):
        out.data.clamp_(-limit, limit)

    wrong_grad = grade("G2.2", clipping(through_data))
    assert not wrong_grad.passed and "gradient is wrong" in wrong_grad.detail
    for copy in (
        lambda out, limit: out.detach().clamp(-limit, limit).requires_grad_(),
        lambda out, limit: torch.tensor(out.tolist(), requires_grad=True).clamp(-limit, limit),
    ):
        result = grade("G2.2", clipping(copy))
        assert not result.passed and "no gradient reached the weight" in result.detail


def test_g2_2_rejects_a_global_hook():
    def clip_everything(module, limit):
        return nn.modules.module.register_module_forward_hook(lambda m, a, out: out.clamp(-limit, limit))

    result = grade("G2.2", clip_everything)
    assert not result.passed and "did not hook" in result.detail


def test_g2_2_rejects_an_in_place_clamp():
    def in_place(out, limit):
        out.clamp_(-limit, limit)

    result = grade("G2.2", clipping(in_place))
    assert not result.passed and "in-place" in result.detail


def test_g2_2_needs_the_handle_and_a_returned_output():
    layers = []

    def gives_the_hook(module, limit):
        layers.append(module)
        hook = lambda m, a, out: out.clamp(-limit, limit)  # noqa: E731
        module.register_forward_hook(hook)
        return hook

    result = grade("G2.2", gives_the_hook)
    assert not result.passed and "clip_output must return the handle" in result.detail
    assert not layers[0]._forward_hooks

    def forgets_to_return(out, limit):
        out = out.clamp(-limit, limit)

    no_return = grade("G2.2", clipping(forgets_to_return))
    assert not no_return.passed and "must return the new output" in no_return.detail


def test_g2_3_keeps_the_callers_other_keywords():
    def drops_the_rest(module, name, value):
        return module.register_forward_pre_hook(lambda m, args, kwargs: (args, {name: value}), with_kwargs=True)

    result = grade("G2.3", drops_the_rest)
    assert not result.passed and "factor=3.0" in result.detail  # the caller's factor was dropped too

    def drops_the_others(module, name, value):
        return module.register_forward_pre_hook(
            lambda m, args, kwargs: (args, {name: kwargs.get(name, value)}), with_kwargs=True
        )

    result = grade("G2.3", drops_the_others)
    assert not result.passed and "other keyword" in result.detail


def test_g2_3_says_to_register_with_kwargs():
    def without_kwargs(module, name, value):
        return module.register_forward_pre_hook(lambda m, args: (args, {name: value}))

    result = grade("G2.3", without_kwargs)
    assert not result.passed and "with_kwargs=True" in result.detail


def tree_from_dots(model, x):
    """Pre-hooks only, the depth read from the dots of the name: right only while every module is called
    by its parent."""
    calls, handles = [], []

    def run():
        for name, module in model.named_modules():
            if name:
                record = lambda m, a, name=name: calls.append((name.count("."), name))  # noqa: E731
                handles.append(module.register_forward_pre_hook(record))
        model(x)

    run_then_remove(run, handles)
    return calls


def tree_with_a_stack(model, x):
    """A correct answer: the names of the calls still running, on a stack."""
    calls, running, handles = [], [], []

    def enter(name):
        def hook(m, args):
            calls.append((len(running), name))
            running.append(name)

        return hook

    def run():
        for name, module in model.named_modules():
            if name:
                handles.append(module.register_forward_pre_hook(enter(name)))
                handles.append(module.register_forward_hook(lambda m, a, o: running.pop() and None))
        model(x)

    run_then_remove(run, handles)
    return calls


def tree_with_nonlocal(model, x):
    """A correct answer: an int counter changed through ``nonlocal``."""
    calls, handles, depth = [], [], 0

    def enter(m, args, name):
        nonlocal depth
        calls.append((depth, name))
        depth += 1

    def leave(m, args, out):
        nonlocal depth
        depth -= 1

    def run():
        for name, module in model.named_modules():
            if name:
                handles.append(module.register_forward_pre_hook(lambda m, a, name=name: enter(m, a, name)))
                handles.append(module.register_forward_hook(leave))
        model(x)

    run_then_remove(run, handles)
    return calls


def test_g2_4_rejects_depths_read_from_the_names():
    result = grade("G2.4", tree_from_dots)
    assert not result.passed and "dots" in result.detail and "depth 2" in result.detail, result.detail


def test_g2_4_accepts_a_stack_and_a_nonlocal_counter():
    for answer in (tree_with_a_stack, tree_with_nonlocal):
        result = grade("G2.4", answer)
        assert result.passed, result.detail


# ----- G2.1 -----------------------------------------------------------------------------------
def gains_answer(upside_down=False, measure=torch.std, cleanup_in_finally=True, pre=True):
    """An answer to G2.1: a pre-hook per child keeps the input's spread, a forward hook divides the output's by
    it (variations: wrong; ``pre=False`` reads the input in the forward hook, overwritten by an in-place ReLU)."""
    def activation_gains(model, x):
        gains, spread, handles = {}, {}, []
        for name, child in model.named_children():
            def before(m, args, name=name):
                spread[name] = measure(args[0])

            def after(m, args, out, name=name):
                spread_in = spread[name] if pre else measure(args[0])
                ratio = spread_in / measure(out) if upside_down else measure(out) / spread_in
                gains[name] = ratio.item()

            handles.append(child.register_forward_pre_hook(before))
            handles.append(child.register_forward_hook(after))
        run_then_remove(lambda: model(x), handles, in_finally=cleanup_in_finally)
        return gains

    return activation_gains


def test_g2_1_accepts_a_pre_hook_and_a_forward_hook_per_child_and_a_tensor_gain():
    assert grade("G2.1", gains_answer()).passed

    def tensor_gains(model, x):
        gains, spread, handles = {}, {}, []
        for name, child in model.named_children():
            def before(m, args, name=name):
                spread[name] = args[0].std()

            def after(m, args, out, name=name):
                gains[name] = out.std() / spread[name]

            handles += [child.register_forward_pre_hook(before), child.register_forward_hook(after)]
        run_then_remove(lambda: model(x), handles)
        return gains

    result = grade("G2.1", tensor_gains)
    assert result.passed and "'2'" in result.detail, result.detail


def test_g2_1_rejects_upside_down_other_measures_overwritten_inputs_and_leftover_hooks():
    failed("G2.1", gains_answer(upside_down=True), "upside down")
    failed("G2.1", gains_answer(measure=lambda t: t.abs().mean()), "child", "expected")
    failed("G2.1", gains_answer(pre=False), "work in place", "pre-hook")
    failed("G2.1", gains_answer(cleanup_in_finally=False), "finally")
    failed("G2.1", lambda model, x: None, "None (missing return?)")


# ----- G2.5 -----------------------------------------------------------------------------------
class Stop(Exception):
    pass


def stop_answer(catch=Stop, raise_=True, keep="output", cleanup_in_finally=True, stop_at="last", detach=True):
    """An answer to G2.5: forward hooks keep the outputs, the one that completes the set raises ``Stop``
    (variations: wrong)."""
    def outputs_of(model, names, x):
        kept, handles = {}, []

        def keep_output(name):
            def hook(m, args, out):
                value = out if keep == "output" else args[0]
                kept[name] = value.detach() if detach else value
                done = len(kept) == len(names) if stop_at == "last" else True
                if raise_ and done:
                    raise Stop

            return hook

        for name in names:
            handles.append(model.get_submodule(name).register_forward_hook(keep_output(name)))
        if not cleanup_in_finally:
            try:
                model(x)
            except catch:
                pass
            for handle in handles:
                handle.remove()
            return kept
        try:
            model(x)
        except catch:
            pass
        finally:
            for handle in handles:
                handle.remove()
        return kept

    return outputs_of


def test_g2_5_accepts_a_private_exception():
    result = grade("G2.5", stop_answer())
    assert result.passed, result.detail


def test_g2_5_rejects_running_on_swallowing_errors_wrong_values_and_leftover_hooks():
    failed("G2.5", stop_answer(raise_=False), "went on after")
    failed("G2.5", stop_answer(stop_at="first"), "stop only once every named layer has run")
    failed("G2.5", stop_answer(detach=False), "detached")
    failed("G2.5", stop_answer(catch=Exception), "swallowed it")
    failed("G2.5", stop_answer(keep="input"), "not the output")
    failed("G2.5", stop_answer(cleanup_in_finally=False), "finally")


def test_g2_1_names_the_loop_variable_when_every_hook_wrote_under_the_last_name():
    def late_bound(model, x):
        gains, spread, handles = {}, {}, []
        for name, child in model.named_children():
            handles.append(child.register_forward_pre_hook(lambda m, args: spread.update({name: args[0].std()})))  # noqa: B023
            handles.append(child.register_forward_hook(
                lambda m, args, out: gains.update({name: (out.std() / spread[name]).item()})))  # noqa: B023
        run_then_remove(lambda: model(x), handles)
        return gains

    failed("G2.1", late_bound, "name=name", "last")


def test_no_message_names_a_private_attribute():
    details = [grade("G2.1", gains_answer(cleanup_in_finally=False)).detail, grade("G2.4", tree_leaking).detail,
               grade("G2.5", stop_answer(cleanup_in_finally=False)).detail]
    assert all("still registered" in d and "_forward" not in d for d in details), details

"""Exercise checkers of notebook 01 accept a right answer and reject wrong ones."""

from __future__ import annotations

import fnmatch

import torch
from answers import failed

from hooklab.audit import global_hooks
from hooklab.exercises import check, grade


# ----- 01.1 -------------------------------------------------------------------------------------
def scale_grad_right(t, factor):
    def scale(grad):
        return grad * factor

    return t.register_hook(scale)


def test_01_1_accepts_a_hook_returning_the_scaled_gradient():
    assert grade("01.1", scale_grad_right).passed


def test_01_1_rejects_wrong_answers():
    def in_place(t, factor):
        return t.register_hook(lambda grad: grad.mul_(factor))

    def returns_nothing(t, factor):
        return t.register_hook(lambda grad: None)

    def fixed_factor(t, factor):
        return t.register_hook(lambda grad: grad * 3)

    def no_handle(t, factor):
        scale_grad_right(t, factor)

    for wrong, words in [
        (in_place, "in place"),
        (returns_nothing, "must return the new gradient"),
        (fixed_factor, "factor -0.5"),
        (no_handle, "missing return?"),
    ]:
        failed("01.1", wrong, words)


# ----- 01.2 -------------------------------------------------------------------------------------
def grad_norms_with(keep=lambda grad: grad.norm().item(), result=lambda grad: None, bind=True):
    """A right answer to 01.2, or a wrong one: what it keeps, what its hook returns, or a late-bound name."""

    def grad_norms(named):
        norms, handles = {name: [] for name in named}, []
        for name, t in named.items():
            def hook(grad, bound=name):
                norms[bound if bind else name].append(keep(grad))  # noqa: B023 (the late-binding bug, on purpose)
                return result(grad)

            handles.append(t.register_hook(hook))
        return norms, handles

    return grad_norms


def test_01_2_accepts_one_norm_per_backward_under_each_name():
    assert grade("01.2", grad_norms_with()).passed


def test_01_2_rejects_wrong_answers():
    for wrong, words in [
        (grad_norms_with(bind=False), "name=name"),
        (grad_norms_with(keep=lambda grad: grad.norm()), "Python floats"),
        (grad_norms_with(keep=lambda grad: grad.abs().max().item()), "norms['h'] is"),
        (grad_norms_with(result=lambda grad: 2 * grad), "must return None"),
    ]:
        failed("01.2", wrong, words)


def test_01_2_wants_every_name_and_the_handles():
    def names_on_first_gradient(named):
        norms, handles = {}, []
        for name, t in named.items():
            def hook(grad, name=name):
                norms.setdefault(name, []).append(grad.norm().item())

            handles.append(t.register_hook(hook))
        return norms, handles

    failed("01.2", names_on_first_gradient, "expected every name")
    failed("01.2", lambda named: grad_norms_with()(named)[0], "(norms, handles)")


# ----- 01.3 -------------------------------------------------------------------------------------
def clamp_matching_with(count=lambda g, limit: int((g.abs() > limit).sum()),
                        clamp=lambda g, limit: g.clamp(-limit, limit), matches=fnmatch.fnmatch):
    """A right answer to 01.3, or a wrong one with one of its parts replaced."""

    def clamp_matching(model, pattern, limit):
        clamped, handles = {}, []
        for name, p in model.named_parameters():
            if matches(name, pattern):
                clamped[name] = 0

                def hook(grad, name=name):
                    clamped[name] += count(grad, limit)
                    return clamp(grad, limit)

                handles.append(p.register_hook(hook))
        return handles, clamped

    return clamp_matching


def test_01_3_accepts_a_clamping_and_counting_hook_per_matching_parameter():
    assert grade("01.3", clamp_matching_with()).passed


def test_01_3_accepts_counts_kept_as_tensors():
    # clamped[name] becomes a 0-d tensor that the second backward's += changes in place
    assert grade("01.3", clamp_matching_with(count=lambda g, limit: (g.abs() > limit).sum())).passed


def test_01_3_rejects_a_substring_test_with_a_hint_to_use_fnmatch():
    substring = clamp_matching_with(matches=lambda name, pattern: pattern.strip("*") in name)
    result = grade("01.3", substring)
    assert not result.passed and "'?.bias'" in result.detail and "fnmatch.fnmatch" in result.detail, result.detail


def test_01_3_rejects_wrong_clamps():
    for clamp, words in [
        (lambda g, limit: g.clamp(min=-limit), "instead of the clamped gradient"),
        (lambda g, limit: None, "instead of the clamped gradient"),
        (lambda g, limit: g.clamp(-1, 1), "limit 0.5"),
        (lambda g, limit: g.clamp_(-limit, limit), "in place"),
    ]:
        failed("01.3", clamp_matching_with(clamp=clamp), words)


def test_01_3_rejects_hooks_on_parameters_the_pattern_does_not_name():
    result = grade("01.3", clamp_matching_with(matches=lambda name, pattern: True))
    assert not result.passed and "handles for" in result.detail
    result = grade("01.3", clamp_matching_with(matches=lambda name, pattern: pattern in name))  # not a pattern
    assert not result.passed and "0 handles for 2 matching parameters" in result.detail


def test_01_3_rejects_wrong_counts():
    def late_binding(model, pattern, limit):
        clamped, handles = {}, []
        for name, p in model.named_parameters():
            if fnmatch.fnmatch(name, pattern):
                clamped[name] = 0

                def hook(grad):
                    clamped[name] += int((grad.abs() > limit).sum())  # noqa: B023 (the bug, on purpose)
                    return grad.clamp(-limit, limit)

                handles.append(p.register_hook(hook))
        return handles, clamped

    def only_the_last(model, pattern, limit):
        handles, _ = clamp_matching_with(count=lambda g, limit: 0)(model, pattern, limit)
        return handles, {}

    for wrong, words in [
        (late_binding, "name=name"),
        (clamp_matching_with(count=lambda g, limit: int((g.abs() >= 0).sum())), "entries were outside"),
        (only_the_last, "clamped has the keys []"),
        (lambda model, pattern, limit: (clamp_matching_with()(model, pattern, limit)[0], 3), "got int"),
    ]:
        failed("01.3", wrong, words)
    # doubled counts: the last name's count equals the total, but the others are not 0, so no late binding
    outcome = failed("01.3", clamp_matching_with(count=lambda g, limit: 2 * int((g.abs() > limit).sum())),
                     "entries were outside")
    assert "name=name" not in outcome.detail, outcome.detail


def test_01_3_rejects_clamping_the_accumulated_grad():
    def after_accumulation(model, pattern, limit):
        clamped, handles = {}, []
        for name, p in model.named_parameters():
            if fnmatch.fnmatch(name, pattern):
                clamped[name] = 0

                def clamp(p, name=name):
                    clamped[name] += int((p.grad.abs() > limit).sum())
                    p.grad.clamp_(-limit, limit)

                handles.append(p.register_post_accumulate_grad_hook(clamp))
        return handles, clamped

    result = grade("01.3", after_accumulation)
    assert not result.passed and "second backward without zeroing" in result.detail


def test_01_3_says_what_is_wrong_with_the_returned_pair():
    right = clamp_matching_with()
    kept = []

    def fake_handles(model, pattern, limit):
        handles, clamped = right(model, pattern, limit)
        kept.extend(handles)

        class Fake:
            def remove(self):
                pass

        return [Fake() for _ in handles], clamped

    try:
        for wrong, words in [
            (lambda model, pattern, limit: right(model, pattern, limit)[0], "got only handles"),
            (lambda model, pattern, limit: (None, {}), "list of handles"),
            (fake_handles, "found Fake in it"),
        ]:
            failed("01.3", wrong, words)
    finally:
        for h in kept:
            h.remove()


def test_01_3_checks_that_the_handles_remove_the_hooks():
    def other_handles(model, pattern, limit):
        handles, clamped = clamp_matching_with()(model, pattern, limit)
        spare = torch.zeros(1, requires_grad=True)
        return [spare.register_hook(lambda g: g) for _ in handles], clamped

    result = grade("01.3", other_handles)
    assert not result.passed and "after removing your handles" in result.detail


# ----- 01.4 -------------------------------------------------------------------------------------
def fuse_right(model, lr):
    def step(p):
        with torch.no_grad():
            p.add_(p.grad, alpha=-lr)
        p.grad = None

    return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]


def test_01_4_accepts_a_fused_sgd_step():
    assert grade("01.4", fuse_right).passed


def test_01_4_rejects_wrong_answers():
    def keeps_grad(model, lr):
        def step(p):
            with torch.no_grad():
                p.add_(p.grad, alpha=-lr)

        return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]

    def wrong_sign(model, lr):
        return fuse_right(model, -lr)

    def only_weights(model, lr):
        return fuse_right(model, lr)[::2]

    for wrong in (keeps_grad, wrong_sign, only_weights):
        failed("01.4", wrong)


# ----- 01.4: what is returned, a second learning rate, hooks left, no_grad, closures -------------
def test_01_4_says_what_is_wrong_with_the_returned_handles():
    def forgets_return(model, lr):
        fuse_right(model, lr)

    for wrong, words in [
        (forgets_return, "missing return?"),
        (lambda model, lr: fuse_right(model, lr)[0], "one handle"),
        (lambda model, lr: [fuse_right(model, lr)], "nested list"),
    ]:
        failed("01.4", wrong, words)


def test_01_4_rejects_a_hard_coded_learning_rate():
    result = grade("01.4", lambda model, lr: fuse_right(model, 0.1))
    assert not result.passed and "lr=0.05" in result.detail


def test_01_4_rejects_extra_hooks_left_on_the_parameters():
    def with_extra_hooks(model, lr):
        for p in model.parameters():
            p.register_hook(lambda g: None)
        return fuse_right(model, lr)

    result = grade("01.4", with_extra_hooks)
    assert not result.passed and "tensor hook" in result.detail


def test_01_4_wants_the_update_under_no_grad():
    def without_no_grad(model, lr):
        def step(p):
            p.add_(p.grad, alpha=-lr)
            p.grad = None

        return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]

    result = grade("01.4", without_no_grad)
    assert not result.passed and "torch.no_grad()" in result.detail


def test_01_4_hints_at_a_late_binding_closure():
    def late_binding(model, lr):
        handles = []
        for p in model.parameters():

            def step(_):
                with torch.no_grad():
                    p.add_(p.grad, alpha=-lr)  # noqa: B023 (the bug, on purpose)
                p.grad = None  # noqa: B023

            handles.append(p.register_post_accumulate_grad_hook(step))
        return handles

    result = grade("01.4", late_binding)
    assert not result.passed and "loop variable" in result.detail


# ----- 01.5 -------------------------------------------------------------------------------------
def test_01_5_accepts_a_doubling_prehook():
    assert grade("01.5", lambda node: node.register_prehook(lambda go: (go[0] * 2,))).passed


def test_01_5_rejects_wrong_answers():
    failed("01.5", lambda node: node.register_prehook(lambda go: (go[0] * 3,)), "doubled")
    failed("01.5", lambda node: node.register_prehook(lambda go: None), "doubled")
    # a post-hook replacing grad_inputs with twice grad_outputs skips exp's derivative
    failed("01.5", lambda node: node.register_hook(lambda gi, go: (go[0] * 2,)), "doubled")


def test_01_5_says_when_a_post_hook_doubled_the_result_instead():
    result = grade("01.5", lambda node: node.register_hook(lambda gi, go: (gi[0] * 2,)))
    assert not result.passed and "register_prehook" in result.detail


# ----- 01.5: the other branch, removal, the wrong node ------------------------------------------
def test_01_5_accepts_a_prehook_that_passes_none_entries_on():
    assert grade("01.5", lambda node: node.register_prehook(
        lambda go: tuple(None if g is None else 2 * g for g in go))).passed


def test_01_5_rejects_doubling_in_place():
    def in_place(node):
        def double(grad_outputs):
            for g in grad_outputs:
                g.mul_(2)

        return node.register_prehook(double)

    result = grade("01.5", in_place)
    assert not result.passed and "other branch" in result.detail


def test_01_5_checks_that_the_handle_removes_the_hook():
    spare = torch.zeros(1, requires_grad=True)

    def other_handle(node):
        node.register_prehook(lambda go: tuple(2 * g for g in go))
        return spare.register_hook(lambda g: g)

    result = grade("01.5", other_handle)
    assert not result.passed and "still doubled" in result.detail
    result = grade("01.5", lambda node: [node.register_prehook(lambda go: tuple(2 * g for g in go))])
    assert not result.passed and "got list" in result.detail


def test_01_5_says_when_another_node_was_hooked():
    result = grade("01.5", lambda node: node.next_functions[0][0].register_prehook(lambda go: tuple(2 * g for g in go)))
    assert not result.passed and "hooked another node?" in result.detail


# ----- 01.6 -------------------------------------------------------------------------------------
def storage_of(t):
    return t.untyped_storage().data_ptr()


def saved_bytes_with(where=storage_of, size=lambda t: t.untyped_storage().nbytes(),
                     skip=lambda t, x: storage_of(t) == storage_of(x), once=True):
    """A right answer to 01.6, or a wrong one with one of its parts replaced."""

    def saved_bytes(fn, x):
        sizes, every = {}, []

        def pack(t):
            if not skip(t, x):
                sizes[where(t)] = size(t)
                every.append(size(t))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(x)
        return sum(sizes.values()) if once else sum(every)

    return saved_bytes


def test_01_6_accepts_the_bytes_of_each_saved_storage_once():
    assert grade("01.6", saved_bytes_with()).passed


def test_01_6_accepts_a_set_of_storages():
    def with_a_set(fn, x):
        storages = set()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: storages.add(t.untyped_storage()) or t, lambda t: t):
            fn(x)
        storages.discard(x.untyped_storage())
        return sum(s.nbytes() for s in storages)

    assert grade("01.6", with_a_set).passed


def test_01_6_rejects_wrong_counts_with_the_trap_they_fell_into():
    own_size = lambda t: t.numel() * t.element_size()  # noqa: E731
    for answer, words in [
        (saved_bytes_with(once=False), "count each block (storage) once"),
        (saved_bytes_with(skip=lambda t, x: False), "leave x's storage out"),
        (saved_bytes_with(skip=lambda t, x: t is x), "leave x's storage out"),
        (saved_bytes_with(skip=lambda t, x: t.data_ptr() == x.data_ptr()), "its storage is x's"),
        (saved_bytes_with(where=lambda t: t.data_ptr()), "not data pointers"),
        (saved_bytes_with(size=own_size), "not only the elements it shows"),
        (saved_bytes_with(where=lambda t: t.data_ptr(), size=own_size,
                          skip=lambda t, x: t.data_ptr() == x.data_ptr()), "not only the elements it shows"),
        (lambda fn, x: (fn(x), 0)[1], "fewer bytes than the saved tensors keep alive"),
    ]:
        failed("01.6", answer, words)


def test_01_6_tries_a_second_shape_of_x():
    def hard_coded(fn, x):
        right = saved_bytes_with()(fn, x)
        return right if x.shape == (2, 3) else 24

    result = grade("01.6", hard_coded)
    assert not result.passed and "shape (4, 5)" in result.detail, result.detail


def test_01_6_runs_backward_through_what_the_hooks_saved():
    def packing(pack, unpack):
        def saved_bytes(fn, x):
            sizes = {}

            def note(t):
                sizes[storage_of(t)] = t.untyped_storage().nbytes()
                return pack(t)

            with torch.autograd.graph.saved_tensors_hooks(note, unpack):
                fn(x)
            sizes.pop(storage_of(x), None)
            return sum(sizes.values())

        return saved_bytes

    for pack, unpack in [(lambda t: None, lambda t: t), (lambda t: t, torch.zeros_like)]:
        result = grade("01.6", packing(pack, unpack))
        assert not result.passed and "backward through what your hooks saved" in result.detail, result.detail


def test_01_6_wants_no_hooks_left_when_fn_raises():
    def entered_by_hand(fn, x):
        hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        hooks.__enter__()
        total = saved_bytes_with()(fn, x)
        hooks.__exit__(None, None, None)
        return total

    result = grade("01.6", entered_by_hand)
    assert not result.passed and "when fn raised, your saved-tensor hooks stayed active" in result.detail
    assert global_hooks() == []


def test_01_6_says_what_is_wrong_with_the_returned_value():
    for answer, words in [
        (lambda fn, x: None, "missing return?"),
        (lambda fn, x: float(saved_bytes_with()(fn, x)), "got float"),
        (lambda fn, x: torch.tensor(saved_bytes_with()(fn, x)), "got Tensor"),
        (lambda fn, x: 0, "fn was never called"),
    ]:
        failed("01.6", answer, words)


def test_01_6_stub_is_not_solved_yet(capsys):
    def saved_bytes(fn, x):
        raise NotImplementedError

    check("01.6", saved_bytes)
    assert capsys.readouterr().out.endswith("): not solved yet\n")

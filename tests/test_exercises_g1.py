"""Exercise checkers of the field guide G1 accept a right answer and reject wrong ones."""

from __future__ import annotations

import fnmatch
import re

import torch
from answers import failed

from hooklab.audit import global_hooks
from hooklab.exercises import check, grade


# ----- G1.1 -------------------------------------------------------------------------------------
def storage_of(t):
    return t.untyped_storage().data_ptr()


def saved_bytes_with(where=storage_of, size=lambda t: t.untyped_storage().nbytes(),
                     skip=lambda t, x: storage_of(t) == storage_of(x), once=True):
    """A right answer to G1.1, or a wrong one with one of its parts replaced."""

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


def test_g1_1_accepts_the_bytes_of_each_saved_storage_once():
    assert grade("G1.1", saved_bytes_with()).passed


def test_g1_1_accepts_a_set_of_storages():
    def with_a_set(fn, x):
        storages = set()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: storages.add(t.untyped_storage()) or t, lambda t: t):
            fn(x)
        storages.discard(x.untyped_storage())
        return sum(s.nbytes() for s in storages)

    assert grade("G1.1", with_a_set).passed


def test_g1_1_rejects_wrong_counts_with_the_trap_they_fell_into():
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
        failed("G1.1", answer, words)


def test_g1_1_tries_a_second_shape_of_x():
    def hard_coded(fn, x):
        right = saved_bytes_with()(fn, x)
        return right if x.shape == (2, 3) else 24

    result = grade("G1.1", hard_coded)
    assert not result.passed and "shape (4, 5)" in result.detail, result.detail


def test_g1_1_runs_backward_through_what_the_hooks_saved():
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
        result = grade("G1.1", packing(pack, unpack))
        assert not result.passed and "backward through what your hooks saved" in result.detail, result.detail


def test_g1_1_wants_no_hooks_left_when_fn_raises():
    def entered_by_hand(fn, x):
        hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        hooks.__enter__()
        total = saved_bytes_with()(fn, x)
        hooks.__exit__(None, None, None)
        return total

    result = grade("G1.1", entered_by_hand)
    assert not result.passed and "when fn raised, your saved-tensor hooks stayed active" in result.detail
    assert global_hooks() == []


def test_g1_1_says_what_is_wrong_with_the_returned_value():
    for answer, words in [
        (lambda fn, x: None, "missing return?"),
        (lambda fn, x: float(saved_bytes_with()(fn, x)), "got float"),
        (lambda fn, x: torch.tensor(saved_bytes_with()(fn, x)), "got Tensor"),
        (lambda fn, x: 0, "fn was never called"),
    ]:
        failed("G1.1", answer, words)


def test_g1_1_stub_is_not_solved_yet(capsys):
    def saved_bytes(fn, x):
        raise NotImplementedError

    check("G1.1", saved_bytes)
    assert capsys.readouterr().out.endswith("): not solved yet\n")


# ----- G1.2 -------------------------------------------------------------------------------------
def test_g1_2_accepts_a_doubling_prehook():
    assert grade("G1.2", lambda node: node.register_prehook(lambda go: (go[0] * 2,))).passed


def test_g1_2_rejects_wrong_answers():
    failed("G1.2", lambda node: node.register_prehook(lambda go: (go[0] * 3,)), "doubled")
    failed("G1.2", lambda node: node.register_prehook(lambda go: None), "doubled")
    # a post-hook replacing grad_inputs with twice grad_outputs skips exp's derivative
    failed("G1.2", lambda node: node.register_hook(lambda gi, go: (go[0] * 2,)), "doubled")


def test_g1_2_says_when_a_post_hook_doubled_the_result_instead():
    result = grade("G1.2", lambda node: node.register_hook(lambda gi, go: (gi[0] * 2,)))
    assert not result.passed and "register_prehook" in result.detail


# ----- G1.2: the other branch, removal, the wrong node ------------------------------------------
def test_g1_2_accepts_a_prehook_that_passes_none_entries_on():
    assert grade("G1.2", lambda node: node.register_prehook(
        lambda go: tuple(None if g is None else 2 * g for g in go))).passed


def test_g1_2_rejects_doubling_in_place():
    def in_place(node):
        def double(grad_outputs):
            for g in grad_outputs:
                g.mul_(2)

        return node.register_prehook(double)

    result = grade("G1.2", in_place)
    assert not result.passed and "other branch" in result.detail


def test_g1_2_checks_that_the_handle_removes_the_hook():
    spare = torch.zeros(1, requires_grad=True)

    def other_handle(node):
        node.register_prehook(lambda go: tuple(2 * g for g in go))
        return spare.register_hook(lambda g: g)

    result = grade("G1.2", other_handle)
    assert not result.passed and "still doubled" in result.detail
    result = grade("G1.2", lambda node: [node.register_prehook(lambda go: tuple(2 * g for g in go))])
    assert not result.passed and "got list" in result.detail


def test_g1_2_says_when_another_node_was_hooked():
    result = grade("G1.2", lambda node: node.next_functions[0][0].register_prehook(lambda go: tuple(2 * g for g in go)))
    assert not result.passed and "hooked another node?" in result.detail


# ----- predictions G1.a and G1.b -----------------------------------------------------------------
def test_the_predictions_are_right_about_torch():
    for id, guess in {"G1.a": [1, 6], "G1.b": 12000}.items():
        assert grade(id, guess).passed, id


def test_a_common_wrong_guess_gets_its_own_hint():
    for id, guess, words in [
        ("G1.a", [6, 6], "one at a time"),
        ("G1.b", 16000, "sum saves no tensor"),
    ]:
        failed(id, guess, words)


# ----- G1.3 -------------------------------------------------------------------------------------
def clamp_matching_with(count=lambda g, limit: int((g.abs() > limit).sum()),
                        clamp=lambda g, limit: g.clamp(-limit, limit), matches=fnmatch.fnmatch):
    """A right answer to G1.3, or a wrong one with one of its parts replaced."""

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


def test_G1_3_accepts_a_clamping_and_counting_hook_per_matching_parameter():
    assert grade("G1.3", clamp_matching_with()).passed


def test_G1_3_wants_counts_as_python_ints():
    # clamped[name] becomes a 0-d tensor that the second backward's += changes in place
    failed("G1.3", clamp_matching_with(count=lambda g, limit: (g.abs() > limit).sum()),
           "holds a tensor", "Python int")


def test_G1_3_rejects_a_substring_test_with_a_hint_to_use_fnmatch():
    substring = clamp_matching_with(matches=lambda name, pattern: pattern.strip("*") in name)
    result = grade("G1.3", substring)
    assert not result.passed and "'?.bias'" in result.detail and "fnmatch.fnmatch" in result.detail, result.detail


def test_G1_3_rejects_wrong_clamps():
    for clamp, words in [
        (lambda g, limit: g.clamp(min=-limit), "instead of the clamped gradient"),
        (lambda g, limit: None, "instead of the clamped gradient"),
        (lambda g, limit: g.clamp(-1, 1), "limit 0.5"),
        (lambda g, limit: g.clamp_(-limit, limit), "in place"),
    ]:
        failed("G1.3", clamp_matching_with(clamp=clamp), words)


def test_G1_3_rejects_hooks_on_parameters_the_pattern_does_not_name():
    failed("G1.3", clamp_matching_with(matches=lambda name, pattern: True), "also went on ['0.bias'",
           "does not match")
    failed("G1.3", clamp_matching_with(matches=lambda name, pattern: pattern in name),  # not a pattern
           "no hook went on ['0.weight'", "not a substring test")


def test_G1_3_rejects_a_glob_turned_into_an_unanchored_regex():
    def escaped(name, pattern):
        return re.search(pattern.replace(".", r"\.").replace("?", ".").replace("*", ".*"), name)

    def unescaped(name, pattern):
        return re.search(pattern.replace("?", ".").replace("*", ".*"), name)

    for matches in (escaped, unescaped):
        outcome = failed("G1.3", clamp_matching_with(matches=matches), "also went on ['10.bias']", "without ^ and $")
        assert "_" + "backward_hooks" not in outcome.detail  # no private names
    assert grade("G1.3", clamp_matching_with(matches=lambda name, pattern: re.fullmatch(
        pattern.replace(".", r"\.").replace("?", ".").replace("*", ".*"), name))).passed


def test_G1_3_wants_every_count_at_0_before_the_first_backward():
    def counted_on_first_use(model, pattern, limit):
        clamped, handles = {}, []
        for name, p in model.named_parameters():
            if fnmatch.fnmatch(name, pattern):
                def hook(grad, name=name):
                    clamped[name] = clamped.get(name, 0) + int((grad.abs() > limit).sum())
                    return grad.clamp(-limit, limit)

                handles.append(p.register_hook(hook))
        return handles, clamped

    failed("G1.3", counted_on_first_use, "before the first backward clamped is {}", "clamped[name] = 0")
    starting_at_none = clamp_matching_with()

    def none_first(model, pattern, limit):
        handles, clamped = starting_at_none(model, pattern, limit)
        return handles, dict.fromkeys(clamped)

    failed("G1.3", none_first, "before the first backward", "'0.weight': None")


def test_G1_3_rejects_wrong_counts():
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
        (only_the_last, "before the first backward clamped is {}"),
        (clamp_matching_with(count=lambda g, limit: int((g.abs() >= limit).sum())), "exactly at the limit"),
        (lambda model, pattern, limit: (clamp_matching_with()(model, pattern, limit)[0], 3), "got int"),
    ]:
        failed("G1.3", wrong, words)
    # doubled counts: the last name's count equals the total, but the others are not 0, so no late binding
    outcome = failed("G1.3", clamp_matching_with(count=lambda g, limit: 2 * int((g.abs() > limit).sum())),
                     "entries were outside")
    assert "name=name" not in outcome.detail, outcome.detail


def test_G1_3_rejects_clamping_the_accumulated_grad():
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

    result = grade("G1.3", after_accumulation)
    assert not result.passed and "second backward without zeroing" in result.detail


def test_G1_3_says_what_is_wrong_with_the_returned_pair():
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
            failed("G1.3", wrong, words)
    finally:
        for h in kept:
            h.remove()


def test_G1_3_checks_that_the_handles_remove_the_hooks():
    def other_handles(model, pattern, limit):
        handles, clamped = clamp_matching_with()(model, pattern, limit)
        spare = torch.zeros(1, requires_grad=True)
        return [spare.register_hook(lambda g: g) for _ in handles], clamped

    result = grade("G1.3", other_handles)
    assert not result.passed and "after removing your handles" in result.detail

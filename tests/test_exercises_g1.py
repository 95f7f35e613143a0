"""Exercise checkers of the field guide G1 accept a right answer and reject wrong ones."""

from __future__ import annotations

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

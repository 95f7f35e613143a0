"""Exercise checkers of the field guide G1 accept a right answer and reject wrong ones."""

from __future__ import annotations

import fnmatch
import re

import torch
from answers import failed
from torch.autograd.graph import saved_tensors_hooks

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


# ----- G1.3 ------------------------------------------------------------------------------------------
def fuse_right(model, lr):
    def step(p):
        with torch.no_grad():
            p.add_(p.grad, alpha=-lr)
        p.grad = None

    return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]


def test_g1_3_accepts_a_fused_sgd_step_and_says_how_many_gradients_were_alive():
    outcome = grade("G1.3", fuse_right)
    assert outcome.passed and "at most 1 of the 4 .grad tensors alive at once" in outcome.detail, outcome.detail


def test_g1_3_rejects_wrong_answers():
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
        failed("G1.3", wrong)


# ----- G1.3: what is returned, a second learning rate, hooks left, no_grad, closures -----------------
def test_g1_3_says_what_is_wrong_with_the_returned_handles():
    def forgets_return(model, lr):
        fuse_right(model, lr)

    for wrong, words in [
        (forgets_return, "missing return?"),
        (lambda model, lr: fuse_right(model, lr)[0], "one handle"),
        (lambda model, lr: [fuse_right(model, lr)], "nested list"),
    ]:
        failed("G1.3", wrong, words)


def test_g1_3_rejects_a_hard_coded_learning_rate():
    result = grade("G1.3", lambda model, lr: fuse_right(model, 0.1))
    assert not result.passed and "lr=0.05" in result.detail


def test_g1_3_rejects_extra_hooks_left_on_the_parameters():
    def with_extra_hooks(model, lr):
        for p in model.parameters():
            p.register_hook(lambda g: None)
        return fuse_right(model, lr)

    result = grade("G1.3", with_extra_hooks)
    assert not result.passed and "tensor hook" in result.detail


def test_g1_3_wants_the_update_under_no_grad():
    def without_no_grad(model, lr):
        def step(p):
            p.add_(p.grad, alpha=-lr)
            p.grad = None

        return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]

    result = grade("G1.3", without_no_grad)
    assert not result.passed and "torch.no_grad()" in result.detail


def test_g1_3_rejects_an_update_through_data():
    def through_data(model, lr):  # no torch.no_grad(): .data hides the change from autograd
        def step(p):
            p.data -= lr * p.grad
            p.grad = None

        return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]

    def data_under_no_grad(model, lr):
        def step(p):
            with torch.no_grad():
                p.data.sub_(lr * p.grad)
            p.grad = None

        return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]

    for wrong in (through_data, data_under_no_grad):
        outcome = failed("G1.3", wrong, "without autograd seeing it", "p.data",
                         "with torch.no_grad(): p -= lr * p.grad")
        assert "_version" not in outcome.detail


def test_g1_3_hints_at_a_late_binding_closure():
    def late_binding(model, lr):
        handles = []
        for p in model.parameters():

            def step(_):
                with torch.no_grad():
                    p.add_(p.grad, alpha=-lr)  # noqa: B023 (the bug, on purpose)
                p.grad = None  # noqa: B023

            handles.append(p.register_post_accumulate_grad_hook(step))
        return handles

    result = grade("G1.3", late_binding)
    assert not result.passed and "loop variable" in result.detail


# ----- G1.4 ------------------------------------------------------------------------------------------
def half_hooks_with(pack=None, unpack=None, dtype=torch.bfloat16):
    """A right answer to G1.4, or a wrong one with its pack or unpack (or the 2-byte dtype) replaced."""

    def right_pack(t):
        return (t.to(dtype), t.dtype) if t.is_floating_point() else (t.detach(), t.dtype)

    def right_unpack(packed):
        return packed[0].to(packed[1])

    def save_in_half():
        return saved_tensors_hooks(pack or right_pack, unpack or right_unpack)

    return save_in_half


def test_g1_4_accepts_bfloat16_copies_given_back_in_their_dtype():
    outcome = grade("G1.4", half_hooks_with())
    assert outcome.passed and "bytes instead of" in outcome.detail and "float64" in outcome.detail, outcome.detail


def test_g1_4_accepts_a_subclass_like_save_on_cpu():
    class SaveInHalf(saved_tensors_hooks):
        def __init__(self):
            def pack(t):
                return (t.bfloat16(), t.dtype) if t.is_floating_point() else (t.detach(), None)

            def unpack(packed):
                kept, dtype = packed
                return kept if dtype is None else kept.to(dtype)

            super().__init__(pack, unpack)

    assert grade("G1.4", SaveInHalf).passed


def test_g1_4_accepts_a_small_object_holding_the_tensor_and_its_dtype():
    class Kept:
        def __init__(self, t, dtype):
            self.t, self.dtype = t, dtype

    outcome = grade("G1.4", half_hooks_with(
        pack=lambda t: Kept(t.to(torch.bfloat16) if t.is_floating_point() else t.detach(), t.dtype),
        unpack=lambda kept: kept.t.to(kept.dtype)))
    assert outcome.passed, outcome.detail


def test_g1_4_asks_for_a_tuple_when_pack_returns_a_key():
    store = {}

    def pack(t):
        store[len(store)] = (t.to(torch.bfloat16) if t.is_floating_point() else t.detach(), t.dtype)
        return len(store) - 1

    def unpack(key):
        kept, dtype = store[key]
        return kept.to(dtype)

    failed("G1.4", half_hooks_with(pack=pack, unpack=unpack), "return a tuple (kept, dtype)")


def test_g1_4_shows_float16_overflowing_beyond_65504():
    outcome = failed("G1.4", half_hooks_with(dtype=torch.float16), "inputs up to 2e5", "float16", "65504",
                     "bfloat16")
    assert "became inf" in outcome.detail


def test_g1_4_names_an_unpack_that_always_gives_float32():
    def always_float(packed):
        kept, _ = packed  # the dtype pack remembered, not used: the slip
        return kept.float() if kept.is_floating_point() else kept

    failed("G1.4", half_hooks_with(unpack=always_float), "float32 tensor for a saved float64 tensor", ".float()")


def test_g1_4_rejects_wrong_answers():
    for answer, *words in [
        (half_hooks_with(pack=lambda t: t), "returned the tensor it received itself"),
        (half_hooks_with(pack=lambda t: (t.bfloat16(), t.dtype) if t.is_floating_point() else (t, t.dtype)),
         "the int64 tensor of shape (16,)", "t.detach()"),
        (half_hooks_with(pack=lambda t: (t.to(torch.bfloat16), t.dtype)), "convert only floating-point tensors"),
        (half_hooks_with(pack=lambda t: (t.detach(), t.dtype)), "only as bfloat16"),
        (half_hooks_with(pack=lambda t: (t.bfloat16(), t.detach(), t.dtype) if t.is_floating_point()
                         else (t.detach(), t.dtype)), "only as bfloat16"),
        (half_hooks_with(unpack=lambda packed: packed[0]), "give back the original dtype"),
        (half_hooks_with(pack=lambda t: t.dtype), "return a tuple (kept, dtype)"),
        (lambda: None, "missing return?"),
        (lambda: (lambda t: t, lambda t: t), "must return saved_tensors_hooks(pack, unpack)"),
    ]:
        failed("G1.4", answer, *words)


def test_g1_4_names_an_unpack_that_overwrites_what_pack_returned():
    def pack(t):
        return [t.to(torch.bfloat16) if t.is_floating_point() else t.detach(), t.dtype]

    def overwrite(packed):
        packed[0] = packed[0].to(packed[1])  # the slip: writes the float32 copy into pack's list
        return packed[0]

    outcome = failed("G1.4", half_hooks_with(pack=pack, unpack=overwrite),
                     "unpack must leave what pack returned as it was")
    assert "pack kept" not in outcome.detail, outcome.detail


def test_g1_4_wants_unpack_to_work_twice():
    def pop_once(packed):
        return packed.pop().to(torch.float32) if packed else torch.zeros(0)

    def pack(t):
        return [t.to(torch.bfloat16)] if t.is_floating_point() else [t.detach()]

    outcome = grade("G1.4", half_hooks_with(pack=pack, unpack=pop_once))
    assert not outcome.passed, outcome.detail


def test_g1_4_stub_is_not_solved_yet(capsys):
    def save_in_half():
        def pack(t):
            raise NotImplementedError

        def unpack(packed):
            raise NotImplementedError

        return saved_tensors_hooks(pack, unpack)

    check("G1.4", save_in_half)
    assert capsys.readouterr().out.endswith("): not solved yet\n")


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


# ----- G1.5 -------------------------------------------------------------------------------------
def clamp_matching_with(count=lambda g, limit: int((g.abs() > limit).sum()),
                        clamp=lambda g, limit: g.clamp(-limit, limit), matches=fnmatch.fnmatch):
    """A right answer to G1.5, or a wrong one with one of its parts replaced."""

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


def test_G1_5_accepts_a_clamping_and_counting_hook_per_matching_parameter():
    assert grade("G1.5", clamp_matching_with()).passed


def test_G1_5_wants_counts_as_python_ints():
    # clamped[name] becomes a 0-d tensor that the second backward's += changes in place
    failed("G1.5", clamp_matching_with(count=lambda g, limit: (g.abs() > limit).sum()),
           "holds a tensor", "Python int")


def test_G1_5_rejects_a_substring_test_with_a_hint_to_use_fnmatch():
    substring = clamp_matching_with(matches=lambda name, pattern: pattern.strip("*") in name)
    result = grade("G1.5", substring)
    assert not result.passed and "'?.bias'" in result.detail and "fnmatch.fnmatch" in result.detail, result.detail


def test_G1_5_rejects_wrong_clamps():
    for clamp, words in [
        (lambda g, limit: g.clamp(min=-limit), "instead of the clamped gradient"),
        (lambda g, limit: None, "instead of the clamped gradient"),
        (lambda g, limit: g.clamp(-1, 1), "limit 0.5"),
        (lambda g, limit: g.clamp_(-limit, limit), "in place"),
    ]:
        failed("G1.5", clamp_matching_with(clamp=clamp), words)


def test_G1_5_rejects_hooks_on_parameters_the_pattern_does_not_name():
    failed("G1.5", clamp_matching_with(matches=lambda name, pattern: True), "also went on ['0.bias'",
           "does not match")
    failed("G1.5", clamp_matching_with(matches=lambda name, pattern: pattern in name),  # not a pattern
           "no hook went on ['0.weight'", "not a substring test")


def test_G1_5_rejects_a_glob_turned_into_an_unanchored_regex():
    def escaped(name, pattern):
        return re.search(pattern.replace(".", r"\.").replace("?", ".").replace("*", ".*"), name)

    def unescaped(name, pattern):
        return re.search(pattern.replace("?", ".").replace("*", ".*"), name)

    for matches in (escaped, unescaped):
        outcome = failed("G1.5", clamp_matching_with(matches=matches), "also went on ['10.bias']", "without ^ and $")
        assert "_" + "backward_hooks" not in outcome.detail  # no private names
    assert grade("G1.5", clamp_matching_with(matches=lambda name, pattern: re.fullmatch(
        pattern.replace(".", r"\.").replace("?", ".").replace("*", ".*"), name))).passed


def test_G1_5_wants_every_count_at_0_before_the_first_backward():
    def counted_on_first_use(model, pattern, limit):
        clamped, handles = {}, []
        for name, p in model.named_parameters():
            if fnmatch.fnmatch(name, pattern):
                def hook(grad, name=name):
                    clamped[name] = clamped.get(name, 0) + int((grad.abs() > limit).sum())
                    return grad.clamp(-limit, limit)

                handles.append(p.register_hook(hook))
        return handles, clamped

    failed("G1.5", counted_on_first_use, "before the first backward clamped is {}", "clamped[name] = 0")
    starting_at_none = clamp_matching_with()

    def none_first(model, pattern, limit):
        handles, clamped = starting_at_none(model, pattern, limit)
        return handles, dict.fromkeys(clamped)

    failed("G1.5", none_first, "before the first backward", "'0.weight': None")


def test_G1_5_rejects_wrong_counts():
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
        failed("G1.5", wrong, words)
    # doubled counts: the last name's count equals the total, but the others are not 0, so no late binding
    outcome = failed("G1.5", clamp_matching_with(count=lambda g, limit: 2 * int((g.abs() > limit).sum())),
                     "entries were outside")
    assert "name=name" not in outcome.detail, outcome.detail


def test_G1_5_rejects_clamping_the_accumulated_grad():
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

    result = grade("G1.5", after_accumulation)
    assert not result.passed and "second backward without zeroing" in result.detail


def test_G1_5_says_what_is_wrong_with_the_returned_pair():
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
            failed("G1.5", wrong, words)
    finally:
        for h in kept:
            h.remove()


def test_G1_5_checks_that_the_handles_remove_the_hooks():
    def other_handles(model, pattern, limit):
        handles, clamped = clamp_matching_with()(model, pattern, limit)
        spare = torch.zeros(1, requires_grad=True)
        return [spare.register_hook(lambda g: g) for _ in handles], clamped

    result = grade("G1.5", other_handles)
    assert not result.passed and "after removing your handles" in result.detail

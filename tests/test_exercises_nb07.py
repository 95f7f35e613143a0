"""Checkers of notebook 07: each accepts a worked answer and rejects the plausible wrong ones with a
message naming the slip; each prediction computes what the lesson shows; ``spec`` passes on the worked
tools and fails on plain training."""

from __future__ import annotations

import functools
import math
import weakref

import pytest
import torch
import torch.nn.functional as F
from answers import failed
from torch import nn

from hooklab.exercises import exercises, grade, nb07

IDS = sorted(id for id in exercises() if id.startswith("07."))


def test_notebook_07_has_five_predictions_and_six_exercises():
    assert IDS == ["07.1", "07.2", "07.3", "07.4", "07.5", "07.6", "07.a", "07.b", "07.c", "07.d", "07.e"]


# ----- predictions ------------------------------------------------------------------------------
@pytest.mark.parametrize(("id", "truth"), [("07.a", [False, True]), ("07.b", 32), ("07.c", 65536),
                                           ("07.d", 0.8639)])
def test_each_prediction_computes_what_the_lesson_shows(id, truth):
    assert grade(id, truth).passed
    computed = exercises()[id].checker.__wrapped__.truth()
    assert computed == truth if isinstance(truth, list) else math.isclose(computed, truth, rel_tol=1e-3)


def test_07_e_the_allocator_peaks_in_backward_and_fusing_barely_moves_it():
    assert grade("07.e", "backward").passed
    assert exercises()["07.e"].checker.__wrapped__.truth() == "backward"
    plain, fused = nb07.cnn_allocator_peaks(), nb07.cnn_allocator_peaks(nb07.fuse_sgd)
    assert round(plain["forward"] / 1e4) == 170 and round(plain["step"] / 1e4) == 197  # 1.70 MB, 1.97 MB
    assert 0.99 < fused["step"] / plain["step"] < 1.0  # the answer cell's 1.00 of plain


@pytest.mark.parametrize(("id", "guess", "hint"), [
    ("07.a", [True, True], "weight_orig moves"), ("07.a", [False, False], "before every forward pass"),
    ("07.b", 1, "mean of the per-sample"),
    ("07.c", 65536 + 2560, "only for the gradient of the input"), ("07.c", 2560, "like b in a * b"),
    ("07.d", 0.5, "saved twice"), ("07.d", 1.0, "2 bytes a number"),
    ("07.e", "forward", "while the saved tensors"), ("07.e", "before backward", "where the allocator peaks"),
    ("07.e", ["backward", 1.0], "as a string"), ("07.e", 2, "as a string"),
])  # fmt: skip
def test_wrong_guesses_get_their_hint(id, guess, hint):
    failed(id, guess, hint)


def test_07_a_names_numbers_and_the_clipped_share_is_one_over_the_batch():
    assert "booleans" in grade("07.a", [0, 1]).detail
    assert "not a percentage" in grade("07.d", 86).detail and grade("07.d", 0.86).passed
    assert math.isclose(nb07.clipped_share(), 1 / 64, rel_tol=1e-4)


def test_a_fresh_head_has_every_image_above_c_so_clipping_shrinks_its_step():
    norms, shorter = nb07.fresh_head_first_step()
    assert bool((norms > nb07.CLIP).all()) and shorter > 10  # not a lean toward small gradients: a shorter step
    plain = nb07.fresh_head_accuracy()
    retuned = [nb07.fresh_head_accuracy(nb07.private_step, noise=noise, lr=1.0) for noise in (0.0, 0.5)]
    assert plain - 0.1 < retuned[1] < retuned[0] < plain  # with lr 1.0 the cost is a few points


def test_leaving_parameters_as_they_are_keeps_fewer_bytes_than_packing_them():
    whole, each = nb07.saved_bytes(), nb07.saved_bytes(nb07.bf16_each_save, nb07.unpack_bf16)
    skipping = nb07.saved_bytes(*nb07.parameters_as_they_are(nb07.bf16_each_save, nb07.unpack_bf16))
    assert skipping < each < whole and round(skipping / whole, 3) == 0.856


# ----- the problem ------------------------------------------------------------------------------
def test_plain_training_fails_every_requirement_and_the_worked_tools_meet_them():
    assert nb07.conv_zeros_after_step() < 0.5 <= nb07.conv_zeros_after_step(nb07.prune_by_hand)  # zeros grow back
    by_layer = nb07.conv_zeros_after_step(by_layer=True)  # the first conv's regrow; the later convs' dead channels
    assert by_layer["features.0"] < 0.05 and min(by_layer["features.2"], by_layer["features.5"]) > 0.4
    assert nb07.conv_zeros_after_step(_prune(hook=False)) is None  # a stale weight fails the row
    bound = 2 * nb07.CLIP * nb07.LR / nb07.BATCH
    assert nb07.influence() > 10 * bound and nb07.influence(nb07.private_step) <= bound
    budget = 0.9 * nb07.saved_bytes()  # spec's target: a tenth off plain autograd's
    assert nb07.saved_bytes(nb07.pack_bf16, nb07.unpack_bf16) < nb07.saved_bytes(nb07.bf16_each_save,
                                                                                  nb07.unpack_bf16) < budget
    assert nb07.gradient_peak()[1] == 8 and nb07.gradient_peak(nb07.fuse_sgd)[1] == 1
    wide = nb07.wide_linear()  # the count: the fused step halves the wide model's, and not the CNN's
    assert nb07.step_peak(None, *wide) > 1.9 * nb07.step_peak(nb07.fuse_sgd, *wide)
    assert nb07.step_peak() == nb07.step_peak(nb07.fuse_sgd)


def test_the_allocator_peak_drops_only_with_an_in_place_fused_step():
    plain, temporary, fused = (nb07.allocator_peak(f) for f in (None, nb07.fuse_sgd_with_temporary, nb07.fuse_sgd))
    assert round(plain / 1e5) == 85 and round(temporary / 1e5) == 85 and round(fused / 1e5) == 44
    assert fused <= 0.6 * plain < temporary
    five = [nb07.allocator_peak(f, *nb07.wide_linear(5)) for f in (None, nb07.fuse_sgd_with_temporary, nb07.fuse_sgd)]
    assert [round(peak / 1e5) for peak in five] == [169, 87, 45]  # the temporary: one more gradient, not the saving


def test_the_gradient_timeline_agrees_with_the_peak_spec_measures():
    for fuse in (None, nb07.fuse_sgd):
        rows = nb07.gradient_timeline(fuse)
        assert len(rows) == 10 and max(row[2] for row in rows) == nb07.gradient_peak(fuse)[2]
        assert rows[0][1:] == (0, 0, nb07.saved_bytes(n=64)) and rows[-1][3] == 0  # all saved, then all freed
    assert nb07.gradient_timeline()[-1][1:3] == (8, 95_784) and nb07.gradient_timeline(nb07.fuse_sgd)[-1][1:3] == (0, 0)


def test_private_step_without_noise_is_plain_sgd_when_nothing_is_clipped():
    model, plain = nb07._model(), nb07._model()
    x, y = nb07._batch(8)
    nb07.private_step(model, x, y, clip=1e6, noise=0.0)
    nb07.plain_step(plain, x, y)
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


# ----- 07.1 -------------------------------------------------------------------------------------
def _prune(mask_rule="smallest", hook=True, names=("_orig", "_mask"), at_once=True, detach=False, fixed=None,
           count=round, mask_dtype=None, reuse=True, mask_parameter=False):
    def prune_by_hand(module, name, amount):
        name = fixed or name
        weight = getattr(module, name)
        k = count(amount * weight.numel())
        mask = torch.ones_like(weight, dtype=mask_dtype)
        mask.view(-1)[weight.detach().abs().flatten().topk(k, largest=mask_rule != "smallest").indices] = 0
        del module._parameters[name]
        module.register_parameter(name + names[0], weight if reuse else nn.Parameter(weight.detach().clone()))
        if mask_parameter:  # a Parameter: the state_dict keys are right, but an optimizer trains the mask
            module.register_parameter(name + names[1], nn.Parameter(mask))
        else:
            module.register_buffer(name + names[1], mask)

        def apply(module, args):
            pruned = getattr(module, name + names[0]) * getattr(module, name + names[1])
            setattr(module, name, pruned.detach() if detach else pruned)

        if at_once:
            apply(module, ())
        return module.register_forward_pre_hook(apply if hook else (lambda module, args: None))

    return prune_by_hand


def _mask_each_forward(module, name, amount):  # the mask computed again from the moved weights at every forward
    weight = getattr(module, name)
    del module._parameters[name]
    module.register_parameter(name + "_orig", weight)

    def apply(module, args):
        orig = getattr(module, name + "_orig")
        mask = torch.ones_like(orig)
        mask.view(-1)[orig.detach().abs().flatten().topk(round(amount * orig.numel()), largest=False).indices] = 0
        module.register_buffer(name + "_mask", mask)
        setattr(module, name, orig * mask)

    apply(module, ())
    return module.register_forward_pre_hook(apply)


def test_07_1_accepts_the_worked_answer():
    assert grade("07.1", nb07.prune_by_hand).passed
    assert grade("07.1", _prune()).passed  # the removed Parameter registered again, the same object


def test_07_1_names_each_slip():
    failed("07.1", _prune(mask_rule="largest"), "largest |w|")
    failed("07.1", _mask_each_forward, "computed once, at pruning time")
    failed("07.1", _prune(hook=False), "forward pre-hook")
    failed("07.1", _prune(names=("_kept", "_mask")), "weight_orig")
    failed("07.1", _prune(at_once=False), "AttributeError", "at once")
    failed("07.1", _prune(detach=True), "no gradient reaches weight_orig", "detached")
    failed("07.1", _prune(fixed="weight"), "name='bias'", "not a fixed 'weight'")
    failed("07.1", lambda module, name, amount: None, "handle")
    outcome = failed("07.1", _prune(count=int), "zeroes 37 entries", "zeroes 38", "round(), not")  # 0.35 × 108 = 37.8
    assert "it zeroes" not in outcome.detail
    failed("07.1", _prune(mask_parameter=True), "weight_mask is a Parameter", "register_buffer")
    failed("07.1", _prune(mask_dtype=torch.bool), "torch.bool", "torch.float32 mask")
    failed("07.1", _prune(reuse=False), "new Parameter", "optimizer made before pruning no longer trains")
    failed("07.1", nb07.prune_by_hand(nn.Linear(2, 2), "weight", 0.5), "function itself")


# ----- 07.2 and 07.3 ------------------------------------------------------------------------------
def _linear_hooks(scale="mean", summed=False):
    def grad_sample_hooks(layer, loss_reduction="mean"):
        def keep(module, args, output):
            a = args[0].detach()

            def per_sample(g):
                if scale == "in place" and loss_reduction == "mean":
                    g *= len(a)  # changes the gradient autograd passes on
                g = g * len(a) if scale == "always" or (scale == "mean" and loss_reduction == "mean") else g
                w = torch.einsum("no,ni->noi", g, a)
                module.weight.grad_sample = w.sum(0) if summed else w
                module.bias.grad_sample = g

            output.register_hook(per_sample)

        return [layer.register_forward_hook(keep)]

    return grad_sample_hooks


def test_07_2_accepts_the_worked_answer_and_names_each_slip():
    assert grade("07.2", nb07.grad_sample_hooks).passed
    failed("07.2", _linear_hooks(scale="never"), "times too small", "mean")
    failed("07.2", _linear_hooks(scale="always"), "times too large", "'sum'")
    failed("07.2", _linear_hooks(summed=True), "summed over the batch")
    failed("07.2", _linear_hooks(scale="in place"), "loss_reduction='mean'",
           "changed the gradient backward goes on with, in place", "layer below")
    failed("07.2", lambda layer, loss_reduction: [layer.register_forward_hook(lambda *args: None)], "no grad_sample")
    failed("07.2", lambda layer, loss_reduction: "hooks", "handle")
    failed("07.2", lambda layer, loss_reduction="mean": nb07.grad_sample_hooks(layer, loss_reduction)[0],
           "one handle, not a list")
    failed("07.2", lambda layer: [], "loss_reduction")
    # right on (N, in), but "no,ni->noi" has no room for a sequence's positions: (N, T, in) raises
    failed("07.2", _linear_hooks(), "(N, T, in)", "RuntimeError", "every position")

    def positions_kept(layer, loss_reduction="mean"):  # one outer product per position, not summed over them
        def keep(module, args, output):
            a = args[0].detach()

            def per_sample(g):
                g = g * len(a) if loss_reduction == "mean" else g
                module.weight.grad_sample = torch.einsum("n...o,n...i->n...oi", g, a)
                module.bias.grad_sample = g

            output.register_hook(per_sample)

        return [layer.register_forward_hook(keep)]

    failed("07.2", positions_kept, "(N, T, in)", "shape", "over the positions")

    def overwrites(layer, loss_reduction="mean"):  # right for a layer called once; a second call overwrites the first
        def keep(module, args, output):
            a = args[0].detach()

            def per_sample(g):
                g = g * len(a) if loss_reduction == "mean" else g
                module.weight.grad_sample = torch.einsum("n...o,n...i->noi", g, a)
                module.bias.grad_sample = torch.einsum("n...o->no", g)

            output.register_hook(per_sample)

        return [layer.register_forward_hook(keep)]

    failed("07.2", overwrites, "calls one Linear ('inner') twice", "add the calls' per-sample gradients",
           "not overwrite")

    def module_backward_hook(layer, loss_reduction="mean"):  # adds, but pairs each g with the last call's input
        def keep(module, args, output):
            module.kept = args[0].detach()

        def per_sample(module, grad_input, grad_output):
            g = grad_output[0] * len(module.kept) if loss_reduction == "mean" else grad_output[0]
            for p, sample in ((module.weight, torch.einsum("n...o,n...i->noi", g, module.kept)),
                              (module.bias, torch.einsum("n...o->no", g))):
                p.grad_sample = sample if getattr(p, "grad_sample", None) is None else p.grad_sample + sample

        return [layer.register_forward_hook(keep), layer.register_full_backward_hook(per_sample)]

    failed("07.2", module_backward_hook, "twice", "a module backward hook sees only the input the last call kept")


def _linear_grad_sample(store):
    """A 07.2 answer for a Linear (forward hook, then a tensor hook on the output) that hands each parameter's
    per-sample gradient to ``store(p, v)``: the answers below differ only there."""
    def grad_sample_hooks(layer, loss_reduction="mean"):
        def keep(module, args, output):
            a = args[0].detach()

            def per_sample(g):
                g = g * len(a) if loss_reduction == "mean" else g
                store(module.weight, torch.einsum("n...o,n...i->noi", g, a))
                store(module.bias, torch.einsum("n...o->no", g))

            output.register_hook(per_sample)

        return [layer.register_forward_hook(keep)]

    return grad_sample_hooks


def _add_if_hasattr(p, v):  # "or adds to them if they exist", written with hasattr
    p.grad_sample = p.grad_sample + v if hasattr(p, "grad_sample") else v


_adds_if_present = _linear_grad_sample(_add_if_hasattr)


def test_07_2_an_answer_that_adds_if_hasattr_passes_and_runs_the_lessons_private_pass():
    """The crash path: a passing answer that adds when ``hasattr(p, "grad_sample")``; the private step once set
    the attribute to None, so the second step's addition raised TypeError (None + Tensor)."""
    assert grade("07.2", _adds_if_present).passed
    hooks = nb07.linear_and_conv(_adds_if_present, nb07.conv_grad_sample)
    step = functools.partial(nb07.private_step, hooks=hooks)
    assert 0.0 <= nb07.fresh_head_accuracy(step, noise=0.5, lr=0.1, steps=3) <= 1.0
    model, (x, y) = nb07._model(), nb07._batch(8)
    nb07.private_step(model, x, y, hooks=hooks)
    assert not any(hasattr(p, "grad_sample") for p in model.parameters())  # deleted, not set to None


def test_07_2_names_an_answer_that_cannot_start_a_second_step():
    def add_once_seen(p, v):  # adds after the parameter's first backward, whatever it holds then
        p.grad_sample = p.grad_sample + v if getattr(p, "seen", False) else v
        p.seen = True

    failed("07.2", _linear_grad_sample(add_once_seen), "second step", "del p.grad_sample", "AttributeError", "hasattr")


def test_07_3_accepts_the_worked_answer_and_names_each_slip():
    assert grade("07.3", nb07.conv_grad_sample).passed

    def no_padding(layer, a, g):
        patches = F.unfold(a, layer.kernel_size, stride=layer.stride)
        return torch.einsum("nol,nkl->nok", g.flatten(2), patches).reshape(len(a), *layer.weight.shape)

    def no_stride(layer, a, g):
        patches = F.unfold(a, layer.kernel_size, padding=layer.padding)
        return torch.einsum("nol,nkl->nok", g.flatten(2), patches).reshape(len(a), *layer.weight.shape)

    failed("07.3", no_padding, "padding")
    failed("07.3", no_stride, "stride")

    def no_dilation(layer, a, g):
        patches = F.unfold(a, layer.kernel_size, padding=layer.padding, stride=layer.stride)
        return torch.einsum("nol,nkl->nok", g.flatten(2), patches).reshape(len(a), *layer.weight.shape)

    failed("07.3", no_dilation, "dilation")
    failed("07.3", lambda layer, a, g: g.sum(0), "shape")

    def transposed(layer, a, g):
        patches = F.unfold(a, layer.kernel_size, dilation=layer.dilation, padding=layer.padding, stride=layer.stride)
        return torch.einsum("nol,nkl->nko", g.flatten(2), patches).reshape(len(a), *layer.weight.shape)

    failed("07.3", transposed, "wrong order", "'nok'")
    failed("07.3", lambda layer, a, g: nb07.conv_grad_sample(layer, a, g * len(a)), "times too large",
           "do not multiply it by N here")


# ----- 07.5 -------------------------------------------------------------------------------------
def test_07_5_accepts_the_worked_answer_and_names_each_slip():
    assert grade("07.5", (nb07.pack_bf16, nb07.unpack_bf16)).passed
    failed("07.5", (lambda t: t.to(torch.bfloat16), lambda t: t.float()), "int64")
    failed("07.5", (lambda t: t.to(torch.bfloat16), lambda t: t.to(torch.float32) if t.dtype == torch.bfloat16 else t),
           "int64")
    failed("07.5", (lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t, lambda t: t), "dtype")
    failed("07.5", (lambda t: t, lambda t: t), "bfloat16")
    failed("07.5", (lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t,
                    lambda t: t.float() if t.dtype == torch.bfloat16 else t), "float64", "keep the dtype")
    failed("07.5", nb07.pack_bf16, "pair")
    failed("07.5", (lambda t: (lambda: t), lambda f: f()), "inside a function")
    failed("07.5", (lambda t: (t.dtype, t.half()) if t.is_floating_point() else (None, t), nb07.unpack_bf16), "65504")
    naive = (nb07.bf16_each_save, nb07.unpack_bf16)  # packed at each save: passes, as the lesson asks
    assert grade("07.5", naive).passed and "optional" not in grade("07.5", naive).detail
    assert "tolerance, 2 %" in grade("07.5", naive).detail
    inputs = {}

    def caches_the_input_too(t):  # skips parameters only: the batch's input stays cached while it lives
        if not t.is_floating_point():
            return None, t
        if t.requires_grad and t.grad_fn is None:  # a parameter
            return t.dtype, t.bfloat16()
        if id(t) not in inputs:
            inputs[id(t)] = t.dtype, t.bfloat16()
            weakref.finalize(t, inputs.pop, id(t), None)
        return inputs[id(t)]

    assert grade("07.5", (caches_the_input_too, nb07.unpack_bf16)).passed
    by_id, cache = {}, {}

    def ids_outlive_tensors(t):  # remembers by id, and never forgets: a freed tensor's id is reused
        return (None, t) if not t.is_floating_point() else by_id.setdefault(id(t), (t.dtype, t.bfloat16()))

    def caches_parameters(t):  # forgets a freed tensor, but remembers parameters too: stale after a step
        if not t.is_floating_point():
            return None, t
        if id(t) not in cache:
            cache[id(t)] = t.dtype, t.bfloat16()
            weakref.finalize(t, cache.pop, id(t), None)
        return cache[id(t)]

    failed("07.5", (ids_outlive_tensors, nb07.unpack_bf16), "weakref.finalize")
    failed("07.5", (caches_parameters, nb07.unpack_bf16), "earlier pass", "grad_fn")
    by_address = {}

    def caches_by_address(t):  # a student's answer: keyed by address, version and shape, never cleared
        key = (t.data_ptr(), t._version, tuple(t.shape))
        return by_address.setdefault(key, (t.dtype, t.bfloat16() if t.is_floating_point() else t))

    failed("07.5", (caches_by_address, nb07.unpack_bf16), "keeps packed tensors after backward")  # + reused address,
    slots = {}  # when the allocator hands an address back, which varies: below, as if it always did

    def every_address_reused(t):
        if not t.is_floating_point() or t.grad_fn is None:
            return nb07.pack_bf16(t)
        return slots.setdefault((tuple(t.shape), type(t.grad_fn).__name__), (t.dtype, t.bfloat16()))

    failed("07.5", (every_address_reused, nb07.unpack_bf16), "reused address/id handed back an old activation",
           "keeps packed tensors after backward")
    weak = {}

    def weak_refs_by_id(t):  # weak references, but no weakref.finalize and only a shape check: x * k reuses ids
        if not t.is_floating_point() or t.grad_fn is None:
            return nb07.pack_bf16(t)
        kept = weak[id(t)]() if id(t) in weak else None
        if kept is None or kept.shape != t.shape:
            kept = t.bfloat16()
            weak[id(t)] = weakref.ref(kept)
        return t.dtype, kept

    failed("07.5", (weak_refs_by_id, nb07.unpack_bf16), "reused address/id handed back an old activation",
           "weakref.finalize")
    finalized = {}

    def finalizes_the_copy(t):  # the finalizer on the bfloat16 copy, which the cache itself keeps alive
        if not t.is_floating_point() or t.grad_fn is None:
            return nb07.pack_bf16(t)
        if id(t) not in finalized:
            finalized[id(t)] = t.dtype, t.bfloat16()
            weakref.finalize(finalized[id(t)][1], finalized.pop, id(t), None)
        return finalized[id(t)]

    failed("07.5", (finalizes_the_copy, nb07.unpack_bf16), "watches the bfloat16 copy", "Finalize t")
    copies = weakref.WeakValueDictionary()

    def weak_copies(t):  # a copy lives while autograd holds it, after its tensor is freed
        if not t.is_floating_point() or t.grad_fn is None:
            return nb07.pack_bf16(t)
        copy = copies.get(id(t))
        if copy is None:
            copy = copies[id(t)] = t.bfloat16()
        return t.dtype, copy

    failed("07.5", (weak_copies, nb07.unpack_bf16), "the tensor given to pack", "not enough")
    history = []

    def keeps_history(t):  # right gradients, but a list that grows every step
        history.append(nb07.pack_bf16(t))
        return history[-1]

    failed("07.5", (keeps_history, nb07.unpack_bf16), "keeps packed tensors after backward", "grows")


def _stashes(pop: bool):
    """A pack that hides its bfloat16 copies in a dict and returns only a key: what pack returns holds no
    bytes, so only the allocator sees them."""
    stash = {}

    def pack(t):
        if not t.is_floating_point():
            return None, t
        if t.grad_fn is None:
            return t.dtype, t.to(torch.bfloat16)
        stash[len(stash)] = t.dtype, t.to(torch.bfloat16)
        return "key", len(stash) - 1

    def unpack(packed):
        if packed[0] == "key":
            dtype, t = stash.pop(packed[1]) if pop else stash[packed[1]]
            return t.to(dtype)
        return nb07.unpack_bf16(packed)

    return pack, unpack


def test_07_5_unpacks_twice_and_counts_bytes_on_the_allocators_side():
    failed("07.5", _stashes(pop=True), "retain_graph=True", "raised KeyError", "more than once")
    failed("07.5", _stashes(pop=False), "still held", "MB")
    pack, unpack = _stashes(pop=True)  # the bytes a key hides are counted: as many as packing each save
    assert nb07.saved_bytes(pack, unpack) == nb07.saved_bytes(nb07.bf16_each_save, nb07.unpack_bf16)
    assert nb07.saved_bytes() == 5_910_532 and nb07.saved_bytes(nb07.pack_bf16, nb07.unpack_bf16) == 3_528_226


# ----- 07.6 -------------------------------------------------------------------------------------
def test_07_6_accepts_the_worked_answer_and_names_each_slip():
    assert grade("07.6", nb07.fuse_sgd).passed

    def keeps_grad(model, lr):
        def step(p):
            with torch.no_grad():
                p -= lr * p.grad

        return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]

    def wrong_sign(model, lr):
        def step(p):
            with torch.no_grad():
                p += lr * p.grad
            p.grad = None

        return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]

    failed("07.6", keeps_grad, "p.grad = None")
    failed("07.6", nb07.fuse_sgd_with_temporary, "gradient-sized temporary", "p.add_(p.grad, alpha=-lr)")
    failed("07.6", wrong_sign, "p -= lr * p.grad")
    failed("07.6", lambda model, lr: None, "list of handles")


def test_the_measurements_the_lesson_prints_for_checkpointing_and_dead_channels():
    assert nb07.checkpoint_forward_runs() == {"without": 1, "with checkpointing": 2}  # the recompute, counted
    assert nb07.zeros_in_dead_channels() == {"features.0": "0 of 0", "features.2": "2,063 of 2,063",
                                             "features.5": "8,687 of 8,688"}


def test_saved_twice_is_kept_once_and_spec_measures_plain_training_once(monkeypatch, capsys):
    last = nb07.saved_table()[-1]  # the sums the lesson prints before prediction 07.d
    assert last == ("all 10 tensors (2 under 10 kB not listed), each counted once: 5,910,532 bytes; "
                    "each save counted: 9,066,500 bytes")
    assert len(nb07.saved_table()) == 8 + 1  # the 8 rows the lesson shows, then the sums
    assert nb07.saved_bytes() == 5_910_532
    calls, measure = [], nb07.saved_bytes
    monkeypatch.setattr(nb07, "_PLAIN", {})
    monkeypatch.setattr(nb07, "_MEASURED", {})
    monkeypatch.setattr(nb07, "saved_bytes", lambda *args, **kw: calls.append(args) or measure(*args, **kw))
    for _ in range(2):
        nb07.spec(pack=nb07.pack_bf16, unpack=nb07.unpack_bf16)
    assert [args for args in calls if args[0] is None] == [(None, None)]  # plain: once, not at each comparison
    assert capsys.readouterr().out.count("✓ 3.53 MB") == 2


def test_the_students_per_sample_hooks_serve_both_kinds_of_layer_and_the_private_pass_splits_its_step():
    model, (x, y) = nb07._model(), nb07._batch(16)
    truth = nb07.per_sample_truth(model, x, y)
    linear_only = lambda layer: [] if isinstance(layer, nn.Conv2d) else nb07.grad_sample_hooks(layer)  # noqa: E731
    hooks = nb07.linear_and_conv(linear_only, nb07.conv_grad_sample)
    handles = [h for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d) for h in hooks(m)]
    try:
        F.cross_entropy(model(x), y).backward()
    finally:
        for handle in handles:
            handle.remove()
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad_sample, truth[name], atol=1e-5, rtol=1e-4), name
    start = nb07._model()
    _, parts, norms = nb07.dp_pass(start, nb07.private_step, steps=2, clip=1.0, lr=0.1, noise=1.0)
    assert len(parts) == 2 and len(norms) == 27 and 0 < parts[0][0] <= 0.1 * 1.0 + 1e-6  # at most lr·C
    assert math.isclose(parts[0][1], 0.1 * 1.0 / 27 * 650 ** 0.5, rel_tol=0.2)  # lr·σ·C/N a weight, 650 weights
    assert nb07.dp_pass(start, nb07.plain_step, steps=2)[1] == []


def test_clipping_costs_accuracy_and_the_noise_costs_more():
    """The line the lesson prints after DP-SGD: a fresh head trained one pass, plain, clipped, clipped + noise."""
    plain = nb07.fresh_head_accuracy()
    clipped = nb07.fresh_head_accuracy(nb07.private_step, noise=0.0)
    private = nb07.fresh_head_accuracy(nb07.private_step, noise=0.5)
    assert round(plain, 2) == 0.94 and round(clipped, 2) == 0.69 and round(private, 2) == 0.63
    assert plain == nb07.fresh_head_accuracy()  # seeded


def test_the_zeros_that_stay_all_read_or_feed_a_dead_channel():
    """Lesson 07's problem: after zeroing by hand and 5 steps, every zero left in features.2 and features.5
    but one belongs to a dead output channel or reads a dead input channel (lesson 05), whose gradient is 0."""
    from hooklab.data import digits

    data, model, outputs = digits(), nb07._model(), {}
    handles = [model.features[i + 1].register_forward_hook(lambda m, a, o, i=i: outputs.__setitem__(i, o))
               for i in (0, 2, 5)]
    with torch.no_grad():
        model(data.x_train)
    for handle in handles:
        handle.remove()
    dead = {i: outputs[i].amax((0, 2, 3)) == 0 for i in (0, 2, 5)}
    for i in (0, 2, 5):
        nb07.zero_by_hand(model.features[i], "weight", 0.5)
    for start in range(0, nb07.FINE_TUNE_STEPS * nb07.BATCH, nb07.BATCH):
        nb07.plain_step(model, data.x_train[start:start + nb07.BATCH], data.y_train[start:start + nb07.BATCH])
    for i, before in ((2, 0), (5, 2)):
        zero = model.features[i].weight == 0
        touches = dead[i][:, None, None, None] | dead[before][None, :, None, None]
        assert zero.float().mean() > 0.4 and int((zero & ~touches).sum()) <= 1  # one zero in features.5: not dead


# ----- 07.4 -------------------------------------------------------------------------------------
def test_07_4_accepts_the_worked_answer_and_names_each_slip():
    worked = (nb07.clip_factors, nb07.noisy_mean)
    assert grade("07.4", worked).passed
    norms = lambda s: torch.stack([g.flatten(1).norm(dim=1) for g in s])  # noqa: E731  (tensors, N)
    failed("07.4", (lambda s, c: c / norms(s).norm(dim=0), nb07.noisy_mean), "scales small gradients up")
    failed("07.4", (lambda s, c: (c / norms(s).sum(0)).clamp(max=1), nb07.noisy_mean), "square root")
    failed("07.4", (lambda s, c: (c / norms(s)[0]).clamp(max=1), nb07.noisy_mean), "all layers")
    failed("07.4", (lambda s, c: (c / norms(s)).clamp(max=1), nb07.noisy_mean), "one factor per sample")
    sums = lambda s, f, c, sigma: [torch.einsum("n,n...->...", f, g) + sigma * c * torch.randn_like(g[0]) for g in s]  # noqa: E731
    failed("07.4", (nb07.clip_factors, sums), "times too large", "divide the sum by N")
    unclipped = lambda s, f, c, sigma: [g.mean(0) + sigma * c * torch.randn_like(g[0]) / len(g) for g in s]  # noqa: E731
    failed("07.4", (nb07.clip_factors, unclipped), "ignores the factors")
    quiet = lambda s, f, c, sigma: nb07.noisy_mean(s, f, c, 0.0)  # noqa: E731
    failed("07.4", (nb07.clip_factors, quiet), "adds no noise")
    one_number = lambda s, f, c, sigma: [  # noqa: E731  (one noise number for the whole tensor)
        (torch.einsum("n,n...->...", f, g) + sigma * c * torch.randn(1)) / len(g) for g in s]
    failed("07.4", (nb07.clip_factors, one_number), "every entry of a tensor gets the same noise")
    failed("07.4", (nb07.clip_factors, lambda s, f, c, sigma: [
        (torch.einsum("n,n...->...", f, g) + sigma * torch.randn_like(g[0])) / len(g) for g in s]), "noise * clip")
    failed("07.4", (nb07.clip_factors, lambda s, f, c, sigma: [
        torch.einsum("n,n...->...", f, g) / len(g) + sigma * c * torch.randn_like(g[0]) for g in s]),
           "divide the noise by N")
    failed("07.4", nb07.clip_factors, "pair")

    def reseeded(s, f, c, sigma):
        generator = torch.Generator().manual_seed(0)
        return [(torch.einsum("n,n...->...", f, g) + sigma * c * torch.randn(g[0].shape, generator=generator))
                / len(g) for g in s]

    failed("07.4", (nb07.clip_factors, reseeded), "same noise at every call")

    def shared(s, f, c, sigma):
        noise = torch.randn(s[0][0].numel())
        return [(torch.einsum("n,n...->...", f, g) + sigma * c * noise[:g[0].numel()].view_as(g[0])) / len(g)
                for g in s]

    failed("07.4", (nb07.clip_factors, shared), "repeats part of the weight's noise")


def test_the_private_step_with_the_students_pair_bounds_one_images_influence():
    bound = 2 * nb07.CLIP * nb07.LR / nb07.BATCH
    assert nb07.influence(nb07.private_step) <= bound * 1.001


def test_the_sensitivity_row_fails_a_step_without_noise(capsys):
    quiet = lambda model, x, y: nb07.private_step(model, x, y, noise=0.0)  # noqa: E731  (half of 07.4 skipped)
    assert nb07.influence(quiet) <= 2 * nb07.CLIP * nb07.LR / nb07.BATCH * 1.001  # clipping alone meets the bound
    assert nb07.noise_scale(quiet) == 0.0 and nb07.noise_scale() == 0.0
    assert math.isclose(nb07.noise_scale(nb07.private_step), 0.5, rel_tol=0.03)
    nb07.spec(step=quiet)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("sensitivity"))
    assert row.split("✗")[-1].strip().endswith("σ 0.00") and "✓" not in row
    nb07.spec(only="sensitivity")
    assert len(capsys.readouterr().out.splitlines()) == 2

"""Exercises and predictions of notebook 07: hooks inside the tools you use.

``spec`` is the lesson's acceptance test: four targets (pruning, sensitivity and noise, saved bytes, peak
memory), one opening each section (``spec(only=...)``), each measured on a plain training step and on the
student's own tool; saved bytes and peaks are counted on the allocator's side (``torch.profiler``).
``gradient_timeline`` shows where the gradient
memory peaks, with and without the fused step. Predictions 07.a-07.e compute their truth with
torch. Exercises, in the order the lesson asks them: pruning with a forward pre-hook (07.1),
per-sample gradients of a Linear layer from a forward hook and a tensor hook (07.2), and of a
Conv2d through ``unfold`` (07.3), DP-SGD's clipping and noise (07.4), compressing what autograd saves
(07.5), and an SGD step fused into backward with post-accumulate-grad hooks (07.6). ``prune_by_hand``,
``grad_sample_hooks``, ``conv_grad_sample``, ``clip_factors``/``noisy_mean``, ``pack_bf16``/``unpack_bf16``
and ``fuse_sgd`` are worked answers: the lesson goes on with them while the student's own has not passed.
"""

from __future__ import annotations

import copy
import functools
import gc
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import Outcome, exercise, kind_of, not_a_handle, prediction

LR, CLIP, BATCH = 0.1, 1.0, 64


# ----- the problem: four requirements --------------------------------------------------------------
def _model():
    from ..models import trained_digits_cnn

    return trained_digits_cnn()


def _batch(n: int = BATCH):
    from ..data import digits

    data = digits()
    return data.x_train[:n].clone(), data.y_train[:n].clone()


def plain_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float = LR) -> None:
    """One step of plain SGD on the mean cross-entropy."""
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:  # a frozen parameter has none
                p -= lr * p.grad


def zero_by_hand(module: nn.Module, name: str, amount: float) -> None:
    """Pruning without a hook: set the ``amount`` share of smallest |w| to 0, once."""
    weight = getattr(module, name)
    with torch.no_grad():
        weight.view(-1)[weight.abs().flatten().topk(round(amount * weight.numel()), largest=False).indices] = 0


FINE_TUNE_STEPS = 5


def conv_zeros_after_step(prune: Callable | None = None, by_layer: bool = False) -> float | dict | None:
    """The share of each conv's weight that is 0 after ``prune`` (a function of a module; without one, half of
    each weight is set to 0 by hand), fine-tuning (``FINE_TUNE_STEPS`` SGD steps on batches of 64 digits) and a
    forward pass: the smallest share over the convs, or ``by_layer`` a dict of them; None when a pruned weight
    is stale (not ``weight_orig * weight_mask`` after that forward pass)."""
    from ..data import digits

    model, data = _model(), digits()
    convs = {name: m for name, m in model.named_modules() if isinstance(m, nn.Conv2d)}
    for conv in convs.values():
        (prune or zero_by_hand)(conv, "weight", 0.5)
    for start in range(0, FINE_TUNE_STEPS * BATCH, BATCH):
        try:
            plain_step(model, data.x_train[start:start + BATCH], data.y_train[start:start + BATCH])
        except RuntimeError:  # a weight computed once, and never again: its graph is used a second time
            return None
    model(data.x_train[:BATCH])  # the forward pass after the steps, where a pruned weight is recomputed
    if prune and not all(torch.equal(conv.weight, conv.weight_orig * conv.weight_mask) for conv in convs.values()):
        return None
    shares = {name: (conv.weight == 0).float().mean().item() for name, conv in convs.items()}
    return shares if by_layer else min(shares.values())


def _update(step: Callable, x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.Tensor:
    """The update ``step`` makes from the trained weights on ``(x, y)`` after ``torch.manual_seed(seed)``,
    flattened over all parameters."""
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    torch.manual_seed(seed)
    step(model, x.clone(), y.clone())
    return torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])


def influence(step: Callable = plain_step) -> float:
    """How far the update moves when image 0 of the batch (its pixels ×5, its label wrong) is replaced by a
    copy of image 1: the norm of the difference of the two updates (the same random numbers for both)."""
    x, y = _batch()
    x[0], y[0] = 5 * x[0], (y[0] + 1) % 10
    replaced_x, replaced_y = x.clone(), y.clone()
    replaced_x[0], replaced_y[0] = x[1], y[1]
    return (_update(step, x, y, seed=0) - _update(step, replaced_x, replaced_y, seed=0)).norm().item()


def noise_scale(step: Callable = plain_step) -> float:
    """The noise ``step`` adds, as a multiple σ of clip · lr / N: the same step from the same weights on the same
    batch with two seeds; the clipped part is the same in both, so their difference is noise alone, of std
    √2 · σ · clip · lr / N on each number. Plain SGD: 0."""
    x, y = _batch()
    difference = _update(step, x, y, seed=1) - _update(step, x, y, seed=2)
    return (difference.std() / 2**0.5 / (CLIP * LR / BATCH)).item()


def saved_bytes(pack: Callable | None = None, unpack: Callable | None = None, n: int = 256,
                checkpoint: bool = False, model: nn.Module | None = None, batch=None) -> int:
    """Bytes that autograd keeps for backward in one forward pass of a batch of ``n`` digits, counted on the
    allocator's side: the bytes allocated during the forward pass and still held at its end (by what ``pack``
    returned, or by anything else it keeps, such as a dict), less what the same pass holds without a graph
    (its loss); plus the batch's own tensors (inputs, targets) where they are kept as they are, since they were
    allocated before. A tensor saved twice (a ReLU's output is also the next conv's input) is one allocation.
    Parameters are left out (they exist anyway). ``checkpoint``: ``features`` runs under non-reentrant
    activation checkpointing, whose own saved-tensor hooks keep only its input (added here) and recompute the
    rest in backward. ``model`` and ``batch`` (inputs and targets of the mean cross-entropy) replace the
    trained digits CNN and its ``n`` digits. Backward runs at the end, through ``unpack``."""
    pack, unpack = pack or (lambda t: t), unpack or (lambda t: t)
    model = model or _model()
    x, y = batch or _batch(n)
    existing, counted, extra = {t.untyped_storage().data_ptr(): t for t in (x, y)}, set(), 0

    def counting(t):
        nonlocal extra
        packed = pack(t)
        for kept in _tensors_in(packed):
            address = kept.untyped_storage().data_ptr()
            if address in existing and address not in counted:
                counted.add(address)
                extra += kept.untyped_storage().nbytes()
        return packed

    def forward():
        if checkpoint:
            from torch.utils.checkpoint import checkpoint as run_checkpointed

            return F.cross_entropy(model.head(run_checkpointed(model.features, x, use_reentrant=False)), y)
        return F.cross_entropy(model(x), y)

    with torch.no_grad():
        without_graph, _ = _net_allocated(forward)
    with torch.autograd.graph.saved_tensors_hooks(counting, unpack):
        held, loss = _net_allocated(forward)
    if checkpoint:
        extra += x.untyped_storage().nbytes()  # what the checkpoint keeps: its input
    loss.backward()
    return held - without_graph + extra


def _silenced_profile(run: Callable):
    """``run()`` under ``torch.profiler.profile(profile_memory=True)`` on the CPU, its log lines on stderr
    silenced: (the profiler, what ``run`` returned)."""
    import os
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
                out = run()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return prof, out


def _net_allocated(run: Callable) -> tuple[int, object]:
    """The bytes the CPU allocator handed out during ``run()`` and still holds at its end, and what ``run``
    returned (kept alive until then)."""
    prof, out = _silenced_profile(run)
    return sum(e.self_cpu_memory_usage for e in prof.events()), out


def _tensors_in(packed) -> list[torch.Tensor]:
    if isinstance(packed, torch.Tensor):
        return [packed]
    if isinstance(packed, tuple | list):
        return [t for item in packed for t in _tensors_in(item)]
    if isinstance(packed, dict):
        return [t for item in packed.values() for t in _tensors_in(item)]
    return []


def gradient_peak(fuse: Callable | None = None, model: nn.Module | None = None, batch=None) -> tuple[str, int, int]:
    """The row of ``gradient_timeline`` with the most bytes of gradients alive: (as which parameter's
    gradient arrives, the gradient tensors alive then, their bytes)."""
    return max(gradient_timeline(fuse, model, batch), key=lambda row: row[2])


_MEASURED: dict[str, object] = {}  # each row's last measurement of a tool, so that a row keeps its answer
_PLAIN: dict[str, object] = {}  # each row's measurement of plain training, made once


def wide_linear(layers: int = 3) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The model of the fused-step target: ``layers`` wide ``Linear`` layers (1024 wide, the last one to 10
    outputs; three by default), and a batch of 16 random inputs and targets, the same at every call, where the
    gradients (4 MB a 1024 x 1024 weight), not the saved tensors, make the peak."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        wide = [m for _ in range(layers - 1) for m in (nn.Linear(1024, 1024), nn.ReLU())]
        model = nn.Sequential(*wide, nn.Linear(1024, 10))
        return model, (torch.randn(16, 1024), torch.randint(0, 10, (16,)))


def step_peak(fuse: Callable | None = None, model: nn.Module | None = None, batch=None) -> int:
    """The most bytes of saved tensors and gradients alive at once in one training step (``gradient_timeline``):
    a count, blind to temporaries."""
    return max(size + kept for *_, size, kept in gradient_timeline(fuse, model, batch))


def allocator_peak(fuse: Callable | None = None, model: nn.Module | None = None, batch=None) -> int:
    """The CPU allocator's peak, in bytes above what was allocated before, during one training step (forward,
    backward and, without ``fuse``, plain SGD's in-place step ``p.add_(p.grad, alpha=-lr)``) of the wide
    ``Linear`` layers (or ``model`` on ``batch``), measured by ``torch.profiler.profile(profile_memory=True)``:
    each operator's own allocations counted at its start, its frees at its end. The profiler's log lines on
    stderr are silenced."""
    if model is None:
        model, batch = wide_linear()
    x, y = batch
    model.zero_grad()
    handles = fuse(model, LR) if fuse else []

    def step():
        F.cross_entropy(model(x), y).backward()
        if not fuse:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-LR)
            model.zero_grad()

    try:
        prof, _ = _silenced_profile(step)
    finally:
        for handle in handles:
            handle.remove()
    return _peak_of(prof)


def _peak_of(prof) -> int:
    """The allocator's peak in a profile: each operator's own allocations counted at its start, frees at its end."""
    changes = sorted((e.time_range.start if e.self_cpu_memory_usage > 0 else e.time_range.end, e.self_cpu_memory_usage)
                     for e in prof.events())
    now = peak = 0
    for _, change in changes:
        now += change
        peak = max(peak, now)
    return peak


def cnn_allocator_peaks(fuse: Callable | None = None) -> dict[str, int]:
    """The CPU allocator's peaks, in bytes, for the trained digits CNN on 64 digits (``allocator_peak``'s
    measure): ``"forward"``, the forward pass and loss alone; ``"step"``, the whole training step, backward
    included (fused with ``fuse``, or plain SGD). Backward makes each activation's gradient while saved tensors
    still live, so its peak is above forward's."""
    model, (x, y) = _model(), _batch()
    prof, _ = _silenced_profile(lambda: F.cross_entropy(model(x), y))
    return {"forward": _peak_of(prof), "step": allocator_peak(fuse, _model(), (x, y))}


def bf16_each_save(t: torch.Tensor):
    """The plain bfloat16 pack: every float tensor kept in 2 bytes a number, packed again at each save."""
    return (t.dtype, t.to(torch.bfloat16)) if t.is_floating_point() else (None, t)


ROWS = ("pruning", "sensitivity", "saved", "peak")  # spec's rows, in order, by the name ``only`` takes


def spec(prune=None, step=None, pack=None, unpack=None, fuse=None, only: str | None = None) -> None:
    """Print the lesson's four targets, each measured on plain training and on your tool where it is given
    (or as it was measured when an earlier call was given one): every row when no tool or every tool is
    given, else only the rows of the tools given; ``only`` (one of ``ROWS``) prints that row alone.
    Sensitivity: how far the update moves when image 0 (a wrong image) is replaced by a copy of image 1, the
    same random numbers in both runs (``influence``), and the noise σ the step adds, measured over two seeds
    (``noise_scale``). Peak: the allocator's most bytes above what it held before the step (``allocator_peak``),
    so the weights, allocated before, are not counted."""
    bound = 2 * CLIP * LR / BATCH
    rows = [  # (words, target, measure a tool (None: plain training), tool, ok(value, plain's value), show)
        ("keep pruned weights 0 in each of 3 convs", "≥ 50% zero", lambda t: conv_zeros_after_step(t, by_layer=True),
         prune, lambda v, _: v is not None and min(v.values()) >= 0.5,
         lambda v: "stale weight" if v is None else "/".join(f"{100 * s:.0f}" for s in v.values()) + "% zero"),
        ("sensitivity to one image; noise σ", f"≤ {bound:.4f}; σ ≥ 0.5",
         lambda t: (influence(t or plain_step), noise_scale(t or plain_step)), step,
         lambda v, _: v[0] <= bound * 1.001 and v[1] >= 0.5 * 0.95, lambda v: f"{v[0]:.4f}; σ {v[1]:.2f}"),
        ("saved for backward (256 digits)", "≤ 90% of plain",
         lambda t: saved_bytes(*(t or (None, None))), (pack, unpack) if pack else None,
         lambda v, plain: v <= 0.9 * plain * 1.001, lambda v: f"{v / 1e6:.2f} MB"),
        ("peak memory of a wide-Linear training step", "≤ 60% of plain",
         allocator_peak, fuse, lambda v, plain: v <= 0.6 * plain, lambda v: f"{v / 1e6:.1f} MB"),
    ]
    if only is not None and only not in ROWS:
        raise ValueError(f"only must be one of {ROWS}, got {only!r}")
    given = [tool is not None for *_, tool, _, _ in rows]
    print(f"{'your tool must':<43}{'target':<19}{'without it':<19}{'yours':<18}")
    for name, (words, target, measure, tool, ok, show), shown in zip(ROWS, rows, given, strict=True):
        if tool is not None:
            _MEASURED[words] = measure(tool)
        if (only is not None and name != only) or (only is None and any(given) and not all(given) and not shown):
            continue
        if words not in _PLAIN:  # plain training is measured once: it is the same at every call
            _PLAIN[words] = measure(None)
        plain = _PLAIN[words]
        without = ("✓ " if ok(plain, plain) else "✗ ") + show(plain)
        yours = (("✓ " if ok(_MEASURED[words], plain) else "✗ ") + show(_MEASURED[words]) if words in _MEASURED
                 else "not yet")
        print(f"{words:<43}{target:<19}{without:<19}{yours:<18}")


def gradient_timeline(fuse: Callable | None = None, model: nn.Module | None = None,
                      batch=None) -> list[tuple[str, int, int, int]]:
    """One training step (of the trained digits CNN on 64 digits, or of ``model`` on ``batch``, a pair of
    inputs and targets for the mean cross-entropy), seen as each parameter's gradient arrives in backward: (the
    parameter, the gradient tensors alive then, their bytes, the bytes of the tensors autograd still keeps
    for backward), the arriving gradient included. First the row "before backward" (everything saved, no
    gradient), last the row "after backward" (what the optimizer step meets: every .grad for plain SGD)."""
    model = model or _model()
    model.zero_grad()  # no gradient left from an earlier step
    named = list(model.named_parameters())
    parameters = {p.untyped_storage().data_ptr() for _, p in named}
    handles = fuse(model, LR) if fuse else []
    rows, holders = [], weakref.WeakSet()  # a holder lives as long as autograd keeps what it holds

    class Saved:
        __slots__ = ("__weakref__", "tensor")

        def __init__(self, tensor):
            self.tensor = tensor

    def hold(t):
        holder = Saved(t)
        holders.add(holder)
        return holder

    def alive(extra: list) -> tuple[int, int, int]:
        tensors = extra + [p.grad for _, p in named if p.grad is not None]
        storages = {h.tensor.untyped_storage().data_ptr(): h.tensor.untyped_storage().nbytes() for h in holders}
        saved = sum(size for address, size in storages.items() if address not in parameters)
        return len(tensors), sum(t.numel() * t.element_size() for t in tensors), saved

    def watch(name):
        def before_accumulate(grad):  # a tensor hook on a leaf runs before its gradient is stored
            rows.append((name, *alive([grad])))
        return before_accumulate

    watches = [p.register_hook(watch(name)) for name, p in named]
    try:
        x, y = batch or _batch()
        with torch.autograd.graph.saved_tensors_hooks(hold, lambda holder: holder.tensor):
            loss = F.cross_entropy(model(x), y)
        rows.append(("before backward", *alive([])))
        loss.backward()
        del loss
        rows.append(("after backward", *alive([])))
    finally:
        for handle in [*watches, *handles]:
            handle.remove()
    return rows


# ----- worked answers ------------------------------------------------------------------------------
def prune_by_hand(module: nn.Module, name: str, amount: float):
    """What ``prune.l1_unstructured`` does: keep the weights in ``name + '_orig'``, the mask (0 for the
    ``amount`` share of smallest |w|) in the buffer ``name + '_mask'``, and recompute ``name`` from both in a
    forward pre-hook. Returns the hook's handle."""
    weight = getattr(module, name)
    k = round(amount * weight.numel())
    mask = torch.ones_like(weight)
    mask.view(-1)[weight.detach().abs().flatten().topk(k, largest=False).indices] = 0
    del module._parameters[name]
    module.register_parameter(name + "_orig", weight)  # the same object: an optimizer made before still trains it
    module.register_buffer(name + "_mask", mask)

    def apply_mask(module, args):
        setattr(module, name, getattr(module, name + "_orig") * getattr(module, name + "_mask"))

    apply_mask(module, ())
    return module.register_forward_pre_hook(apply_mask)


def conv_grad_sample(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Each sample's weight gradient of a Conv2d from its input ``a`` and the gradient of its output ``g``:
    the conv is a matrix product of the weight with ``unfold(a)``, so per sample it is ``g @ unfold(a)ᵀ``."""
    cols = F.unfold(a, layer.kernel_size, dilation=layer.dilation, padding=layer.padding, stride=layer.stride)
    return torch.einsum("nol,nkl->nok", g.flatten(2), cols).reshape(len(a), *layer.weight.shape)


def grad_sample_hooks(layer: nn.Module, loss_reduction: str = "mean") -> list:
    """Opacus's mechanism: a forward hook keeps the layer's input and hooks its output, whose gradient gives
    each sample's gradient in ``weight.grad_sample`` and ``bias.grad_sample`` (of each sample's own loss).
    ``loss_reduction`` says how backward's loss was reduced, which the hook cannot see: a "mean" loss hands
    each sample 1/N of its gradient, so it is multiplied back by N; a "sum" loss hands each its own.
    Returns the forward hook's handle in a list."""

    def keep(module, args, output):
        a = args[0].detach()

        def per_sample(g):
            g = g * len(a) if loss_reduction == "mean" else g
            if isinstance(module, nn.Conv2d):
                weight, bias = conv_grad_sample(module, a, g), g.sum((2, 3))
            else:  # "...": any middle dimensions, a sequence's positions (N, T, in), summed as the batch's are not
                weight, bias = torch.einsum("n...o,n...i->noi", g, a), torch.einsum("n...o->no", g)
            for p, sample in ((module.weight, weight), (module.bias, bias)):  # a layer called twice: add, as .grad does
                p.grad_sample = sample if getattr(p, "grad_sample", None) is None else p.grad_sample + sample

        output.register_hook(per_sample)

    return [layer.register_forward_hook(keep)]


def clip_factors(grad_samples: list[torch.Tensor], clip: float) -> torch.Tensor:
    """DP-SGD's clipping: each sample's factor ``min(1, clip / norm)``, the norm of its gradient over every
    tensor in ``grad_samples`` (each of shape (N, ...)) together. Returns shape (N,)."""
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grad_samples]).norm(dim=0)
    return (clip / norms).clamp(max=1.0)


def noisy_mean(grad_samples: list[torch.Tensor], factors: torch.Tensor, clip: float, noise: float) -> list:
    """DP-SGD's update direction for each tensor: the per-sample gradients scaled by ``factors`` and summed,
    Gaussian noise of std ``noise * clip`` added, divided by the batch size N."""
    return [(torch.einsum("n,n...->...", factors, g) + noise * clip * torch.randn_like(g[0])) / len(g)
            for g in grad_samples]


def private_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float = LR, clip: float = CLIP,
                 noise: float = 0.5, hooks: Callable = grad_sample_hooks,
                 dp: tuple[Callable, Callable] = (clip_factors, noisy_mean)) -> torch.Tensor:
    """DP-SGD (Abadi et al., 2016): each sample's gradient clipped to norm ``clip``, summed, Gaussian noise of
    std ``noise * clip`` added, divided by the batch size (``dp``: the pair of functions that clip and add the
    noise); frozen layers are left out. Returns each sample's gradient norm."""
    layers = [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d) and m.weight.requires_grad]
    handles = [h for layer in layers for h in hooks(layer)]
    try:
        F.cross_entropy(model(x), y).backward()
    finally:
        for handle in handles:
            handle.remove()
    params = [p for layer in layers for p in (layer.weight, layer.bias)]
    samples = [p.grad_sample for p in params]
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in samples]).norm(dim=0)
    with torch.no_grad():
        for p, update in zip(params, dp[1](samples, dp[0](samples, clip), clip, noise), strict=True):
            p -= lr * update
            p.grad = None
            del p.grad_sample  # gone: at the next step, the hooks make a new one
    return norms


def sample_norms(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each image's gradient norm, over every layer of the trained digits CNN (its mean cross-entropy on x, y)."""
    return private_step(_model(), x, y, noise=0.0)


def linear_and_conv(linear_hooks: Callable, conv_grad_sample: Callable) -> Callable:
    """Per-sample hooks for both kinds of layer, built from the student's two answers: ``linear_hooks(layer)``
    (07.2) on a Linear; on a Conv2d, 07.2's forward hook and output tensor hook, whose weight gradient is
    ``conv_grad_sample(layer, a, g)`` (07.3) and whose bias gradient is ``g`` summed over positions. For a mean
    loss. Returns a function of a layer that returns the handles."""

    def hooks(layer: nn.Module) -> list:
        if not isinstance(layer, nn.Conv2d):
            return linear_hooks(layer)

        def keep(module, args, output):
            a = args[0].detach()

            def per_sample(g):
                g = g * len(a)  # a mean loss hands each sample 1/N of its gradient
                for p, sample in ((module.weight, conv_grad_sample(module, a, g)), (module.bias, g.sum((2, 3)))):
                    p.grad_sample = sample if getattr(p, "grad_sample", None) is None else p.grad_sample + sample

            output.register_hook(per_sample)

        return [layer.register_forward_hook(keep)]

    return hooks


def dp_pass(start: nn.Module, step: Callable, steps: int = 50, seed: int = 0, **kwargs) -> tuple:
    """Train the head of a copy of ``start`` (its ``features`` frozen) with ``step(model, x, y, **kwargs)`` for
    ``steps`` steps of 27 training digits (one pass: 50 steps), random numbers from ``seed``. Returns the test
    accuracy, each step's (norm of the clipped gradients' update, norm of the noise's) when ``step`` takes a
    ``noise`` (the first is the same step with ``noise=0.0`` from the same weights, the second the rest of the
    update), and what the first step returned."""
    from ..data import digits
    from ..models import DigitsCNN, accuracy

    data, model = digits(), DigitsCNN()
    model.load_state_dict(start.state_dict())
    model.features.requires_grad_(False)
    torch.manual_seed(seed)
    parts, first = [], None
    for i, (x, y) in enumerate(list(zip(data.x_train.chunk(50), data.y_train.chunk(50), strict=True))[:steps]):
        before = [p.detach().clone() for p in model.parameters()]
        if "noise" in kwargs:
            quiet = copy.deepcopy(model)
            step(quiet, x, y, **{**kwargs, "noise": 0.0})
            clipped = torch.cat([(q.detach() - b).flatten() for q, b in zip(quiet.parameters(), before, strict=True)])
        out = step(model, x, y, **kwargs)
        first = out if i == 0 else first
        if "noise" in kwargs:
            update = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
            parts.append((clipped.norm().item(), (update - clipped).norm().item()))
    return accuracy(model, data.x_test, data.y_test), parts, first


def _fresh_head() -> nn.Module:
    """The trained digits CNN with its head's Linear layers reset (seeded: the same at every call)."""
    start = _model()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for m in start.head.modules():
            if isinstance(m, nn.Linear):
                m.reset_parameters()
    return start


def fresh_head_accuracy(step: Callable = plain_step, **kwargs) -> float:
    """The test accuracy after one pass over the training digits (``dp_pass``: 50 steps of 27) that trains the
    digits CNN's head from fresh weights, its trained ``features`` frozen, with ``step(model, x, y, **kwargs)``:
    plain SGD by default, or a private step given its ``noise`` (and ``lr``). Seeded: the same at every call."""
    return dp_pass(_fresh_head(), step, **kwargs)[0]


def fresh_head_first_step() -> tuple[torch.Tensor, float]:
    """The first step of ``fresh_head_accuracy``'s training (27 digits, fresh head, features frozen): each
    image's gradient norm, and how many times longer plain SGD's update is than the clipped one's (noise 0, the
    same lr)."""
    from ..data import digits

    data, model = digits(), _fresh_head()
    model.features.requires_grad_(False)
    x, y = data.x_train.chunk(50)[0], data.y_train.chunk(50)[0]
    before = [p.detach().clone() for p in model.head.parameters()]
    plain, clipped = copy.deepcopy(model), copy.deepcopy(model)
    plain_step(plain, x, y)
    norms = private_step(clipped, x, y, noise=0.0)
    moved = [torch.cat([(p.detach() - b).flatten() for p, b in zip(m.head.parameters(), before, strict=True)]).norm()
             for m in (plain, clipped)]
    return norms, (moved[0] / moved[1]).item()


def parameters_as_they_are(pack: Callable, unpack: Callable) -> tuple[Callable, Callable]:
    """``pack`` and ``unpack`` that leave a saved parameter (an ``nn.Parameter``, alive anyway) as it is and
    hand every other saved tensor to the given pair."""

    def keep_parameters(t):
        return (True, t) if isinstance(t, nn.Parameter) else (False, pack(t))

    def unpack_parameters(packed):
        as_it_is, kept = packed
        return kept if as_it_is else unpack(kept)

    return keep_parameters, unpack_parameters


_PACKED: dict[int, tuple] = {}  # id of a live tensor computed in forward -> what pack_bf16 returned for it


def pack_bf16(t: torch.Tensor):
    """Keep a float tensor as bfloat16 (half the bytes) with its dtype, anything else as it is; a tensor
    saved twice (a ReLU's output is also the next layer's input) is packed once, while it lives. Only tensors
    computed in forward (with a ``grad_fn``) are remembered: a parameter changes between steps."""
    if not t.is_floating_point():
        return None, t
    if t.grad_fn is None:
        return t.dtype, t.to(torch.bfloat16)
    if id(t) not in _PACKED:
        _PACKED[id(t)] = t.dtype, t.to(torch.bfloat16)
        weakref.finalize(t, _PACKED.pop, id(t), None)
    return _PACKED[id(t)]


def unpack_bf16(packed):
    dtype, t = packed
    return t if dtype is None else t.to(dtype)


def fuse_sgd(model: nn.Module, lr: float) -> list:
    """The SGD step of each parameter, taken as soon as its gradient is accumulated, and the gradient freed
    (the PyTorch tutorial on fusing the optimizer step into backward). Returns the handles."""

    def step(p):
        with torch.no_grad():
            p.add_(p.grad, alpha=-lr)  # in place: no gradient-sized temporary, as lr * p.grad would make
        p.grad = None

    return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]


def fuse_sgd_with_temporary(model: nn.Module, lr: float) -> list:
    """``fuse_sgd`` written ``p -= lr * p.grad``: ``lr * p.grad`` is a new gradient-sized tensor, alive
    together with the gradient while the step runs."""

    def step(p):
        with torch.no_grad():
            p -= lr * p.grad
        p.grad = None

    return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]


# ----- predictions ---------------------------------------------------------------------------------
@prediction("07.a", "whether weight equals weight_orig * weight_mask after an SGD step, then after a forward pass",
            why="the optimizer moves weight_orig, the parameter, so weight is a stale product until the forward "
                "pre-hook computes it again before the next forward pass: [False, True]",
            wrong=[([True, True], "the optimizer updates parameters only: weight_orig moves, and weight, a plain "
                                  "tensor computed before the step, does not"),
                   ([False, False], "the forward pre-hook runs before every forward pass and sets weight again"),
                   ([0, 1], "right, written as numbers: answer with booleans, [False, True]")])
def _fresh_after_step() -> list[bool]:
    from torch.nn.utils import prune

    model = _model()
    conv = model.features[0]
    prune.l1_unstructured(conv, "weight", amount=0.5)
    x, y = _batch()
    plain_step(model, x, y)
    after_step = torch.equal(conv.weight, conv.weight_orig * conv.weight_mask)
    model(x)
    return [after_step, torch.equal(conv.weight, conv.weight_orig * conv.weight_mask)]


@prediction("07.b", "the sum of the 32 per-sample gradients over the weight.grad of the mean loss",
            why="the mean loss is (l_1 + … + l_32) / 32, so weight.grad is the mean of the per-sample "
                "gradients, and their sum is 32 times it",
            wrong=[(1, "weight.grad is of the mean loss: the mean of the per-sample gradients, not their sum"),
                   (1 / 32, "the other way round: the sum is larger than the mean")])
def _sum_over_grad() -> float:
    from torch.func import functional_call, grad, vmap

    model = _model()
    x, y = _batch(32)
    params = {k: v.detach() for k, v in model.named_parameters()}
    per_sample = vmap(grad(lambda p, xi, yi: F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])),
                      in_dims=(None, 0, 0))(params, x, y)["head.2.weight"]
    F.cross_entropy(model(x), y).backward()
    return (per_sample.sum(0).norm() / model.head[2].weight.grad.norm()).item()


def clipped_share() -> float:
    """The norm of the wrong image's share of the clipped mean: its per-sample gradient (from the worked hooks),
    clipped to norm C, over the 64 images."""
    model = _model()
    x, y = _batch()
    x[0], y[0] = 5 * x[0], (y[0] + 1) % 10
    handles = [h for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d) for h in grad_sample_hooks(m)]
    try:
        F.cross_entropy(model(x), y).backward()
    finally:
        for handle in handles:
            handle.remove()
    own = torch.cat([p.grad_sample[0].flatten() for p in model.parameters()])
    return (own * min(1.0, CLIP / own.norm().item()) / BATCH).norm().item()


@prediction("07.c", "the bytes autograd keeps for Linear(64, 10) on 256 inputs that need no gradient",
            why="the weight's gradient g.T @ x needs the input x (256 × 64 floats × 4 bytes); the weight is "
                "needed only for the input's gradient, which nobody asked for: 65,536 bytes",
            wrong=[(65536 + 2560, "the weight is needed only for the gradient of the input, and the input needs none"),
                   (2560, "like b in a * b: the weight's gradient g.T @ x needs the other factor, the input x"),
                   (0, "the weight needs a gradient, and its gradient g.T @ x needs the input x")])
def _linear_saves() -> int:
    torch.manual_seed(0)
    layer, sizes = nn.Linear(64, 10), []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        out = layer(torch.randn(256, 64))
    out.sum().backward()
    return sum(sizes)


def _a_share(guess) -> str | None:
    if isinstance(guess, int | float) and not isinstance(guess, bool) and 1 < guess <= 100:
        return "answer with a share between 0 and 1 (0.5 for half), not a percentage"
    return None


@prediction("07.d", "the share of plain autograd's saved bytes that a bfloat16 pack keeps",
            why="each float tensor is packed to half its bytes at each save, so a ReLU output saved twice becomes "
                "two bfloat16 copies, as many bytes as the one float32 tensor, and max-pool's int64 indices keep "
                "theirs: about 0.86 of plain's bytes",
            wrong=[(0.5, "half holds for a float tensor saved once; a ReLU output saved twice becomes two bfloat16 "
                         "copies (as many bytes as the one float32 tensor), and the int64 indices are not floats"),
                   (1.0, "every float saved once shrinks to 2 bytes a number; only tensors saved twice and the "
                         "int64 indices keep their bytes")],
            rel=0.03, form=_a_share)
def _bf16_share() -> float:
    return saved_bytes(bf16_each_save, unpack_bf16) / saved_bytes()


def _a_place(guess) -> str | None:
    if not isinstance(guess, str) or guess.strip().strip("'\"").lower() not in {"forward", "backward"}:
        return "name the pass where the allocator peaks, as a string: \"forward\" or \"backward\""
    return None


@prediction("07.e", "where the allocator peaks in one training step of the digits CNN",
            why="the peak is in backward: each activation's gradient, as large as the activation, is made while the "
                "saved tensors it needs are still alive; these dwarf the 95,784 bytes of parameter gradients, so a "
                "fused step, which frees only those, barely moves the peak (the next cell)",
            wrong=[("forward", "forward's peak is below the step's: backward makes each activation's gradient "
                               "while the saved tensors it needs are still alive")],
            form=_a_place)
def _peak_place() -> str:
    plain = cnn_allocator_peaks()
    return "backward" if plain["step"] > plain["forward"] else "forward"


# ----- exercises -----------------------------------------------------------------------------------
def _call(answer, what: str, *args) -> Outcome | object:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`{what}`), not {kind_of(answer)}")
    return answer(*args)


@exercise("07.1", "prune with a forward pre-hook")
def _check_prune(answer) -> Outcome:
    for name in ("weight", "bias"):
        outcome = _prune_one(answer, name, AMOUNT)
        if not outcome.passed:
            return outcome
    return Outcome(True, "the same masks, keys and outputs as prune.l1_unstructured, before and after a step, for "
                         "name='weight' and name='bias'")


AMOUNT = 0.35  # of a Conv2d(3, 4, 3)'s 108 weights: 37.8, which round() makes 38 and int() 37


def _prune_one(answer, name: str, amount: float) -> Outcome:
    from torch.nn.utils import prune

    torch.manual_seed(0)
    theirs, ours = nn.Conv2d(3, 4, 3), None
    ours = copy.deepcopy(theirs)
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.5) for m in (ours, theirs)}  # made before pruning
    handle = _call(answer, "prune_by_hand", ours, name, amount)
    if isinstance(handle, Outcome):
        return handle
    if (bad := not_a_handle(handle, "prune_by_hand", ours)) is not None:
        return bad
    if not hasattr(ours, name):
        handle.remove()
        return Outcome(False, f"right after prune_by_hand(module, '{name}', {amount}), module.{name} raises "
                              "AttributeError: "
                              f"set it to {name}_orig * {name}_mask at once, not only in the pre-hook, which "
                              "runs at the first forward pass")
    prune.l1_unstructured(theirs, name, amount=amount)
    try:
        keys, want = list(ours.state_dict()), list(theirs.state_dict())
        if sorted(keys) != sorted(want):
            return Outcome(False, f"with name='{name}', the state_dict keys are {sorted(keys)}, torch's pruning gives "
                                  f"{sorted(want)}: keep the parameter as '{name}_orig' and the mask as the buffer "
                                  f"'{name}_mask' (use the argument name, not a fixed 'weight')")
        if name + "_mask" in dict(ours.named_parameters()):
            return Outcome(False, f"your {name}_mask is a Parameter, so an optimizer trains it: a step moves the mask, "
                                  "and pruned weights come back. Register it as a buffer (module.register_buffer): "
                                  "saved in the state_dict, never trained")
        mine, right = getattr(ours, name + "_mask"), getattr(theirs, name + "_mask")
        if mine.dtype != right.dtype:
            return Outcome(False, f"your {name}_mask is {mine.dtype}; torch's pruning keeps a {right.dtype} mask of 0s "
                                  "and 1s, the weight's dtype (torch.ones_like(w), then 0 where pruned), so that "
                                  "checkpoints and the product match")
        if not torch.equal(mine, right):
            kept = lambda m: (getattr(m, name + "_mask") * getattr(m, name + "_orig").abs()).sum()  # noqa: E731
            kept_large = kept(ours) < kept(theirs)
            n, k, yours = right.numel(), int((right == 0).sum()), int((mine == 0).sum())
            if kept_large:
                return Outcome(False, f"your mask zeroes the largest |w| of {name}; l1_unstructured zeroes the "
                                      "smallest")
            if yours != k:
                return Outcome(False, f"your mask zeroes {yours} entries of {name}; l1_unstructured zeroes {k}: "
                                      f"{amount} × {n} = {amount * n:.1f}, rounded to the nearest with round(), not "
                                      "cut down with int()")
            return Outcome(False, f"your mask zeroes {k} entries of {name}, as many as l1_unstructured, but other "
                                  "ones: the smallest |w| over the whole tensor (flattened), not per row or channel")
        x, first_mask = torch.randn(2, 3, 6, 6), mine.clone()
        before = getattr(ours, name + "_orig").detach().clone()
        for module in (ours, theirs):
            module(x).square().sum().backward()
            if module is ours and getattr(ours, name + "_orig").grad is None:
                return Outcome(False, f"no gradient reaches {name}_orig: the {name} your pre-hook sets is detached "
                                      "(.detach() or no_grad), so training never moves it; compute "
                                      f"{name}_orig * {name}_mask with autograd on")
            opts[id(module)].step()
        if torch.equal(getattr(ours, name + "_orig"), before):
            return Outcome(False, f"an SGD step made before pruning did not move {name}_orig: you registered a new "
                                  "Parameter, so an optimizer made before pruning no longer trains this layer. "
                                  f"Register the Parameter you removed, the same object, as {name}_orig")
        out = ours(x)
        orig = getattr(ours, name + "_orig").detach()
        moved = torch.ones_like(orig)
        moved.view(-1)[orig.abs().flatten().topk(int((first_mask == 0).sum()), largest=False).indices] = 0
        stale = not torch.allclose(out, theirs(x), atol=1e-5)
        if not torch.equal(getattr(ours, name + "_mask"), first_mask) or (
                stale and not torch.equal(moved, first_mask) and torch.allclose(
                    out, torch.func.functional_call(ours, {name: orig * moved}, (x,)), atol=1e-5)):
            return Outcome(False, f"after an SGD step your pre-hook prunes other entries: it computes the mask again "
                                  f"from the moved {name}_orig. The mask is computed once, at pruning time; the "
                                  f"pre-hook only multiplies {name}_orig by it")
        if stale:
            return Outcome(False, "after an SGD step, the forward pass used a stale weight (its output differs "
                                  f"from torch's): the optimizer moves {name}_orig, so recompute {name} from both in "
                                  "a forward pre-hook, which runs before forward; a forward hook runs after it")
        return Outcome(True, "")
    finally:
        handle.remove()


def per_sample_truth(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each sample's gradient of its own cross-entropy, for every parameter: ``torch.func``'s
    ``vmap(grad(...))`` over the batch, the reference for per-sample gradients."""
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}
    loss = lambda p, xi, yi: F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])  # noqa: E731
    return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)


def _grad_samples(answer, model: nn.Module, layers: list, x, y, reduction: str = "mean") -> Outcome | None:
    handles = []
    try:
        for layer in layers:
            if not callable(answer):
                return Outcome(False, f"pass your function itself (`grad_sample_hooks`), not {kind_of(answer)}")
            try:
                got = answer(layer, loss_reduction=reduction)
            except TypeError as error:
                if "loss_reduction" not in str(error):
                    raise
                return Outcome(False, "grad_sample_hooks must take the argument loss_reduction ('mean' or 'sum'): "
                                      "the hook cannot see how the loss was reduced, so the caller says it")
            if not isinstance(got, list | tuple):
                if hasattr(got, "remove"):
                    got.remove()
                    return Outcome(False, "grad_sample_hooks returned one handle, not a list: return [handle] (the "
                                          "lesson's code removes every handle in the list, and an answer that "
                                          "registers two hooks returns both)")
                return Outcome(False, f"grad_sample_hooks must return its handles in a list, got {kind_of(got)}")
            got = list(got)
            if (bad := not_a_handle(got[0] if got else got, "grad_sample_hooks", *model.modules())) is not None:
                return bad
            handles += got
        F.cross_entropy(model(x), y, reduction=reduction).backward()
    finally:
        for handle in handles:
            handle.remove()
    return None


def _compare_samples(model: nn.Module, names: list[str], truth: dict, reduction: str = "mean") -> Outcome:
    n = next(iter(truth.values())).shape[0]
    for name, p in model.named_parameters():
        plain = truth[name].mean(0) if reduction == "mean" else truth[name].sum(0)
        if p.grad is not None and not torch.allclose(p.grad, plain, atol=1e-5, rtol=1e-4):
            return Outcome(False, f"with loss_reduction='{reduction}', {name}.grad is not the plain gradient: your "
                                  "tensor hook changed the gradient backward goes on with, in place (g *= ...) or by "
                                  "returning a tensor, which replaces it (lesson 01); it flows on to the layer below "
                                  "and into .grad. Read it only: make a new tensor (g = g * N) and return None")
    for name in names:
        p = model.get_parameter(name)
        got = getattr(p, "grad_sample", None)
        if not isinstance(got, torch.Tensor):
            return Outcome(False, f"{name} has no grad_sample after backward: set it in the hook on the layer's output")
        want = truth[name]
        if got.shape != want.shape:
            summed = " (summed over the batch?)" if got.shape == want.shape[1:] else ""
            return Outcome(False, f"{name}.grad_sample has shape {tuple(got.shape)}, want {tuple(want.shape)}: one "
                                  f"gradient per sample{summed}")
        if torch.allclose(got * n, want, atol=1e-5, rtol=1e-4):
            return Outcome(False, f"with loss_reduction='{reduction}', {name}.grad_sample is {n} times too small: "
                           + ("the loss is a mean, so the output's gradient holds each sample's gradient divided by "
                              "the batch size; multiply it back by N" if reduction == "mean" else
                              "a summed loss hands each sample its own gradient; do not divide it by N"))
        if torch.allclose(got, want * n, atol=1e-5, rtol=1e-4):
            return Outcome(False, f"with loss_reduction='{reduction}', {name}.grad_sample is {n} times too large: "
                           + ("a summed loss hands each sample its own gradient; multiply by N only for 'mean'"
                              if reduction == "sum" else "multiply the output's gradient by N once, for 'mean'"))
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            diff = (got - want).abs().max().item()
            return Outcome(False, f"{name}.grad_sample differs from torch.func's per-sample gradients by up to "
                                  f"{diff:.1e} (loss_reduction='{reduction}')")
    return Outcome(True, "each sample's weight and bias gradients equal torch.func's vmap(grad(...)), to 1e-5, for "
                         "a mean and a summed loss")


@exercise("07.2", "per-sample gradients of a Linear layer from hooks")
def _check_linear_samples(answer) -> Outcome:
    for reduction in ("mean", "sum"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
        x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
        truth = per_sample_truth(model, x, y)
        failed = _grad_samples(answer, model, [model[0], model[2]], x, y, reduction)
        outcome = failed or _compare_samples(model, ["0.weight", "0.bias", "2.weight", "2.bias"], truth, reduction)
        if not outcome.passed:
            return outcome
    outcome = _second_step(answer)
    if not outcome.passed:
        return outcome
    # a sequence: each sample is T = 4 positions, so the first two Linear layers see (N, T, in)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3), nn.Flatten(), nn.Linear(12, 3))
    x, y = torch.randn(6, 4, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    truth = per_sample_truth(model, x, y)
    where = "on an input of shape (N, T, in), a sequence of T positions per sample as lesson 08's transformer has"
    try:
        failed = _grad_samples(answer, model, [model[0], model[2], model[4]], x, y)
    except RuntimeError as error:
        first = (str(error).splitlines() or [""])[0][:100]
        return Outcome(False, f"{where}, your hook raised RuntimeError ({first}): a sample's gradient is the sum of "
                              "its outer products over every position; in torch.einsum, '...' stands for the middle "
                              "dimensions, whatever their number")
    outcome = failed or _compare_samples(model, ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight"], truth)
    if not outcome.passed:
        return Outcome(False, f"{where}: {outcome.detail}. Sum each sample's outer products over the positions")
    torch.manual_seed(0)  # one Linear called twice in a forward pass: its gradient is the sum over both calls
    model = _Twice()
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    truth = per_sample_truth(model, x, y)
    outcome = _grad_samples(answer, model, [model.inner, model.head], x, y) or _compare_samples(
        model, ["inner.weight", "inner.bias", "head.weight"], truth)
    if not outcome.passed:
        return Outcome(False, f"on a model that calls one Linear ('inner') twice in a forward pass: {outcome.detail}. "
                              "Each call has its own input and output gradient: pair them (a tensor hook registered "
                              "in the forward hook holds this call's input; a module backward hook sees only the "
                              "input the last call kept), and add the calls' per-sample gradients to grad_sample "
                              "(as .grad accumulates), not overwrite them")
    return Outcome(True, "each sample's weight and bias gradients equal torch.func's vmap(grad(...)), to 1e-5, for "
                         "a mean and a summed loss, for inputs of shape (N, in) and (N, T, in), and on a layer "
                         "called twice")


def _second_step(answer) -> Outcome:
    """Two steps, as the lesson's private step takes them: backward, then ``p.grad = None`` and ``del
    p.grad_sample``, then the same hooks registered again for the next batch."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    batches = [(torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])) for _ in range(2)]
    where = ("at a second step (after the first, the lesson's step sets p.grad = None and deletes grad_sample: "
             "del p.grad_sample)")
    for x, y in batches:
        truth = per_sample_truth(model, x, y)
        try:
            failed = _grad_samples(answer, model, [model[0], model[2]], x, y)
        except (AttributeError, TypeError, RuntimeError) as error:
            return Outcome(False, f"{where}, your hook raised {type(error).__name__}: at each step a parameter "
                                  "starts with no grad_sample; set it if the parameter has none "
                                  "(hasattr(p, 'grad_sample') is False), add to it only if it has one")
        outcome = failed or _compare_samples(model, ["0.weight", "0.bias", "2.weight", "2.bias"], truth)
        if not outcome.passed:
            return Outcome(False, f"{where}: {outcome.detail}")
        for p in model.parameters():
            p.grad = None
            if hasattr(p, "grad_sample"):
                del p.grad_sample
    return Outcome(True, "two steps")


class _Twice(nn.Module):
    """A model that calls one Linear twice in its forward pass (a reused layer), then a head."""

    def __init__(self):
        super().__init__()
        self.inner, self.head = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.inner(torch.tanh(self.inner(x)))))


@exercise("07.3", "per-sample gradients of a Conv2d via unfold")
def _check_conv_samples(answer) -> Outcome:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`conv_grad_sample`), not {kind_of(answer)}")
    torch.manual_seed(0)
    convs = (nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(2, 3, 3, stride=2), nn.Conv2d(3, 2, (2, 3), padding=(1, 0)),
             nn.Conv2d(2, 2, 3, dilation=2))
    for layer in convs:
        a = torch.randn(5, layer.in_channels, 7, 7)
        model = nn.Sequential(layer, nn.Flatten(), nn.Linear(layer(a)[0].numel(), 4))
        y = torch.tensor([0, 1, 2, 3, 0])
        want = per_sample_truth(model, a, y)["0.weight"]
        out = layer(a)  # each sample's loss, summed: the output's gradient is each sample's own
        (g,) = torch.autograd.grad(F.cross_entropy(model[2](model[1](out)), y, reduction="sum"), out)
        where = (f"Conv2d(kernel {layer.kernel_size}, stride {layer.stride}, padding {layer.padding}, "
                 f"dilation {layer.dilation})")
        try:
            got = answer(layer, a, g)
        except NotImplementedError:
            raise
        except RuntimeError as error:
            first = (str(error).splitlines() or [""])[0][:120]
            return Outcome(False, f"for a {where}, your function raised RuntimeError ({first}): unfold with the "
                                  "layer's kernel_size, dilation, padding and stride, so there is one patch per output "
                                  "position")
        if not isinstance(got, torch.Tensor):
            return Outcome(False, f"conv_grad_sample returned {kind_of(got)}, want a tensor of shape "
                                  f"{tuple(want.shape)}")
        if got.shape != want.shape:
            return Outcome(False, f"for a {where}: shape {tuple(got.shape)}, want {tuple(want.shape)} (N, out, in, kh, "
                                  "kw); unfold with the layer's kernel_size, padding, stride and dilation")
        n_, o_ = len(a), layer.out_channels
        if torch.allclose(got, want * n_, atol=1e-5, rtol=1e-4):
            return Outcome(False, f"for a {where}: {n_} times too large. g is already each sample's own gradient: "
                                  "do not multiply it by N here (07.2's hook does that, once)")
        swapped = got.reshape(n_, -1, o_).transpose(1, 2).reshape(want.shape)
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4) and torch.allclose(swapped, want, atol=1e-5, rtol=1e-4):
            return Outcome(False, f"for a {where}: the right numbers in the wrong order. Your einsum gives "
                                  "(N, in·kh·kw, out); the weight is (out, in·kh·kw): write the output as 'nok', "
                                  "out first, then reshape")
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            return Outcome(False, f"for a {where}: differs from torch.func's per-sample gradient by up to "
                                  f"{(got - want).abs().max().item():.1e}: unfold with the layer's dilation, padding "
                                  "and stride")
    return Outcome(True, "equal to torch.func's per-sample gradients for four convs (padding, stride, a 2×3 kernel, "
                         "dilation)")


def _samples(n: int = 6) -> list[torch.Tensor]:
    """Per-sample gradients of three tensors (a weight, a bias, another weight) for n samples whose norms over
    all three lie on both sides of 1, and whose largest single-tensor norm is not their norm over all."""
    torch.manual_seed(0)
    scale = torch.tensor([0.05, 0.3, 0.8, 2.0, 7.0, 40.0])[:n]
    return [torch.randn(n, *shape) * scale.view(-1, *[1] * len(shape)) for shape in ((4, 3), (4,), (2, 4))]


@exercise("07.4", "DP-SGD's clipping and noise")
def _check_private(answer) -> Outcome:
    if not (isinstance(answer, tuple) and len(answer) == 2 and all(callable(f) for f in answer)):
        return Outcome(False, f"pass the pair of functions (clip_factors, noisy_mean), got {kind_of(answer)}")
    factors_of, mean_of = answer
    samples, clip = _samples(), 1.0
    want = clip_factors(samples, clip)
    got = factors_of(samples, clip)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else kind_of(got)
        return Outcome(False, f"clip_factors gave {shape}, want one factor per sample, shape {tuple(want.shape)}: "
                              "the norm of each sample's gradient over all tensors together")
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in samples])  # (tensors, N)
    if not torch.allclose(got, want, rtol=1e-4):
        if torch.allclose(got, clip / norms.norm(dim=0), rtol=1e-4):
            return Outcome(False, "clip_factors scales small gradients up (a factor above 1): clipping only shrinks, "
                                  "min(1, clip / norm)")
        if torch.allclose(got, (clip / norms.sum(0)).clamp(max=1.0), rtol=1e-4):
            return Outcome(False, "clip_factors adds up the tensors' norms: the norm over all tensors is the square "
                                  "root of the sum of their squared norms (stack the norms, then .norm(dim=0))")
        if any(torch.allclose(got, (clip / n).clamp(max=1.0), rtol=1e-4) for n in norms):
            return Outcome(False, "clip_factors uses one tensor's norm: clip each sample's gradient over all layers "
                                  "together, so that no sample moves the whole update by more than clip")
        return Outcome(False, f"clip_factors differs from min(1, clip / norm) by up to {(got - want).abs().max():.1e}")
    update = mean_of(samples, want, clip, 0.0)
    if not isinstance(update, list | tuple) or len(update) != len(samples):
        return Outcome(False, f"noisy_mean must return one tensor per tensor in grad_samples, got {kind_of(update)}")
    right = noisy_mean(samples, want, clip, 0.0)
    for i, (u, r, g) in enumerate(zip(update, right, samples, strict=True)):
        if not isinstance(u, torch.Tensor) or u.shape != r.shape:
            return Outcome(False, f"noisy_mean's tensor {i} has shape {tuple(getattr(u, 'shape', ()))}, want "
                                  f"{tuple(r.shape)}: each sample's gradient scaled by its factor, summed over samples")
        if not torch.allclose(u, r, atol=1e-6, rtol=1e-4):
            if torch.allclose(u, r * len(g), atol=1e-6, rtol=1e-4):
                return Outcome(False, f"with noise 0, noisy_mean is {len(g)} times too large: divide the sum by N")
            if torch.allclose(u, g.mean(0), atol=1e-6, rtol=1e-4):
                return Outcome(False, "noisy_mean ignores the factors: multiply each sample's gradient by its factor "
                                      "before the sum")
            return Outcome(False, f"with noise 0, noisy_mean's tensor {i} differs from the clipped mean by up to "
                                  f"{(u - r).abs().max():.1e}")
    zeros, n, clip, sigma = [torch.zeros(4, 200, 200)], 4, 2.0, 0.5  # no gradient: what is left is the noise
    (noisy,) = mean_of(zeros, torch.ones(n), clip, sigma)
    std, right_std = noisy.std().item(), sigma * clip / n
    if std < right_std / 10:
        if noisy.abs().max() > right_std / 10:
            return Outcome(False, "every entry of a tensor gets the same noise: one number drawn for the whole tensor "
                                  "(torch.randn(1)?); draw one per entry, noise * clip * torch.randn_like(...)")
        return Outcome(False, "noisy_mean adds no noise: add noise * clip * torch.randn_like(...) to the sum")
    for wrong_std, slip in ((sigma / n, "the noise's std is noise * clip (it must drown one sample's clipped "
                                        "gradient, at most clip)"),
                            (sigma * clip, "divide the noise by N too: (sum + noise) / N"),
                            (sigma / n / n * clip, "the noise is divided by N twice")):
        if abs(std - wrong_std) < 0.05 * wrong_std and abs(std - right_std) > 0.05 * right_std:
            return Outcome(False, f"the noise's std is {std:.3f}, want noise · clip / N = {right_std:.3f}: {slip}")
    if abs(std - right_std) > 0.05 * right_std:
        return Outcome(False, f"the noise's std is {std:.3f}, want noise · clip / N = {right_std:.3f}")
    twice = [zeros[0], torch.zeros(n, 4000)]  # two tensors, two calls: every draw must be new
    first, second = mean_of(twice, torch.ones(n), clip, sigma), mean_of(twice, torch.ones(n), clip, sigma)
    corr = lambda a, b: torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].abs().item()  # noqa: E731
    if torch.equal(first[0], second[0]) or corr(first[0], second[0]) > 0.1:
        return Outcome(False, "noisy_mean adds the same noise at every call (do you seed a generator inside it?): "
                              "an observer who sees two steps subtracts it; draw fresh noise each call")
    weight, bias = first
    if any(corr(bias, part) > 0.1 for part in (weight.flatten()[:4000], weight.flatten()[-4000:])):
        return Outcome(False, "the bias's noise repeats part of the weight's noise: draw each tensor's noise on its "
                              "own (torch.randn_like for each tensor), or the noise is not independent")
    return Outcome(True, "the same factors and clipped mean as DP-SGD's, noise of std noise · clip / N, drawn afresh "
                         "at each call and for each tensor")


def _loss_with_temporaries(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The cross-entropy plus a term built from same-shape temporaries ``out * k``, each saved (by ``t * t``)
    and freed before the next is made, so that the next one may get its id and address."""
    out = model(x)
    loss = F.cross_entropy(out, y)
    for k in (1.0, 2.0, 3.0, 4.0):
        t = out * k
        loss = loss + (t * t).mean() * 0.1
        del t
    return loss


_FORGET = ("Python reuses the id of a freed tensor: forget each entry when the tensor given to pack is freed, "
           "weakref.finalize(t, ...). A weak reference to the bfloat16 copy is not enough: autograd keeps the copy "
           "alive after t is freed")
_WRONG_TARGET = ("Your weakref.finalize watches the bfloat16 copy, not the tensor given to pack: autograd and your "
                 "cache keep the copy alive, so the entry outlives t, and a new tensor that gets t's id gets its "
                 "copy. Finalize t: weakref.finalize(t, ...)")


def _unpack_twice(pack: Callable, unpack: Callable) -> Outcome | None:
    """Two backward passes through one graph (``retain_graph=True``) unpack every saved tensor twice: both must
    give the same gradients, and once the graph is freed, the allocator must hold nothing more than before."""
    model, (x, y) = _model(), _batch(64)
    params = list(model.parameters())

    def two_backwards():
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            loss = F.cross_entropy(model(x), y)
        first = torch.autograd.grad(loss, params, retain_graph=True)
        second = torch.autograd.grad(loss, params)
        return [torch.allclose(a, b) for a, b in zip(first, second, strict=True)]

    try:
        held, same = _net_allocated(two_backwards)
    except Exception as error:  # a popped entry: KeyError, IndexError, ...
        return Outcome(False, f"a second backward through the same graph (retain_graph=True) unpacks each saved "
                              f"tensor again, and your unpack raised {type(error).__name__}: unpack may run more than "
                              "once, so it must leave what pack kept in place (the graph frees it when it is freed)")
    if not all(same):
        return Outcome(False, "a second backward through the same graph (retain_graph=True) gave other gradients: "
                              "unpack may run more than once and must give back the same tensor each time")
    gc.collect()
    if held > 2**16:
        return Outcome(False, f"after backward, with the graph freed, {held / 1e6:.2f} MB that pack allocated are "
                              "still held: what pack keeps must live only as long as the graph does. Return the "
                              "copy from pack, and keep nothing in a dict once its tensor is freed")
    return None


@exercise("07.5", "compress what autograd saves")
def _check_compress(answer) -> Outcome:
    if not (isinstance(answer, tuple) and len(answer) == 2 and all(callable(f) for f in answer)):
        return Outcome(False, f"pass the pair of functions (pack, unpack), got {kind_of(answer)}")
    pack, unpack = answer
    probe = torch.randn(64, 64)
    kept = _tensors_in(pack(probe))
    if not kept:
        return Outcome(False, "pack must return the tensor it keeps (alone, or in a tuple or dict with its dtype): "
                              "the byte counter finds tensors in those, and cannot look inside a function")
    if any(t.dtype == torch.float16 for t in kept):
        return Outcome(False, "pack keeps float16, which overflows above 65504 (guide G1, 'Saved tensors in 16 bits'): "
                              "store float tensors as bfloat16, which has float32's range")
    probes = ((torch.randn(3, 4), "a float32 tensor"), (torch.tensor([[3, 70000]]), "max-pooling's int64 indices"),
              (torch.randn(3, 4, dtype=torch.float64), "a float64 tensor"))
    for t, what in probes:
        back = unpack(pack(t))
        if not isinstance(back, torch.Tensor) or back.dtype != t.dtype:
            keep = " (keep tensors that are not floating point as they are)" if t.dtype == torch.int64 else ""
            got = back.dtype if isinstance(back, torch.Tensor) else kind_of(back)
            return Outcome(False, f"unpack(pack(t)) for {what} gives {got}, "
                                  f"not {t.dtype}: unpack must give back the dtype that was packed{keep}"
                                  + (" (keep the dtype with the copy)" if t.dtype == torch.float64 else ""))
        if t.dtype == torch.int64 and not torch.equal(back, t):
            return Outcome(False, "max-pooling saves its indices as int64, and bfloat16 cannot hold 70000 exactly: "
                                  "keep tensors that are not floating point as they are")
    stored = sum(t.untyped_storage().nbytes() for t in kept)
    if stored > probe.untyped_storage().nbytes() / 2:
        return Outcome(False, f"pack keeps a float32 tensor of {probe.untyped_storage().nbytes()} bytes in {stored} "
                              "bytes: store float tensors as bfloat16 (2 bytes a number)")
    model, data = _model(), _batch(5 * 256)
    params = {id(p) for p in model.parameters()}
    earlier: list = []  # (step, weakref) of each tensor pack kept in an earlier step
    for step in range(5):  # five steps on five batches, the weights changing in between
        x, y = data[0][step * 256:(step + 1) * 256], data[1][step * 256:(step + 1) * 256]
        model.zero_grad()
        _loss_with_temporaries(model, x, y).backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        kept, reused, given = [], set(), []  # given: (what pack returned, the tensor it was for), weakly
        elsewhere = []  # a weakref.finalize that pack registered on another object than the tensor given to it
        shared = {t.untyped_storage().data_ptr() for t in (x, y, *model.parameters())}  # not pack's to free

        def watched(t, kept=kept, reused=reused, shared=shared, earlier=earlier, given=given, elsewhere=elsewhere):
            before = set(weakref.finalize._registry)
            packed = pack(t)
            for new in set(weakref.finalize._registry) - before:
                watched_object = (new.peek() or (t,))[0]
                if watched_object is not t:
                    elsewhere.append(type(watched_object).__name__)
            for k in _tensors_in(packed):
                if any(ref() is k for _, ref in earlier) or any(kr() is k and tr() is not t for kr, tr in given):
                    reused.add("weight" if id(t) in params else "activation")
                if k.untyped_storage().data_ptr() not in shared:
                    kept.append((weakref.ref(k), weakref.ref(t)))
                    given.append((weakref.ref(k), weakref.ref(t)))
            return packed

        try:
            with torch.autograd.graph.saved_tensors_hooks(watched, unpack):
                loss = _loss_with_temporaries(model, x, y)
            loss.backward()
        except RuntimeError as error:
            first = (str(error).splitlines() or [""])[0][:100]
            return Outcome(False, f"backward raised RuntimeError ({first}): unpack gave back another tensor than the "
                                  f"one packed. {_FORGET if not elsewhere else _WRONG_TARGET}")
        del loss
        gc.collect()
        # a packed copy still alive after backward, of a tensor that is gone (the batch's input lives on: its copy
        # may stay with it)
        alive = [ref() for ref, source in kept if ref() is not None and source() is None]
        leak = (f"; and your cache keeps packed tensors after backward ({len(alive)} of them after step {step + 1}, "
                "their tensors freed): forget each one when its tensor is freed (weakref.finalize)") if alive else ""
        for (name, p), w in zip(model.named_parameters(), want, strict=True):
            if p.grad is None or p.grad.dtype != w.dtype:
                return Outcome(False, f"{name}'s gradient came back as {None if p.grad is None else p.grad.dtype}: "
                                      "unpack must give back the dtype that was packed")
            err = ((p.grad - w).norm() / w.norm()).item()
            if err > 0.02:
                why = ""
                if "weight" in reused:
                    why = (": pack gave back its copy of a weight from an earlier pass, after the weights changed; "
                           "remember only tensors computed in forward (t.grad_fn is not None)")
                elif "activation" in reused:
                    why = (": a reused address/id handed back an old activation (pack gave a new tensor what it "
                           "kept for an earlier one, since freed: a freed tensor's address, like its id, is reused). "
                           + (_WRONG_TARGET if elsewhere else _FORGET))
                return Outcome(False, f"at step {step + 1} of 5, {name}'s gradient is {err:.1%} off, more than "
                                      f"bfloat16's rounding{why}{leak}")
        earlier += [(step, ref) for ref, _ in kept]
        with torch.no_grad():  # a large step, so that a stale copy of a weight shows
            for p in model.parameters():
                p.mul_(-1)
    if leak:
        return Outcome(False, "gradients right, but your cache keeps packed tensors after backward "
                              f"({len(alive)} of them after step 5, their tensors freed), so memory grows every step: "
                              "forget each one when its tensor is freed (weakref.finalize)")
    twice = _unpack_twice(pack, unpack)
    if twice is not None:
        return twice
    kept_bytes = saved_bytes(pack, unpack)
    return Outcome(True, f"gradients within this check's tolerance, 2 %, of the plain ones; {kept_bytes / 1e6:.2f} MB "
                         f"kept instead of {saved_bytes() / 1e6:.2f} MB")


@exercise("07.6", "fuse the SGD step into backward")
def _check_fuse(answer) -> Outcome:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`fuse_sgd`), not {kind_of(answer)}")
    torch.manual_seed(0)
    ours, theirs = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)), None
    theirs = copy.deepcopy(ours)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    handles = answer(ours, 0.1)
    if not isinstance(handles, list | tuple) or not handles:
        from ..audit import clear_hooks

        clear_hooks(ours)
        return Outcome(False, f"fuse_sgd must return the list of handles, got {kind_of(handles)}")
    opt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    try:
        for _ in range(3):
            (ours(x) - y).square().mean().backward()
            opt.zero_grad()
            (theirs(x) - y).square().mean().backward()
            opt.step()
            left = [name for name, p in ours.named_parameters() if p.grad is not None]
            if left:
                return Outcome(False, f"after backward, {left[0]}.grad is still there: set p.grad = None in the hook, "
                                      "or the gradients' memory is not saved")
    except RuntimeError as error:
        if "leaf Variable that requires grad" in str(error):
            return Outcome(False, "an in-place update of a parameter must run under torch.no_grad()")
        raise
    finally:
        for handle in handles:
            handle.remove()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        if not torch.allclose(a, b, atol=1e-6):
            return Outcome(False, f"after 3 steps {name} differs from torch.optim.SGD's by "
                                  f"{(a - b).abs().max().item():.1e}: the step is p -= lr * p.grad")
    mine, worked = allocator_peak(answer), allocator_peak(fuse_sgd)
    if mine > worked + 2**20:  # a quarter of one 4 MB gradient of the wide layers
        return Outcome(False, "the right weights, but on the wide model (three Linear layers, two 1024 × 1024 "
                              f"weights) your step peaks at {mine / 1e6:.1f} MB against {worked / 1e6:.1f} MB: it "
                              "makes a gradient-sized temporary "
                              "(p -= lr * p.grad computes lr * p.grad first). Update in place: "
                              "p.add_(p.grad, alpha=-lr)")
    return Outcome(True, "the same weights as torch.optim.SGD after 3 steps, no gradient left after backward, and no "
                         "gradient-sized temporary")


def checkpoint_forward_runs(n: int = 256) -> dict[str, int]:
    """How many times ``features``' forward runs (counted at its first conv) in one training step (forward and
    backward) of the trained digits CNN on ``n`` digits, without and with non-reentrant activation
    checkpointing of ``features``, which recomputes its forward in backward: the recompute cost, counted
    instead of timed."""
    from torch.utils.checkpoint import checkpoint as run_checkpointed

    runs = {}
    for checkpointed in (False, True):
        model, (x, y), count = _model(), _batch(n), [0]
        # on the first conv: the recompute stops as soon as it has every saved tensor again, before the
        # Sequential returns, so a forward hook on ``features`` itself would not fire (measured)
        def tally(*args, count=count):
            count[0] += 1

        handle = model.features[0].register_forward_hook(tally)
        try:
            features = run_checkpointed(model.features, x, use_reentrant=False) if checkpointed else model.features(x)
            F.cross_entropy(model.head(features), y).backward()
        finally:
            handle.remove()
        runs["with checkpointing" if checkpointed else "without"] = count[0]
    return runs


@functools.cache
def _dead_outputs() -> dict[str, torch.Tensor]:
    """For each conv of the trained digits CNN, which of its output channels are 0 after the ReLU on every
    training digit: dead channels, found by lesson 05's ``hooklab.saliency.dead_channels``."""
    from ..data import digits
    from ..saliency import dead_channels as dead_after

    model, x = _model(), digits().x_train
    dead = {}
    for name, m in model.features.named_children():
        if isinstance(m, nn.Conv2d):
            mask = torch.zeros(m.out_channels, dtype=torch.bool)
            mask[dead_after(model, f"features.{int(name) + 1}", x)] = True  # the ReLU after the conv
            dead[f"features.{name}"] = mask
    return dead


def _dead_inputs(dead: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each conv's dead input channels: the previous conv's dead outputs (the first conv reads the image)."""
    names, inputs = list(dead), {}
    for i, name in enumerate(names):
        inputs[name] = dead[names[i - 1]] if i else torch.zeros(1, dtype=torch.bool)
    return inputs


def zeros_in_dead_channels() -> dict[str, str]:
    """For each conv, after half its weight is set to 0 by hand and ``FINE_TUNE_STEPS`` SGD steps: how many of
    the zeros left read a dead input channel or write a dead output channel, of all the
    zeros left ("2,063 of 2,063")."""
    from ..data import digits

    model, data = _model(), digits()
    dead = _dead_outputs()
    inputs = _dead_inputs(dead)
    convs = {name: m for name, m in model.named_modules() if isinstance(m, nn.Conv2d)}
    for conv in convs.values():
        zero_by_hand(conv, "weight", 0.5)
    for start in range(0, FINE_TUNE_STEPS * BATCH, BATCH):
        plain_step(model, data.x_train[start:start + BATCH], data.y_train[start:start + BATCH])
    counts = {}
    for name, conv in convs.items():
        zero = conv.weight.detach() == 0
        in_dead = zero & (dead[name][:, None, None, None] | inputs[name][None, :, None, None])
        counts[name] = f"{int(in_dead.sum()):,} of {int(zero.sum()):,}"
    return counts


def saved_table(n: int = 256, min_bytes: int = 10_000) -> list[str]:
    """What plain autograd keeps for backward in one forward pass of the trained digits CNN on ``n`` digits:
    one line per tensor of at least ``min_bytes`` (who made it, its shape, its size, how many times it was
    saved), found with a ``pack`` that notes each tensor and returns it unchanged; parameters (and views of
    them) left out. The last line adds up every tensor noted, each once and each save counted."""
    from ..data import digits

    data, model, saved = digits(), _model(), {}
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def note(t):
        if t.untyped_storage().data_ptr() not in parameters:  # parameters exist anyway
            saved.setdefault(id(t), [t, 0])[1] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(note, lambda t: t):
        F.cross_entropy(model(data.x_train[:n]), data.y_train[:n])
    lines = []
    for t, times in saved.values():
        if t.nbytes >= min_bytes:
            made_by = t.grad_fn.name().removesuffix("Backward0") if t.grad_fn else f"no grad_fn ({t.dtype})"
            lines.append(f"{made_by:<28}{tuple(t.shape)!s:<18}{t.nbytes / 1e6:.2f} MB, saved {times}×")
    once, each_save = (sum(t.nbytes * (times if counted else 1) for t, times in saved.values())
                       for counted in (False, True))
    small = len(saved) - len(lines)
    lines.append(f"all {len(saved)} tensors ({small} under {min_bytes // 1000} kB not listed), each counted once: "
                 f"{once:,} bytes; each save counted: {each_save:,} bytes")
    return lines

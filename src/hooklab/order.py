"""Trace the order in which every kind of forward and backward hook fires, and draw it.

Introduced in the field guide G6 (the firing-order chart), after lessons 01–03 met each hook alone:

    firings = trace_firing_order(model, x)
    print(format_order(firings))
    plot_order(firings)

Contract
--------
``trace_firing_order(model, *inputs, layers=None, loss=None)`` registers, on the chosen layers
(default: every leaf module), one hook of each kind below, runs ``model(*inputs)``, then
``loss(output).backward()`` (default ``output.sum()``), and returns one ``Firing`` per hook
call in the order PyTorch made the calls. Every hook only records; none returns a value, so
the model computes exactly what it computes without hooks. All hooks are removed when it
returns, also when the forward or backward pass raises; the parameters' ``.grad`` are put back
as they were, so tracing leaves the model untouched. Pass inputs that require grad: when no
input of a module requires grad, its full backward hook fires early, as soon as the gradient
of its output is known (PyTorch warns).

The kinds (``KINDS``), with the call that registers them:

* global forward pre-hook / forward hook: ``torch.nn.modules.module.register_module_forward_pre_hook``
  / ``register_module_forward_hook`` (fire for every module; only the chosen layers are recorded)
* forward pre-hook, and one more registered with ``prepend=True``: ``Module.register_forward_pre_hook``
* forward hook: ``Module.register_forward_hook``; from inside it, on the layer's output tensor:
  a tensor hook (``Tensor.register_hook``) and a pre-hook and a hook on the output's ``grad_fn``
  (``Node.register_prehook`` / ``Node.register_hook``)
* global backward pre-hook / backward hook: ``register_module_full_backward_pre_hook`` /
  ``register_module_full_backward_hook``
* backward pre-hook / backward hook: ``Module.register_full_backward_pre_hook`` /
  ``register_full_backward_hook``
* on every parameter of the chosen layers: a tensor hook (``Tensor.register_hook``) and a
  post-accumulate-grad hook (``Tensor.register_post_accumulate_grad_hook``); on all of them
  together, one multi-grad hook (``torch.autograd.graph.register_multi_grad_hook``)

Global backward hooks cannot be mixed with the legacy ``register_module_backward_hook`` in one
process (PyTorch raises ``RuntimeError``), and full backward hooks break on modules whose
output is modified in place (notebook 03): trace models without in-place operations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules import module as module_hooks

from .hooks import Hooks
from .layers import select_layers
from .recording import tensors_in

__all__ = ["format_order", "trace_firing_order"]

#: every kind of hook the tracer registers, in the order they first fire for one layer (the chart's
#: order; a test measures it again)
KINDS = (
    "global forward pre-hook",
    "forward pre-hook (prepend)",
    "forward pre-hook",
    "global forward hook",
    "forward hook",
    "global backward pre-hook",
    "backward pre-hook",
    "tensor hook on output",
    "Node pre-hook",
    "Node hook",
    "tensor hook on parameter",
    "multi-grad hook",
    "post-accumulate-grad hook",
    "global backward hook",
    "backward hook",
)


@dataclass(frozen=True)
class Firing:
    """One hook call: its position (from 1), ``"forward"`` or ``"backward"``, kind, and where."""

    step: int
    phase: str
    kind: str
    where: str


class _Tracer:
    """Registers one hook of every kind into ``hooks`` and notes each call as a ``Firing``."""

    def __init__(self, chosen: dict[str, nn.Module], hooks: Hooks):
        self.chosen, self.hooks = chosen, hooks
        self.names = {id(m): name for name, m in chosen.items()}
        self.firings: list[Firing] = []
        self.phase = "forward"

    def note(self, kind: str, where: str) -> None:
        self.firings.append(Firing(len(self.firings) + 1, self.phase, kind, where))

    def global_hook(self, kind: str):
        def hook(module, *args):
            if id(module) in self.names:
                self.note(kind, self.names[id(module)])

        return hook

    def on_output(self, name: str, output) -> None:
        """From inside a forward hook: a tensor hook and the two Node hooks on each output."""
        for tensor in tensors_in(output):
            if tensor.requires_grad:
                self.hooks.add(tensor.register_hook(lambda grad: self.note("tensor hook on output", name)))
                if tensor.grad_fn is not None:
                    node = tensor.grad_fn
                    self.hooks.add(node.register_prehook(lambda grad_outputs: self.note("Node pre-hook", name)))
                    self.hooks.add(node.register_hook(lambda grad_inputs, grad_outputs: self.note("Node hook", name)))

    def register_module_hooks(self) -> None:
        add, note = self.hooks.add, self.note
        add(module_hooks.register_module_forward_pre_hook(self.global_hook("global forward pre-hook")))
        add(module_hooks.register_module_forward_hook(self.global_hook("global forward hook")))
        add(module_hooks.register_module_full_backward_pre_hook(self.global_hook("global backward pre-hook")))
        add(module_hooks.register_module_full_backward_hook(self.global_hook("global backward hook")))
        for name, module in self.chosen.items():
            add(module.register_forward_pre_hook(lambda m, args, n=name: note("forward pre-hook", n)))
            add(module.register_forward_pre_hook(lambda m, args, n=name: note("forward pre-hook (prepend)", n),
                                                 prepend=True))

            def forward_hook(m, args, output, n=name):
                note("forward hook", n)
                self.on_output(n, output)

            add(module.register_forward_hook(forward_hook))
            add(module.register_full_backward_pre_hook(lambda m, go, n=name: note("backward pre-hook", n)))
            add(module.register_full_backward_hook(lambda m, gi, go, n=name: note("backward hook", n)))

    def register_parameter_hooks(self) -> None:
        parameters = []
        for name, module in self.chosen.items():
            for pname, p in module.named_parameters(recurse=False):
                if p.requires_grad:
                    where = f"{name}.{pname}" if name else pname
                    parameters.append(p)
                    self.hooks.add(p.register_hook(lambda grad, w=where: self.note("tensor hook on parameter", w)))
                    self.hooks.add(p.register_post_accumulate_grad_hook(
                        lambda t, w=where: self.note("post-accumulate-grad hook", w)))
        if parameters:
            self.hooks.add(register_multi_grad_hook(parameters, lambda grads: self.note("multi-grad hook",
                                                                                           "all parameters")))


def trace_firing_order(
    model: nn.Module,
    *inputs: torch.Tensor,
    layers: Iterable[str] | str | None = None,
    loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> list[Firing]:
    """Run one forward and one backward pass with every kind of hook on ``layers``; see module doc."""
    chosen = select_layers(model, layers)
    if not torch.is_grad_enabled():
        raise RuntimeError("trace_firing_order runs a backward pass, and gradients are disabled here "
                           "(torch.no_grad() or torch.inference_mode()): the forward pass would build no graph; "
                           "call it outside that block (or inside `with torch.enable_grad():`)")
    saved_grads = {p: p.grad for p in model.parameters()}
    for p in saved_grads:  # accumulate into fresh .grad, so the old tensors are never changed
        p.grad = None
    try:
        with Hooks() as hooks:
            tracer = _Tracer(chosen, hooks)
            tracer.register_module_hooks()
            tracer.register_parameter_hooks()
            output = model(*inputs)
            tracer.phase = "backward"
            if loss is None and not isinstance(output, torch.Tensor):
                raise TypeError(f"the model returned a {type(output).__name__}, not a tensor: pass loss=, a function "
                                "from the output to the scalar that backward() starts from")
            target = loss(output) if loss is not None else output.sum()
            if not target.requires_grad:
                raise RuntimeError("nothing to run backward through: no parameter or input of the model requires "
                                   "grad (call requires_grad_() on an input, or unfreeze a parameter)")
            target.backward()
    finally:
        for p, grad in saved_grads.items():
            p.grad = grad
    return tracer.firings


def format_order(firings: Iterable[Firing]) -> str:
    """One line per firing: step, phase, kind, where (the text the notebook checks)."""
    firings = list(firings)
    width = max((len(f.kind) for f in firings), default=4)
    return "\n".join(f"{f.step:>3}  {f.phase:<8}  {f.kind:<{width}}  {f.where}" for f in firings)


def plot_order(firings: Iterable[Firing], ax=None, title: str = "The order in which hooks fire"):
    """Draw each firing as a dot: step on x, hook kind on y, coloured by layer. Returns the figure."""
    import matplotlib.pyplot as plt

    firings = list(firings)
    if not firings:
        raise ValueError("no firings to draw: did the model run any chosen layer?")
    kinds = [k for k in KINDS if any(f.kind == k for f in firings)]
    places = list(dict.fromkeys(f.where for f in firings))
    colors = plt.get_cmap("tab10")
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.38 * len(kinds) + 1.6))
    else:
        fig = ax.figure
    row = {k: len(kinds) - 1 - i for i, k in enumerate(kinds)}
    last_forward = max((f.step for f in firings if f.phase == "forward"), default=0)
    ax.axvspan(0.5, last_forward + 0.5, color="0.93", zorder=0)
    ax.text(0.7, len(kinds) - 0.45, "forward", va="bottom", fontsize=9, color="0.35")
    ax.text(last_forward + 0.7, len(kinds) - 0.45, "backward", va="bottom", fontsize=9, color="0.35")
    for i, place in enumerate(places):
        mine = [f for f in firings if f.where == place]
        ax.scatter(
            [f.step for f in mine], [row[f.kind] for f in mine], color=colors(i % 10), s=36, label=place, zorder=3
        )
    steps = [f.step for f in firings]
    ax.plot(steps, [row[f.kind] for f in firings], color="0.6", lw=0.8, zorder=2)
    ax.set_yticks(range(len(kinds)), [k for k in reversed(kinds)], fontsize=9)
    ax.set_ylim(-0.6, len(kinds) + 0.2)
    ax.set_xlim(0.5, len(firings) + 0.5)
    ax.set_xlabel("firing step")
    ax.set_title(title)
    ax.legend(title="where", fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="x", color="0.85", lw=0.5)
    fig.tight_layout()
    return fig

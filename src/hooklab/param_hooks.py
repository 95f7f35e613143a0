"""Hooks on the parameters of a model, owned by one object (introduced in notebook 01).

``param_hooks`` registers one tensor hook per chosen parameter and removes them all when the
``with`` block ends, also when it raises:

    with param_hooks(model, lambda name, grad: grad.clamp(-1, 1)):
        loss.backward()            # every gradient is clamped before it reaches .grad

Contract
--------
* ``when="grad"`` (default): ``hook(name, grad) -> Tensor | None`` is registered with
  ``Tensor.register_hook``. It runs when the gradient for the parameter is computed, *before*
  it is added to ``.grad``. Returning a tensor replaces the gradient (that is what gets
  accumulated); returning ``None`` leaves it unchanged. Do not modify ``grad`` in place.
* ``when="accumulated"``: ``hook(name, param) -> None`` is registered with
  ``Tensor.register_post_accumulate_grad_hook``. It runs after ``param.grad`` has been
  updated and may change ``param`` or ``param.grad`` in place (an optimizer step fused into
  backward). Its return value is ignored.
* ``params``: parameter names (``"fc.bias"``) or module names (``"fc"``: all its parameters);
  default: every parameter that requires grad. An unknown name raises
  ``UnknownParameterError`` listing close matches; a frozen parameter raises ``ValueError``.
* ``grad_stats`` is the field guide's ``GradientCheck`` (G1) done right: one row of statistics (default:
  mean and norm) per gradient, in the order the gradients arrive, handles owned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .hooks import Hooks
from .layers import unknown_name_hint

__all__ = ["UnknownParameterError", "grad_stats", "param_hooks"]


class UnknownParameterError(LookupError):
    """A name that is neither a parameter nor a module of the model; lists the close matches."""

    def __init__(self, name: str, model: nn.Module, names: list[str]):
        hint = unknown_name_hint(name, names, kind="parameters and modules")
        super().__init__(f"{type(model).__name__} has no parameter or module named {name!r}; {hint}")

    def __str__(self) -> str:
        return self.args[0]


def select_parameters(model: nn.Module, params: Iterable[str] | str | None = None) -> dict[str, nn.Parameter]:
    """``{name: parameter}`` for parameter or module names (see the module docstring)."""
    named = dict(model.named_parameters())
    if params is None:
        return {n: p for n, p in named.items() if p.requires_grad}
    if isinstance(params, str):
        params = [params]
    modules = dict(model.named_modules())
    chosen: dict[str, nn.Parameter] = {}
    for name in params:
        if name in named:
            chosen[name] = named[name]
        elif name in modules:
            prefix = f"{name}." if name else ""
            chosen.update((prefix + n, p) for n, p in modules[name].named_parameters())
        else:
            raise UnknownParameterError(name, model, list(named) + [n for n in modules if n])
    frozen = [n for n, p in chosen.items() if not p.requires_grad]
    if frozen:
        raise ValueError(f"parameters that do not require grad never get a gradient hook call: {frozen}")
    return chosen


class ParamHooks:
    """One hook per chosen parameter; ``with`` (or ``register()`` / ``remove()``) owns the handles."""

    def __init__(self, model: nn.Module, hook: Callable, params=None, when: str = "grad"):
        if when not in ("grad", "accumulated"):
            raise ValueError(f"when must be 'grad' or 'accumulated', not {when!r}")
        if not callable(hook):
            raise TypeError(f"hook must be a function called as hook(name, grad), not {type(hook).__name__}")
        self.model = model
        self.hook = hook
        self.when = when
        self.params = select_parameters(model, params)
        self.hooks = Hooks()

    @property
    def names(self) -> list[str]:
        return list(self.params)

    def register(self) -> ParamHooks:
        if self.hooks:
            raise RuntimeError("hooks are already registered; remove() them first")
        try:
            for name, p in self.params.items():
                if self.when == "grad":
                    self.hooks.add(p.register_hook(_bind(self.hook, name)))
                else:
                    self.hooks.add(p.register_post_accumulate_grad_hook(_bind_accumulated(self.hook, name)))
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Remove every hook (safe to call twice)."""
        self.hooks.remove()

    def __enter__(self) -> ParamHooks:
        return self.register()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.remove()


def _bind(hook: Callable, name: str) -> Callable:
    # a function per parameter, so each hook knows its name (no late-binding closure bug)
    def bound(grad):
        new = hook(name, grad)
        if new is not None and not (isinstance(new, torch.Tensor) and new.shape == grad.shape):
            got = f"shape {tuple(new.shape)}" if isinstance(new, torch.Tensor) else type(new).__name__
            raise TypeError(f"the hook for parameter {name!r} returned {got}; return None or a tensor of the "
                            f"gradient's shape {tuple(grad.shape)}")
        return new

    return bound


def _bind_accumulated(hook: Callable, name: str) -> Callable:
    def bound(param):
        hook(name, param)  # its return value is ignored, as documented

    return bound


def param_hooks(model: nn.Module, hook: Callable, params=None, *, when: str = "grad") -> ParamHooks:
    """Hooks on the chosen parameters of ``model`` while a ``with`` block runs (see module doc)."""
    return ParamHooks(model, hook, params, when)


@dataclass(frozen=True)
class GradRow:
    """Statistics of one gradient: parameter name, how many gradients it had before, values."""

    name: str
    call: int
    values: dict[str, float]


def _mean(grad: torch.Tensor) -> float:
    return grad.mean().item()


def _norm(grad: torch.Tensor) -> float:
    return grad.norm().item()


class GradStats(ParamHooks):
    """Rows of gradient statistics, one per parameter per backward, in arrival order."""

    def __init__(self, model: nn.Module, params=None, stats: Mapping[str, Callable] | None = None):
        super().__init__(model, self._keep, params)
        self.stats = dict(stats) if stats is not None else {"mean": _mean, "norm": _norm}
        self.rows: list[GradRow] = []
        self._calls: dict[str, int] = {}

    def _keep(self, name: str, grad: torch.Tensor) -> None:
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        self.rows.append(GradRow(name, call, {k: float(f(grad.detach())) for k, f in self.stats.items()}))

    def clear(self) -> None:
        self.rows.clear()
        self._calls.clear()

    def table(self, rows: Iterable[GradRow] | None = None) -> str:
        """The rows (default: all) as aligned text, one line per gradient, values as ``+1.2345e-03``."""
        rows = list(self.rows if rows is None else rows)
        width = max((len(r.name) for r in rows), default=9)
        lines = [f"{'parameter':<{width}}  " + "  ".join(f"{k:>11}" for k in self.stats)]
        for r in rows:
            lines.append(f"{r.name:<{width}}  " + "  ".join(f"{r.values[k]:+11.4e}" for k in self.stats))
        return "\n".join(lines)


def grad_stats(model: nn.Module, params=None, stats: Mapping[str, Callable] | None = None) -> GradStats:
    """Record statistics of every gradient of the chosen parameters while a ``with`` block runs.

    ``stats`` maps a column name to ``f(grad) -> float``; default ``mean`` and ``norm``.
    """
    return GradStats(model, params, stats)

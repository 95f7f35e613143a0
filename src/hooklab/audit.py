"""Find hooks that were left behind: on modules, and in PyTorch's global hook registries.

The course's rule is that whatever registers a hook removes it. ``leftover_hooks`` is how the
tests (after every test) and the notebooks (at the end of a section) check that rule.
Introduced in notebook 00.
"""

from __future__ import annotations

import gc

import torch
from torch import nn
from torch.nn.modules import module as module_mod
from torch.optim import optimizer as optimizer_mod

__all__ = [
    "MODULE_HOOK_DICTS",
    "clear_global_hooks",
    "clear_hooks",
    "global_hooks",
    "leftover_hooks",
    "live_modules",
]

#: the per-module dictionaries that nn.Module keeps its hooks in
MODULE_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_state_dict_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)

_GLOBAL_DICTS = {
    module_mod: (
        "_global_forward_pre_hooks",
        "_global_forward_hooks",
        "_global_backward_pre_hooks",
        "_global_backward_hooks",
        "_global_module_registration_hooks",
        "_global_parameter_registration_hooks",
        "_global_buffer_registration_hooks",
    ),
    optimizer_mod: ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"),
}


def _registries():
    for owner, names in _GLOBAL_DICTS.items():
        for name in names:
            hooks = getattr(owner, name, None)
            if hooks is not None:
                yield f"{owner.__name__}.{name}", hooks


def _saved_tensors_hooks():
    """The innermost active ``torch.autograd.graph.saved_tensors_hooks`` pair, or None."""
    return torch._C._autograd._top_saved_tensors_default_hooks(True)


def global_hooks() -> list[str]:
    """What is active process-wide, as ``'name: count'`` lines: the non-empty global hook
    registries of torch, default saved-tensor hooks, and torch function modes."""
    found = [f"{label}: {len(hooks)}" for label, hooks in _registries() if hooks]
    if _saved_tensors_hooks() is not None:
        found.append("torch.autograd.graph.saved_tensors_hooks: active")
    if torch._C._len_torch_function_stack():
        found.append(f"torch function modes: {torch._C._len_torch_function_stack()}")
    return found


def clear_global_hooks() -> list[str]:
    """Remove everything ``global_hooks()`` reports: global hooks, saved-tensor hooks pairs never
    exited, torch function modes never exited. The way out when a global hook's handle is lost
    (restarting the kernel does the same); the exercise checks also call it after each answer.
    Returns what was removed (an empty list: nothing)."""
    removed = []
    for label, hooks in _registries():
        if hooks:
            removed.append(f"{label}: {len(hooks)}")
            hooks.clear()
    popped = 0
    while _saved_tensors_hooks() is not None:
        torch._C._autograd._pop_saved_tensors_default_hooks()
        popped += 1
    if popped:
        removed.append(f"torch.autograd.graph.saved_tensors_hooks: {popped} never exited")
    modes = torch._C._len_torch_function_stack()
    for _ in range(modes):
        torch._C._pop_torch_function_stack()
    if modes:
        removed.append(f"torch function modes: {modes} never exited (a `with` block entered by hand?)")
    return removed


def live_modules() -> list[nn.Module]:
    """Every ``nn.Module`` alive in this process (slow-ish: walks the garbage collector)."""
    # type() rather than isinstance(): isinstance reads obj.__class__, which wakes lazy proxies
    return [obj for obj in gc.get_objects() if issubclass(type(obj), nn.Module)]


def leftover_hooks(*modules: nn.Module) -> list[str]:
    """Describe every hook still registered on ``modules`` (and their submodules), plus globals.

    With no argument, every live module is checked. An empty list means nothing was left.
    """
    for module in modules:
        if not isinstance(module, nn.Module):
            raise TypeError(f"leftover_hooks looks at nn.Module objects, not {type(module).__name__}")
    targets = modules or tuple(live_modules())
    found = []
    seen: set[int] = set()
    for top in targets:
        for name, m in top.named_modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            for attr in MODULE_HOOK_DICTS:
                hooks = getattr(m, attr, None)
                if hooks:
                    where = f"{type(top).__name__}.{name}" if name else type(top).__name__
                    found.append(f"{where}: {len(hooks)} in {attr}")
    return found + global_hooks() + _parameter_hooks(targets)


def _parameter_hooks(modules) -> list[str]:
    """Tensor hooks (``register_hook``, ``register_post_accumulate_grad_hook``) on parameters."""
    found = []
    seen: set[int] = set()  # a parameter is reached from every live module above it: report it once
    for top in modules:
        for name, p in top.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            hooks = getattr(p, "_backward_hooks", None)
            post = getattr(p, "_post_accumulate_grad_hooks", None)
            n = len(hooks or {}) + len(post or {})
            if n:
                found.append(f"{type(top).__name__} parameter {name}: {n} tensor hook(s)")
    return found


#: bookkeeping dictionaries beside the hook dictionaries, keyed by the same handle ids
_SIDE_DICTS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def clear_hooks(*modules: nn.Module) -> list[str]:
    """What ``leftover_hooks(*modules)`` reports; then every module hook on them and their
    submodules is dropped. Exercise checkers call it on their own models, so that a student's
    forgotten hook never stays behind (parameter and global hooks are only reported)."""
    left = leftover_hooks(*modules)
    for top in modules:
        for m in top.modules():
            for attr in MODULE_HOOK_DICTS + _SIDE_DICTS:
                hooks = getattr(m, attr, None)
                if hooks:
                    hooks.clear()
    return left

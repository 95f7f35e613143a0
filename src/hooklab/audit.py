"""Find hooks that were left behind: on modules, and in PyTorch's global hook registries.

The course's rule is that whatever registers a hook removes it. ``leftover_hooks`` is how the
tests (after every test) and the notebooks (at the end of a section) check that rule.
Introduced in notebook 00.
"""

from __future__ import annotations

import gc

from torch import nn
from torch.nn.modules import module as module_mod
from torch.optim import optimizer as optimizer_mod

__all__ = ["MODULE_HOOK_DICTS", "clear_hooks", "global_hooks", "leftover_hooks", "live_modules"]

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


def global_hooks() -> list[str]:
    """The global hook registries of torch that are not empty, as ``'name: count'`` lines."""
    found = []
    for owner, names in _GLOBAL_DICTS.items():
        for name in names:
            hooks = getattr(owner, name, None)
            if hooks:
                found.append(f"{owner.__name__}.{name}: {len(hooks)}")
    return found


def live_modules() -> list[nn.Module]:
    """Every ``nn.Module`` alive in this process (slow-ish: walks the garbage collector)."""
    # type() rather than isinstance(): isinstance reads obj.__class__, which wakes lazy proxies
    return [obj for obj in gc.get_objects() if issubclass(type(obj), nn.Module)]


def leftover_hooks(*modules: nn.Module) -> list[str]:
    """Describe every hook still registered on ``modules`` (and their submodules), plus globals.

    With no argument, every live module is checked. An empty list means nothing was left.
    """
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

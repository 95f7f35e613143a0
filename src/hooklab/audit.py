"""Find hooks that were left behind: on modules, and in PyTorch's global hook registries.

The course's rule is that whatever registers a hook removes it. ``leftover_hooks`` is how the
tests (after every test) and the notebooks (at the end of a section) check that rule.
Introduced in notebook 00. PyTorch has no public way to list hooks: what this module reads is
in ``hooklab.pytorch_internals``.
"""

from __future__ import annotations

import gc

from torch import nn

from . import pytorch_internals as internals

__all__ = ["clear_global_hooks", "global_hooks", "leftover_hooks"]


def global_hooks() -> list[str]:
    """What is active process-wide, one line each, in words: global hooks of ``torch.nn`` and
    ``torch.optim`` (with the function that registered them), saved-tensor hooks, torch function modes."""
    found = [f"{_count(len(hooks), what)} still registered ({register})"
             for what, register, hooks in internals.global_registries() if hooks]  # fmt: skip
    if internals.saved_tensors_hooks_active():
        found.append("saved-tensor hooks are active (torch.autograd.graph.saved_tensors_hooks)")
    if internals.torch_function_modes():
        found.append(f"{_count(internals.torch_function_modes(), 'torch function mode')} active")
    return found


def _count(n: int, what: str) -> str:
    """``a forward hook is`` / ``2 forward hooks are``."""
    if n == 1:
        return f"{'an' if what[0] in 'aeiou' else 'a'} {what} is"
    return f"{n} {what}s are"


def clear_global_hooks() -> list[str]:
    """Remove everything ``global_hooks()`` reports: global hooks, saved-tensor hooks pairs never
    exited, torch function modes never exited. The way out when a global hook's handle is lost
    (restarting the kernel does the same); the exercise checks also call it after each answer.
    Returns what was removed (an empty list: nothing)."""
    removed = []
    for what, register, hooks in internals.global_registries():
        if hooks:
            removed.append(f"{_count(len(hooks), what).rsplit(' ', 1)[0]} ({register})")
            hooks.clear()
    popped = 0
    while internals.saved_tensors_hooks_active():
        internals.pop_saved_tensors_hooks()
        popped += 1
    if popped:
        removed.append(f"saved-tensor hooks never exited: {popped} (torch.autograd.graph.saved_tensors_hooks)")
    modes = internals.pop_torch_function_modes()
    if modes:
        removed.append(f"torch function modes never exited: {modes} (a `with` block entered by hand?)")
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
            for attr in internals.MODULE_HOOK_DICTS:
                hooks = internals.module_hooks(m, attr)
                if hooks:
                    where = f"layer '{name}' of the {type(top).__name__}" if name else f"the {type(top).__name__}"
                    found.append(f"{_count(len(hooks), _HOOK_WORDS[attr])} still registered on {where}")
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
            n = internals.parameter_hook_count(p)
            if n:
                found.append(f"{_count(n, 'tensor hook')} still registered on parameter '{name}' of the "
                             f"{type(top).__name__}")
    return found


_HOOK_WORDS = {
    "_forward_pre_hooks": "forward pre-hook",
    "_forward_hooks": "forward hook",
    "_backward_pre_hooks": "backward pre-hook",
    "_backward_hooks": "backward hook",
    "_state_dict_pre_hooks": "state-dict pre-hook",
    "_state_dict_hooks": "state-dict hook",
    "_load_state_dict_pre_hooks": "load-state-dict pre-hook",
    "_load_state_dict_post_hooks": "load-state-dict post-hook",
}


def clear_hooks(*modules: nn.Module) -> list[str]:
    """What ``leftover_hooks(*modules)`` reports; then every module hook on them and their
    submodules is dropped. Exercise checkers call it on their own models, so that a student's
    forgotten hook never stays behind (parameter and global hooks are only reported)."""
    left = leftover_hooks(*modules)
    for top in modules:
        for m in top.modules():
            for attr in internals.MODULE_HOOK_DICTS + internals.SIDE_DICTS:
                internals.module_hooks(m, attr).clear()
    return left

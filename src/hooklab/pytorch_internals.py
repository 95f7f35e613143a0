"""Everything hooklab reads from PyTorch's private API, in one place.

PyTorch has no public way to list the hooks registered on a module, a parameter or a process, to
read a tensor's version counter, or to see which function transforms are running. hooklab needs
these for its audit (``hooklab.audit``: hooks left behind), for the exercise checks (which hooks a
student's answer registered) and for the recorder (a record shares one copy of a tensor while no
in-place write changed it). Nothing else in hooklab touches a private name, and
``tests/test_pytorch_internals.py`` pins every one used here: if a PyTorch upgrade moves one, that
test says which. Internal to hooklab: nothing here is part of its API.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as module_globals
from torch.optim import optimizer as optimizer_globals
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401  (the base class of a dispatch-level mode)

#: the per-module dictionaries that nn.Module keeps its hooks in (keyed by each handle's ``id``)
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
#: bookkeeping beside them, keyed by the same ids (which forward hooks take kwargs, run always)
SIDE_DICTS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")

_GLOBAL_DICTS = {
    module_globals: (
        "_global_forward_pre_hooks",
        "_global_forward_hooks",
        "_global_backward_pre_hooks",
        "_global_backward_hooks",
        "_global_module_registration_hooks",
        "_global_parameter_registration_hooks",
        "_global_buffer_registration_hooks",
    ),
    optimizer_globals: ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"),
}


def module_hooks(module: nn.Module, kind: str) -> dict:
    """The hook dictionary ``kind`` (one of ``MODULE_HOOK_DICTS`` or ``SIDE_DICTS``) of ``module``."""
    return getattr(module, kind, None) or {}


def hook_dict_alive(handle) -> bool:
    """Whether the dictionary a ``RemovableHandle`` removes its hook from still exists (a tensor hook's
    dictionary goes with its tensor, once backward has freed it)."""
    return handle.hooks_dict_ref() is not None


def parameter_hook_count(p: torch.Tensor) -> int:
    """Tensor hooks (``register_hook``, ``register_post_accumulate_grad_hook``) on a tensor."""
    return len(getattr(p, "_backward_hooks", None) or {}) + len(getattr(p, "_post_accumulate_grad_hooks", None) or {})


def global_registries():
    """``(what, register, dict)`` for each process-wide hook registry of ``torch.nn`` and
    ``torch.optim``: what its hooks are in words, the public function that registers them, and the
    registry itself."""
    for owner, names in _GLOBAL_DICTS.items():
        for name in names:
            hooks = getattr(owner, name, None)
            if hooks is not None:
                what, register = _GLOBAL_WORDS[name]
                yield what, f"{owner.__name__}.{register}", hooks


_GLOBAL_WORDS = {
    "_global_forward_pre_hooks": ("global forward pre-hook", "register_module_forward_pre_hook"),
    "_global_forward_hooks": ("global forward hook", "register_module_forward_hook"),
    "_global_backward_pre_hooks": ("global backward pre-hook", "register_module_full_backward_pre_hook"),
    "_global_backward_hooks": ("global backward hook", "register_module_full_backward_hook"),
    "_global_module_registration_hooks": ("module registration hook", "register_module_module_registration_hook"),
    "_global_parameter_registration_hooks": ("parameter registration hook",
                                             "register_module_parameter_registration_hook"),
    "_global_buffer_registration_hooks": ("buffer registration hook", "register_module_buffer_registration_hook"),
    "_global_optimizer_pre_hooks": ("global optimizer step pre-hook", "register_optimizer_step_pre_hook"),
    "_global_optimizer_post_hooks": ("global optimizer step post-hook", "register_optimizer_step_post_hook"),
}


def saved_tensors_hooks_active() -> bool:
    """Whether a ``torch.autograd.graph.saved_tensors_hooks`` pair is active now."""
    return torch._C._autograd._top_saved_tensors_default_hooks(True) is not None


def pop_saved_tensors_hooks() -> None:
    torch._C._autograd._pop_saved_tensors_default_hooks()


def torch_function_modes() -> int:
    """How many torch function modes (``TorchFunctionMode``) are active."""
    return torch._C._len_torch_function_stack()


def pop_torch_function_modes() -> int:
    """Leave every active torch function mode; returns how many there were."""
    count = torch._C._len_torch_function_stack()
    for _ in range(count):
        torch._C._pop_torch_function_stack()
    return count


def version(t: torch.Tensor) -> int | None:
    """The tensor's version counter: PyTorch adds one on every in-place write (``None`` for tensors
    made under ``torch.inference_mode()``, which have none)."""
    return None if t.is_inference() else t._version


def differentiating() -> str | None:
    """What differentiates the operator running now without a backward op: forward-mode AD
    (``torch.autograd.forward_ad``) or a ``torch.func`` transform (``jvp``, ``jacfwd``, ``grad``)."""
    if torch.autograd.forward_ad._current_level >= 0:
        return "forward-mode autograd (torch.autograd.forward_ad)"
    interpreter = torch._C._functorch.peek_interpreter_stack()
    kinds = torch._C._functorch.TransformType
    if interpreter is not None and interpreter.key() in (kinds.Grad, kinds.Jvp):
        return f"torch.func ({interpreter.key().name.lower()} transform)"
    return None

"""``Hooks``: the one owner of hook handles in hooklab.

Every ``register_*`` method of PyTorch returns a ``RemovableHandle``; whatever registers a hook
must remove it, also when the code in between raises. Each tool of hooklab puts its handles into
a ``Hooks`` and removes them all in one place (``remove()``, or the end of a ``with`` block):

    with Hooks() as hooks:
        hooks.add(model.fc.register_forward_hook(show))
        hooks.add(x.register_hook(print))
        model(x).sum().backward()
    # every hook is gone here, whatever happened inside

It is fast.ai's ``Hooks`` and ``contextlib.ExitStack`` cut down to what a handle needs.
"""

from __future__ import annotations

__all__ = ["Hooks"]


class Hooks:
    """Owns hook handles: ``add`` keeps one, ``remove`` (or leaving the ``with`` block) removes all."""

    def __init__(self) -> None:
        self.handles: list = []

    def add(self, handle):
        """Keep ``handle`` (anything with a ``remove()`` method) and return it."""
        self.handles.append(handle)
        return handle

    def remove(self) -> None:
        """Remove every hook, the last registered first; safe to call twice."""
        while self.handles:
            self.handles.pop().remove()

    def drop_gone(self) -> None:
        """Forget the handles whose hooks went with their tensor (nothing is left to remove), so that
        a long-lived owner of tensor hooks does not grow with every step."""
        from .pytorch_internals import hook_dict_alive

        self.handles = [h for h in self.handles if hook_dict_alive(h)]

    def __len__(self) -> int:
        return len(self.handles)

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *exc) -> None:  # never swallows the exception
        self.remove()

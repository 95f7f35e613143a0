"""What the exercise tests build their answers from (not a test module)."""

from __future__ import annotations

from collections.abc import Callable


def run_then_remove(run: Callable[[], object], handles: list, in_finally: bool = True) -> None:
    """Call ``run()``, then remove every handle of ``handles``: in a ``finally`` block, as a right
    answer does, or (``in_finally=False``) only when ``run()`` returns, the bug that leaves the
    hooks on the model when the forward pass raises."""
    if in_finally:
        try:
            run()
        finally:
            for handle in handles:
                handle.remove()
    else:
        run()
        for handle in handles:
            handle.remove()

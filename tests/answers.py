"""What the exercise tests share (not a test module): the answers they build, and how they assert
that a checker rejects a wrong one."""

from __future__ import annotations

from collections.abc import Callable

from hooklab.exercises import Outcome, grade


def failed(id: str, answer: object, *words: str) -> Outcome:
    """Grade ``answer`` for exercise ``id``, assert that it failed with each of ``words`` in the detail
    (the message names the answer and gives the detail), and return the outcome for more asserts."""
    outcome = grade(id, answer)
    name = getattr(answer, "__name__", answer)
    assert not outcome.passed, f"{name} passed: {outcome.detail}"
    for word in words:
        assert word in outcome.detail, f"{name}: {word!r} not in {outcome.detail!r}"
    return outcome


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

"""The patching explorer of notebook 08: pick a hook point and a position, see what patching does.

``PatchingExplorer(model, clean, corrupted, query, answer, wrong)`` runs the clean sequence once and keeps
each hook point's output (``hooklab.record``). ``patched(point, position)`` runs the corrupted sequence
with a forward hook that puts the clean value back at that one position, and returns the logit
difference logit[answer] − logit[wrong] at ``query``; ``summary`` is that as text, and ``picture`` draws
layer 1's attention patterns of the patched run (one map per head, the query's row framed in red, the
patched position's column marked by a cyan line).
``widget()`` shows both, with the controls "point" and "position", in a ``hooklab.widgets.Panel``.
"""

from __future__ import annotations

import torch
from torch import nn

from .picture import Canvas, colours
from .recording import record
from .widgets import Panel

__all__ = ["PatchingExplorer"]

POINTS = ["hook_embed", "blocks.0.hook_attn_out", "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post",
          "blocks.1.hook_attn_out", "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"]


class PatchingExplorer:
    def __init__(self, model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor, query: int, answer: int,
                 wrong: int, points: list[str] | None = None) -> None:
        self.model, self.clean, self.corrupted = model, clean, corrupted
        self.query, self.answer, self.wrong = query, answer, wrong
        self.points = list(points or POINTS)
        with record(model, self.points) as rec, torch.no_grad():
            model(clean)
        self.cache = {point: rec[point].output for point in self.points}
        self._runs: dict = {}  # (point, position) -> (logit difference, pattern), each run once

    def _run(self, point: str, position: int) -> tuple[float, torch.Tensor]:
        if (point, position) not in self._runs:
            self._runs[point, position] = self._patch(point, position)
        return self._runs[point, position]

    def _patch(self, point: str, position: int) -> tuple[float, torch.Tensor]:
        clean = self.cache[point]

        def patch(module, args, output):
            output = output.clone()
            output[:, position] = clean[:, position]
            return output

        kept = []
        handles = [self.model.get_submodule(point).register_forward_hook(patch),
                   self.model.blocks[-1].attn.hook_pattern.register_forward_hook(
                       lambda module, args, output: kept.append(output[0].detach().clone()))]
        try:
            with torch.no_grad():
                logits = self.model(self.corrupted)
        finally:
            for handle in handles:
                handle.remove()
        return (logits[0, self.query, self.answer] - logits[0, self.query, self.wrong]).item(), kept[-1]

    def patched(self, point: str, position: int) -> float:
        """The corrupted run's logit difference with the clean ``point`` at ``position``."""
        return self._run(point, position)[0]

    def summary(self, point: str, position: int) -> str:
        diff = self.patched(point, position)
        return (f"clean {point} patched in at position {position}: logit[{self.answer}] − logit[{self.wrong}] "
                f"at position {self.query} = {diff:+.1f} ({'clean' if diff > 0 else 'corrupted'} answer wins)")

    def picture(self, point: str, position: int) -> bytes:
        """PNG: the last layer's attention pattern of the patched run, one map per head (drawn straight to
        PNG by ``hooklab.picture``: a few milliseconds)."""
        pattern = self._run(point, position)[1]
        heads, t, cell, gap = pattern.shape[0], self.query + 1, 16, 14
        side = t * cell
        canvas = Canvas(heads * (side + gap), side + 24)
        last = len(self.model.blocks) - 1
        for h in range(heads):
            x = h * (side + gap)
            canvas.text(x, 2, f"layer {last}, head {h}")
            canvas.paste(colours(pattern[h, :t, :t], "viridis", 0.0, 1.0), x, 20, (side, side))
            canvas.frame((x, 20 + self.query * cell, x + side - 1, 20 + side - 1))
            column = x + position * cell + cell // 2
            canvas.line([(column, 20), (column, 20 + side - 1)], width=1)
        return canvas.png().png

    def widget(self, point: str | None = None, position: int = 3) -> Panel:
        from ipywidgets import Dropdown, IntSlider

        controls = {"point": Dropdown(options=self.points, value=point or self.points[0], description="point"),
                    "position": IntSlider(position, 0, self.query, description="position")}

        def redraw(panel: Panel) -> tuple[str, bytes]:
            where = panel.point.value, panel.position.value
            return self.summary(*where), self.picture(*where)

        return Panel(list(controls.values()), controls, redraw)


"""The patching explorer of notebook 08: pick a corruption, a hook point and a position, see what patching does.

``PatchingExplorer(model, clean, corrupted, query, answer, wrong, also=[(tokens, wrong), ...])`` runs the
clean sequence once and keeps each hook point's output (``hooklab.record``). Each corruption (the first,
then those in ``also``) is named by the tokens it changes (``"19 → 17 at position 3"``).
``patched(point, position, corruption=0)`` runs that corrupted sequence with a forward hook that puts the
clean value back at that one position, and returns the logit difference logit[answer] − logit[its wrong
token] at ``query``; ``normalised`` is the same scaled so that 0 is the corrupted run and 1 the clean one;
``summary`` is that as text. ``picture`` draws the whole patching map of the corruption (hook point ×
position, the chosen cell framed) above layer 1's attention patterns of the patched run (one map per head,
query position down, key position across; the query's row framed in red, the patched position's column
marked by a cyan line). ``widget()`` shows both, with the controls "corruption", "point" and "position",
in a ``hooklab.widgets.Panel``.
"""

from __future__ import annotations

import torch
from torch import nn

from .picture import CYAN, Canvas, colours
from .recording import record
from .widgets import Panel

__all__ = ["PatchingExplorer"]

POINTS = ["hook_embed", "blocks.0.hook_attn_out", "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post",
          "blocks.1.hook_attn_out", "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"]


class PatchingExplorer:
    def __init__(self, model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor, query: int, answer: int,
                 wrong: int, points: list[str] | None = None, also: list[tuple[torch.Tensor, int]] = ()) -> None:
        self.model, self.clean, self.query, self.answer = model, clean, query, answer
        self.corruptions = [(corrupted, wrong), *also]
        self.names = []
        for tokens, _ in self.corruptions:
            where = (tokens[0] != clean[0]).nonzero().flatten().tolist()
            self.names.append(", ".join(f"{clean[0, p].item()} → {tokens[0, p].item()} at position {p}" for p in where))
        self.points = list(points or POINTS)
        with record(model, self.points) as rec, torch.no_grad():
            clean_logits = model(clean)
        self.cache = {point: rec[point].output for point in self.points}
        with torch.no_grad():
            self.ends = [(self._diff(model(tokens), w), self._diff(clean_logits, w)) for tokens, w in self.corruptions]
        self._runs: dict = {}  # (corruption, point, position) -> (logit difference, pattern), each run once

    def _diff(self, logits: torch.Tensor, wrong: int) -> float:
        return (logits[0, self.query, self.answer] - logits[0, self.query, wrong]).item()

    def _run(self, point: str, position: int, corruption: int) -> tuple[float, torch.Tensor, int]:
        key = corruption, point, position
        if key not in self._runs:
            self._runs[key] = self._patch(point, position, corruption)
        return self._runs[key]

    def _patch(self, point: str, position: int, corruption: int) -> tuple[float, torch.Tensor, int]:
        clean = self.cache[point]
        tokens, wrong = self.corruptions[corruption]

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
                logits = self.model(tokens)
        finally:
            for handle in handles:
                handle.remove()
        return self._diff(logits, wrong), kept[-1], logits[0, self.query].argmax().item()

    def patched(self, point: str, position: int, corruption: int = 0) -> float:
        """The corrupted run's logit difference with the clean ``point`` at ``position``."""
        return self._run(point, position, corruption)[0]

    def normalised(self, point: str, position: int, corruption: int = 0) -> float:
        """``patched`` scaled: 0 is the corrupted run, 1 the clean one."""
        low, high = self.ends[corruption]
        return (self.patched(point, position, corruption) - low) / (high - low)

    def summary(self, point: str, position: int, corruption: int = 0) -> str:
        diff, pattern, predicted = self._run(point, position, corruption)
        wrong, keys = self.corruptions[corruption][1], pattern[:, self.query].argmax(-1).tolist()
        winner = {self.answer: "clean", wrong: "corrupted"}.get(predicted, "neither")
        return (f"corruption {self.names[corruption]}: clean {point} patched in at position {position}: "
                f"logit[{self.answer}] − logit[{wrong}] at position {self.query} = {diff:+.1f}, normalised "
                f"{round(self.normalised(point, position, corruption), 2) + 0.0:.2f} "  # + 0.0: no "-0.00"
                f"({winner} answer wins); predicts {predicted}, layer "
                f"{len(self.model.blocks) - 1}'s heads attend keys {keys}")

    def picture(self, point: str, position: int, corruption: int = 0) -> bytes:
        """PNG: the corruption's patching map (hook point × position, normalised, the chosen cell framed), and
        the last layer's attention pattern of the patched run, one map per head (drawn straight to PNG by
        ``hooklab.picture``: a few milliseconds once the map's runs are done)."""
        t = self.query + 1
        sweep = torch.tensor([[self.normalised(p, q, corruption) for q in range(t)] for p in self.points])
        pattern = self._run(point, position, corruption)[1]
        heads, cell, gap, left, top = pattern.shape[0], 16, 30, 170, 20
        side, wide = t * cell, 24
        rows_y = top + 20 + len(self.points) * cell + 34  # where the attention maps start
        canvas = Canvas(max(heads * (side + gap) + gap, left + t * wide + 10), rows_y + side + 60)
        canvas.text(left, 2, "patching map: normalised logit difference (0 corrupted, 1 clean: white 0, red 1)")
        canvas.paste(colours(sweep, "RdBu_r", -1.0, 1.0), left, top + 16, (t * wide, len(self.points) * cell))
        for r, name in enumerate(self.points):
            canvas.text(left - 4, top + 16 + r * cell + cell // 2, name, size=10, anchor="rm")
        for q in range(t):
            canvas.text(left + q * wide + wide // 2, top + 18 + len(self.points) * cell, str(q), size=10, anchor="ma")
        canvas.text(left + t * wide // 2, top + 30 + len(self.points) * cell, "patched position", size=10, anchor="ma")
        row = self.points.index(point)
        canvas.frame((left + position * wide, top + 16 + row * cell, left + (position + 1) * wide - 1,
                      top + 16 + (row + 1) * cell - 1), colour=CYAN, width=2)
        last = len(self.model.blocks) - 1
        for h in range(heads):
            x = gap + h * (side + gap)
            canvas.text(x, rows_y, f"layer {last}, head {h}")
            canvas.paste(colours(pattern[h, :t, :t], "viridis", 0.0, 1.0), x, rows_y + 18, (side, side))
            canvas.frame((x, rows_y + 18 + self.query * cell, x + side - 1, rows_y + 18 + side - 1))
            column = x + position * cell + cell // 2
            canvas.line([(column, rows_y + 18), (column, rows_y + 18 + side - 1)], width=1)
            canvas.text(x + side // 2, rows_y + 22 + side, "key position", size=10, anchor="ma")
        canvas.text(2, rows_y + 18 + side + 20, "query position: rows 0-9, top to bottom", size=10)
        return canvas.png().png

    def widget(self, point: str | None = None, position: int = 3, corruption: int = 0) -> Panel:
        from ipywidgets import Dropdown, IntSlider

        controls = {"corruption": Dropdown(options=[(name, i) for i, name in enumerate(self.names)],
                                           value=corruption, description="corruption"),
                    "point": Dropdown(options=self.points, value=point or self.points[0], description="point"),
                    "position": IntSlider(position, 0, self.query, description="position")}

        def redraw(panel: Panel) -> tuple[str, bytes]:
            where = panel.point.value, panel.position.value, panel.corruption.value
            return self.summary(*where), self.picture(*where)

        return Panel(list(controls.values()), controls, redraw)

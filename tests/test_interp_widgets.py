"""Notebook 08's patching explorer, driven without a browser: set its controls, read what it shows."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from hooklab.exercises import nb08
from hooklab.interp_widgets import PatchingExplorer


@pytest.fixture(scope="module")
def explorer():
    clean, corrupted = nb08.clean_and_corrupted()
    return PatchingExplorer(nb08._model(), clean, corrupted, nb08.Q, nb08.A, nb08.B,
                            also=[(nb08.second_corruption(), nb08.B2)])


def test_patched_logit_difference_matches_the_lessons_patch(explorer):
    model = explorer.model
    for point, position in [("hook_embed", 3), ("blocks.0.hook_resid_post", 5), ("blocks.1.hook_mlp_out", 9),
                            ("blocks.1.hook_resid_post", 9)]:
        assert explorer.patched(point, position) == pytest.approx(nb08.patched_diff(model, point, position), abs=1e-5)
    assert explorer.patched("blocks.1.hook_resid_post", 9) > 10 > -10 > explorer.patched("blocks.1.hook_resid_post", 3)


def test_the_second_corruption_is_named_and_its_normalised_map_is_the_sweeps(explorer):
    assert explorer.names == ["19 → 17 at position 3", "5 → 3 at position 0, 3 → 5 at position 2"]
    clean = nb08.clean_and_corrupted()[0]
    sweep = nb08.patching_sweep(explorer.model, clean, nb08.second_corruption(), nb08.POINTS, nb08.logit_diff_2)
    for row, point in enumerate(nb08.POINTS):
        for position in (1, 2, 3, 9):
            assert explorer.normalised(point, position, 1) == pytest.approx(sweep[row, position].item(), abs=1e-4)
    assert explorer.normalised("blocks.0.hook_attn_out", 3, 1) > 0.5 > 0.1 > explorer.normalised(
        "blocks.0.hook_attn_out", 3, 0)


def test_the_summary_names_the_prediction_and_the_keys_layer_1_attends_from_the_query(explorer):
    """What the lesson prints beside the widget: the second corruption patched at layer 0's attention output."""
    at_1, at_2, at_3 = (explorer.summary("blocks.0.hook_attn_out", p, 1) for p in (1, 2, 3))
    assert at_2.endswith("predicts 12, layer 1's heads attend keys [1, 1, 1, 1]"), at_2
    assert at_3.endswith("predicts 19, layer 1's heads attend keys [3, 1, 3, 3]"), at_3
    assert "normalised 0.44 (neither answer wins)" in at_1, at_1  # the swapped-in record at 1 removed


def test_the_widget_redraws_text_and_picture_when_a_control_moves(explorer):
    panel = explorer.widget()
    assert panel.redraws == 1 and "+10.8" in panel.text
    assert panel.text.startswith("corruption 19 → 17 at position 3: clean hook_embed patched in at position 3")
    first = panel.png
    panel.point.value = "blocks.1.hook_resid_post"
    assert panel.redraws == 2 and "blocks.1.hook_resid_post" in panel.text and "corrupted answer wins" in panel.text
    before = panel.png
    panel.position.value = 9
    assert panel.redraws == 3 and "+10.8, normalised 1.00 (clean answer wins)" in panel.text
    assert panel.png not in (first, before) and Image.open(io.BytesIO(panel.png)).size[0] > 300
    panel.point.value, panel.position.value = "blocks.0.hook_attn_out", 3
    third = panel.png
    panel.corruption.value = 1
    assert panel.redraws == 6 and "5 → 3 at position 0" in panel.text and "normalised 0.60" in panel.text
    assert panel.png != third
    assert not [n for n, m in explorer.model.named_modules() if m._forward_hooks]

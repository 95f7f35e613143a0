"""Notebook 08's patching explorer in JupyterLab: Run All, pick a hook point, move the position, then switch
to the second corruption."""

from __future__ import annotations

import re

import nbformat
import pytest
from install_kernel import DISPLAY_NAME, NAME  # tools/
from playwright.sync_api import expect

from . import notebook_page as nb

pytestmark = pytest.mark.browser

CELLS = [
    "import hooklab\nfrom hooklab.exercises import nb08\nfrom hooklab.interp_widgets import PatchingExplorer\n"
    "from hooklab.transformer import trained_transformer\n\nhooklab.setup()\n"
    "clean, corrupted = nb08.clean_and_corrupted()",
    "PatchingExplorer(trained_transformer(), clean, corrupted, nb08.Q, nb08.A, nb08.B,\n"
    "                 also=[(nb08.second_corruption(), nb08.B2)]).widget()",
]


KERNEL_MS = 20_000  # a redraw the kernel computes, on a machine busy with other checks

def test_the_patching_explorer_redraws_for_a_new_point_and_position(lab, lab_root, page, artifacts):
    """Pick blocks.1.hook_resid_post in the dropdown (position 3: the corrupted answer wins), then move the
    position to the query with the mouse (the clean answer wins): the text and the picture change each time.
    Then blocks.0.hook_attn_out at 3, and the second corruption (positions 0 and 2 swapped): layer 0 restores
    it."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in CELLS])
    notebook.metadata["kernelspec"] = {"name": NAME, "display_name": DISPLAY_NAME, "language": "python"}
    path = lab_root / "patching_explorer.ipynb"
    nbformat.write(notebook, path)
    nb.open_notebook(page, lab.url(nb.notebook_path(path.name)))
    nb.run_all(page, timeout_ms=120_000)
    nb.check_ran_without_errors(page, len(CELLS))

    area = nb.widget_area(page, "position")
    text, image = nb.printed(area), nb.picture(area)
    expect(text).to_contain_text(re.compile(r"corruption 19 → 17 at position 3: clean hook_embed patched in at "
                                            r"position 3: .* = \+10\.8"))
    first = image.get_attribute("src")
    nb.control(area, "dropdown", "point").locator("select").select_option("blocks.1.hook_resid_post")
    expect(text).to_contain_text(re.compile(r"blocks\.1\.hook_resid_post patched in at position 3: .*corrupted"))
    expect(image).not_to_have_attribute("src", first)  # the picture is sent after the text: wait for it
    second = image.get_attribute("src")
    nb.drag_to(nb.slider(area, "position"), 1.0)  # the last position: the query, 9
    expect(nb.readout(nb.slider(area, "position"))).to_have_text("9")
    expect(text).to_contain_text(re.compile(r"at position 9: .* = \+10\.8, normalised 1\.00 \(clean answer wins\)"))
    expect(image).not_to_have_attribute("src", second)
    third = image.get_attribute("src")
    assert len({first, second, third}) == 3
    nb.control(area, "dropdown", "point").locator("select").select_option("blocks.0.hook_attn_out")
    nb.drag_to(nb.slider(area, "position"), 3 / 9)
    expect(nb.readout(nb.slider(area, "position"))).to_have_text("3")
    # the readout moves at once; the kernel may still be drawing an earlier position of the drag (a
    # loaded machine once showed position 4 after the next change): wait for its drawing at 3 first
    expect(text).to_contain_text(re.compile(r"blocks\.0\.hook_attn_out patched in at position 3:"), timeout=KERNEL_MS)
    swapped = "5 → 3 at position 0, 3 → 5 at position 2"  # the second corruption's name in the dropdown
    nb.control(area, "dropdown", "corruption").locator("select").select_option(label=swapped)
    expect(text).to_contain_text(re.compile(rf"corruption {swapped}: clean blocks\.0\.hook_attn_out "
                                            r"patched in at position 3: .*normalised 0\.60 \(clean answer wins\)"),
                                 timeout=KERNEL_MS)
    area.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "patching_explorer.png"))
    assert nb.error_outputs(page) == []

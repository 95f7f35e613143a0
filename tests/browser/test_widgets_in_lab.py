"""The course as a student uses it: JupyterLab in a real Chromium, Run All, then move the sliders.

Each test opens a fresh copy of a notebook (no outputs), runs every cell from the *Run* menu,
checks that every cell ran and none ended in an error, then moves a slider with the keyboard
and with a mouse drag and checks that what the widget shows changes. Screenshots before and
after go to ``artifacts/browser/``.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from playwright.sync_api import expect

from . import notebook_page as nb
from .conftest import ROOT

pytestmark = pytest.mark.browser

NOTEBOOKS = ROOT / "notebooks"


def code_cell_count(path) -> int:
    return sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)


def test_start_here_scale_slider(lab, lab_root, page, artifacts):
    copy = nb.fresh_copy(NOTEBOOKS / "00_start_here.ipynb", lab_root)
    nb.open_notebook(page, lab.url(nb.notebook_path(copy.name)))
    nb.run_all(page)
    nb.check_ran_without_errors(page, code_cell_count(copy))

    area = nb.widget_area(page, "scale")
    scale = nb.slider(area, "scale")
    printed = area.locator(".widget-output .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stdout']")
    expect(nb.readout(scale)).to_have_text("1")
    expect(printed).to_have_text("scale 1: output [[1.0, 2.0]]")
    area.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "00_scale_before.png"))

    nb.press(scale, "ArrowRight", times=2)  # keyboard: 1 -> 3
    expect(nb.readout(scale)).to_have_text("3")
    expect(printed).to_have_text("scale 3: output [[3.0, 6.0]]")

    nb.drag_to(scale, 1.0)  # mouse: to the right end, 5
    expect(nb.readout(scale)).to_have_text("5")
    expect(printed).to_have_text("scale 5: output [[5.0, 10.0]]")
    page.screenshot(path=str(artifacts / "00_scale_after.png"))

    nb.drag_to(scale, 0.0)  # and back to the left end
    expect(nb.readout(scale)).to_have_text("1")
    expect(printed).to_have_text(re.compile(r"^scale 1: "))
    assert nb.error_outputs(page) == []


def test_error_check_sees_a_failing_cell(lab, lab_root, page):
    """The checks above can fail: a cell that raises is found, a warning on stderr is not an error."""
    source = [
        "import warnings\nwarnings.warn('only a warning')",
        "raise ValueError('on purpose')",
        "print('never reached')",
    ]
    broken = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in source])
    broken.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = lab_root / "broken.ipynb"
    nbformat.write(broken, path)

    nb.open_notebook(page, lab.url(nb.notebook_path(path.name)))
    nb.run_all(page)
    errors = nb.error_outputs(page)
    assert [(e["cell"], e["ename"], e["evalue"]) for e in errors] == [(1, "ValueError", "on purpose")]
    assert nb.prompts(page)[2] == "[ ]:", "Run All stops at an untagged error"
    with pytest.raises(AssertionError, match=r"code cells \[2\] did not run"):
        nb.check_ran_without_errors(page, len(source))

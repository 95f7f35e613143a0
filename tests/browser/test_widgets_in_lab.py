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

pytestmark = pytest.mark.browser


def code_cell_count(path) -> int:
    return sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)


def test_start_here_scale_slider(course_pages, artifacts):
    page, copy = course_pages["00_start_here.ipynb"]
    nb.wait_run_all(page)
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


def test_explorer_layer_and_channel_sliders(course_pages, artifacts):
    """Notebook 05's layer explorer: moving "channel" or "layer" redraws the text and the image."""
    page, copy = course_pages["05_explorers_and_applications.ipynb"]
    nb.wait_run_all(page, timeout_ms=240_000)  # trains the digits CNN on one thread
    nb.check_ran_without_errors(page, code_cell_count(copy))

    area = nb.widget_area(page, "layer", "channel")  # the first explorer: the digits CNN
    layer, channel = nb.slider(area, "layer"), nb.slider(area, "channel")
    output = area.locator(".widget-output")
    text = output.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stdout']")
    image = output.locator(".jp-RenderedImage img")
    expect(text).to_have_count(1)
    expect(image).to_have_count(1)
    first_layer = nb.readout(layer).inner_text()
    heading = re.compile(
        rf"^{re.escape(first_layer)} \(\w+\) activation shape \((\d+), (\d+), (\d+)\), channel 0 of \1"
    )
    expect(text).to_have_text(heading)
    area.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "05_explorer_before.png"))
    shown = [(text.inner_text(), image.get_attribute("src"))]

    def changed(pattern: str) -> None:
        """Wait until the text matches ``pattern``; the text and the image differ from every earlier view."""
        expect(text).to_have_text(re.compile(pattern))
        expect(image).not_to_have_attribute("src", shown[-1][1])
        now = (text.inner_text(), image.get_attribute("src"))
        assert now[0] not in [t for t, _ in shown] and now[1] not in [s for _, s in shown]
        shown.append(now)

    nb.press(channel, "ArrowRight")  # keyboard: channel 0 -> 1
    expect(nb.readout(channel)).to_have_text("1")
    changed(rf"^{re.escape(first_layer)} .*channel 1 of ")

    nb.drag_to(channel, 1.0)  # mouse: the last channel
    top = int(nb.readout(channel).inner_text())
    assert top > 1
    changed(rf"channel {top} of {top + 1}\b")

    nb.press(layer, "ArrowRight")  # keyboard: the next layer
    expect(nb.readout(layer)).not_to_have_text(first_layer)
    second_layer = nb.readout(layer).inner_text()
    changed(rf"^{re.escape(second_layer)} \(\w+\) activation shape ")

    nb.drag_to(layer, 1.0)  # mouse: the last layer, a different shape from the first
    expect(nb.readout(layer)).not_to_have_text(second_layer)
    last_layer = nb.readout(layer).inner_text()
    changed(rf"^{re.escape(last_layer)} \(\w+\) activation shape ")
    first_shape = re.search(r"shape (\([^)]*\))", shown[0][0]).group(1)
    last_shape = re.search(r"shape (\([^)]*\))", shown[-1][0]).group(1)
    assert first_shape != last_shape, (first_shape, last_shape)
    page.screenshot(path=str(artifacts / "05_explorer_after.png"))
    assert nb.error_outputs(page) == []

"""The course as a student uses it: JupyterLab in a real Chromium, Run All, then move the controls.

Each test opens a fresh copy of a notebook (no outputs), runs every cell from the *Run* menu,
checks that every cell ran and none ended in an error, then moves sliders with the keyboard
and the mouse, types, clicks and picks, and checks that the text and the picture change.
A saved notebook shows its explorers before anything runs (their widget state is saved).
Screenshots go to ``artifacts/browser/``.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from install_kernel import DISPLAY_NAME, NAME  # tools/
from playwright.sync_api import expect

from . import notebook_page as nb

pytestmark = pytest.mark.browser


def code_cell_count(path) -> int:
    return sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)


def test_start_here_runs_in_lab(course_pages):
    """Notebook 00, the first a student opens, runs all its cells from the Run menu without an error.
    (It has no widgets: the sliders are driven in the explorer tests below.)"""
    page, copy = course_pages["00_start_here.ipynb"]
    nb.wait_run_all(page)
    nb.check_ran_without_errors(page, code_cell_count(copy))
    assert nb.error_outputs(page) == []


def test_error_check_sees_a_failing_cell(lab, lab_root, page):
    """The checks above can fail: a cell that raises is found, a warning on stderr is not an error."""
    source = [
        "import warnings\nwarnings.warn('only a warning')",
        "raise ValueError('on purpose')",
        "print('never reached')",
    ]
    broken = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in source])
    broken.metadata["kernelspec"] = {"name": NAME, "display_name": DISPLAY_NAME, "language": "python"}
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
    """Notebook 05's layer explorer: moving "channel" or "layer" redraws the text and the picture."""
    page, copy = course_pages["05_explorers_and_applications.ipynb"]
    nb.wait_run_all(page, timeout_ms=240_000)
    nb.check_ran_without_errors(page, code_cell_count(copy))

    area = nb.widget_area(page, "layer", "channel")  # the first explorer: the digits CNN
    layer, channel = nb.slider(area, "layer"), nb.slider(area, "channel")
    text, image = nb.printed(area), nb.picture(area)
    expect(text).to_have_count(1)
    expect(image).to_have_count(1)
    first_layer = nb.readout(layer).inner_text()
    heading = rf"\n{re.escape(first_layer)} \(\w+\) shape \((\d+), \d+, \d+\), channel 0 of \1"
    expect(text).to_contain_text(re.compile(heading))
    expect(text).to_contain_text(re.compile(r"\n  dead .*: 24 of 32: "))  # the lesson's question, on features.3
    area.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "05_explorer_before.png"))
    changed = Changes(text, image)

    nb.press(channel, "ArrowRight")  # keyboard: channel 0 -> 1
    expect(nb.readout(channel)).to_have_text("1")
    changed(rf"\n{re.escape(first_layer)} .*channel 1 of ")

    nb.drag_to(channel, 1.0)  # mouse: the last channel
    top = int(nb.readout(channel).inner_text())
    assert top > 1
    changed(rf"channel {top} of {top + 1}\b")

    nb.press(layer, "ArrowRight")  # keyboard: the next layer
    expect(nb.readout(layer)).not_to_have_text(first_layer)
    second_layer = nb.readout(layer).inner_text()
    changed(rf"\n{re.escape(second_layer)} \(\w+\) shape ")
    page.screenshot(path=str(artifacts / "05_explorer_after.png"))
    assert nb.error_outputs(page) == []


class Changes:
    """``changes(pattern)``: wait until the text matches ``pattern`` and the picture's ``src``
    differs from the last one; both must differ from every view seen before."""

    def __init__(self, text, image):
        self.text, self.image = text, image
        self.shown = [(text.inner_text(), image.get_attribute("src"))]

    def __call__(self, pattern: str) -> None:
        expect(self.text).to_contain_text(re.compile(pattern))
        expect(self.image).not_to_have_attribute("src", self.shown[-1][1])
        now = (self.text.inner_text(), self.image.get_attribute("src"))
        assert now[0] not in [t for t, _ in self.shown], now[0]
        self.shown.append(now)

    def picture_only(self) -> None:
        """Wait until the picture changes (a drawing option: the text stays)."""
        expect(self.image).not_to_have_attribute("src", self.shown[-1][1])
        self.shown.append((self.text.inner_text(), self.image.get_attribute("src")))


EXPLORERS = [
    "import hooklab\nfrom hooklab.cam_widgets import GradCamPicker\nfrom hooklab.data import digits\n"
    "from hooklab.models import DigitsCNN\nfrom hooklab.widgets import LayerExplorer\n\n"
    "hooklab.setup()\ndata = digits()\nmodel = DigitsCNN(seed=0).eval()  # random weights: quick to build",
    "LayerExplorer(model, data.x_test[:3]).widget(\"features.1\")",
    "GradCamPicker(model, data.x_test[:3], data.y_test[:3], [\"features.3\", \"features.6\"]).widget()",
]


def explorers_notebook(folder, name: str = "explorers.ipynb"):
    explorers = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in EXPLORERS])
    explorers.metadata["kernelspec"] = {"name": NAME, "display_name": DISPLAY_NAME, "language": "python"}
    path = folder / name
    nbformat.write(explorers, path)
    return path


@pytest.fixture(scope="module")
def explorers_page(lab, lab_root, chromium):
    """A notebook with a layer explorer and a Grad-CAM picker on the digits CNN, after Run All."""
    from .conftest import new_page

    page = new_page(chromium)
    try:
        path = explorers_notebook(lab_root)
        nb.open_notebook(page, lab.url(nb.notebook_path(path.name)))
        nb.run_all(page, timeout_ms=120_000)
        nb.check_ran_without_errors(page, len(EXPLORERS))
        yield page
    finally:
        page.context.close()


def test_every_control_of_the_layer_explorer_redraws_the_picture(explorers_page, artifacts):
    """As a student uses it: type a layer's name, go to the last channel, switch the tiles,
    pick another image and class. Each changes the text and the picture."""
    page = explorers_page
    area = nb.widget_area(page, "layer", "channel")
    text, image = nb.printed(area), nb.picture(area)
    expect(text).to_contain_text("image 0 of 3: class ")
    expect(image).to_be_visible()
    area.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "explorer_first.png"))
    changed = Changes(text, image)

    find = nb.control(area, "text", "find").locator("input")
    find.fill("features.5")  # the completing box: the layer slider jumps there
    expect(nb.readout(nb.slider(area, "layer"))).to_have_text("features.5")
    changed(r"\nfeatures\.5 \(Conv2d\) shape \(64, 4, 4\), channel 0 of 64")
    nb.drag_to(nb.slider(area, "channel"), 1.0)  # mouse: the last channel, on its page of tiles
    changed(r"channel 63 of 64; tiles: activation, channels 0–63")
    nb.control(area, "toggle-buttons", "tiles").get_by_role("button", name="gradient").click()
    changed(r"tiles: gradient")
    nb.press(nb.slider(area, "image"), "ArrowRight")
    changed(r"^image 1 of 3: class ")
    nb.press(nb.slider(area, "class"), "ArrowRight")
    changed(r"^image 1 of 3: class \d+ explained")
    page.screenshot(path=str(artifacts / "explorer_moved.png"))
    assert nb.error_outputs(page) == []


def test_every_control_of_the_grad_cam_picker_redraws_the_picture(explorers_page, artifacts):
    """Pick a method, the signed map, the shared colour scale, another class, random weights."""
    page = explorers_page
    method = page.locator(".widget-dropdown", has=nb.label(page, "method"))
    area = page.locator(".jp-Cell-outputArea").filter(has=method)
    text, image = nb.printed(area), nb.picture(area)
    expect(text).to_contain_text("explained at features.6")
    area.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "picker_first.png"))
    changed = Changes(text, image)
    nb.control(area, "dropdown", "method").locator("select").select_option("HiResCAM")
    changed(r"\n  HiResCAM \(4, 4\): max ")
    area.locator(".widget-checkbox", has_text="before ReLU").locator("input").check()
    changed.picture_only()  # one more panel: the map before the ReLU
    nb.control(area, "toggle-buttons", "scale").get_by_role("button", name="shared").click()
    changed.picture_only()  # the colour range is written in the map's title
    target = int(nb.readout(nb.slider(area, "class")).inner_text())
    nb.press(nb.slider(area, "class"), "ArrowRight")
    changed(rf"class {target + 1} \(score ")
    nb.control(area, "toggle-buttons", "weights").get_by_role("button", name="random").click()
    changed(r"rank correlation with the trained model's map")
    page.screenshot(path=str(artifacts / "picker_moved.png"))
    assert nb.error_outputs(page) == []


def test_a_saved_notebook_shows_its_explorers_before_anything_runs(lab, lab_root, page, artifacts):
    """make notebooks saves the widgets' state: opened again, the notebook shows each explorer
    as it was (text and picture), not ``VBox(children=...)``, before any cell runs. JupyterLab
    draws saved widgets of a trusted notebook only (as it runs saved JavaScript only from one):
    the test trusts it as ``jupyter trust`` would; static viewers (nbconvert, a site) need no trust."""
    from nbformat.sign import NotebookNotary
    from run_notebooks import run

    path = explorers_notebook(lab_root, "saved_explorers.ipynb")
    run(path, timeout=120)
    NotebookNotary(data_dir=str(lab.home / "data")).sign(nbformat.read(path, as_version=4))
    nb.open_notebook(page, lab.url(nb.notebook_path(path.name)))
    area = page.locator(".jp-Cell-outputArea").nth(1)
    expect(nb.printed(area)).to_contain_text("image 0 of 3: class ", timeout=nb.REDRAW_MS)
    expect(nb.picture(area)).to_be_visible()
    assert nb.prompts(page)[1] == "[2]:"  # the saved run's count: nothing ran in this page
    box = nb.picture(area).bounding_box()
    assert box and box["width"] > 300 and box["height"] > 150
    area.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "saved_explorer.png"))

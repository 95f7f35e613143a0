"""What a student does in JupyterLab, as Playwright steps: open a notebook, Run All, move a slider.

Every wait is a Playwright ``expect`` on the page (no sleeps). Selectors were checked against
JupyterLab 4.6 with ipywidgets 8.1:

* kernel ready: the status bar ``#jp-main-statusbar`` shows ``| Idle``;
* Run All: the menu item ``.lm-Menu-item[data-command='runmenu:run-all']`` of the *Run* menu;
* a code cell's prompt ``[ ]:`` (not run), ``[*]:`` (queued or running), ``[3]:`` (done);
* a slider is ``.widget-slider``; its handle ``.noUi-handle[role=slider]``; its value ``.widget-readout``;
* printed text ``.jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stdout']``,
  a figure ``.jp-RenderedImage img``;
* the explorers' controls: a dropdown ``.widget-dropdown select``, a completing text box
  ``.widget-text input``, toggle buttons ``.widget-toggle-button``, a check box
  ``.widget-checkbox input``; their text ``.widget-html pre`` and picture ``img.widget-image``
  (its ``src`` is a new ``blob:`` address each time the picture changes).

Error outputs are drawn with the same mime type as stderr text
(``application/vnd.jupyter.stderr``), so the DOM alone cannot tell a warning from a traceback;
``error_outputs`` asks the notebook model in the page (the server runs with
``expose_app_in_browser``) for outputs whose type is ``error``.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from playwright.sync_api import Locator, Page, expect

KERNEL_READY_MS = 90_000
RUN_ALL_MS = 100_000
REDRAW_MS = 20_000

CODE_PROMPTS = ".jp-CodeCell .jp-InputArea-prompt"


def fresh_copy(source: Path, folder: Path) -> Path:
    """The notebook without outputs or execution counts, as a student gets it after *Clear All*."""
    nb = nbformat.read(source, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.metadata.pop("widgets", None)
    target = folder / source.name
    nbformat.write(nb, target)
    return target


def notebook_path(name: str) -> str:
    """The address of a notebook in a workspace of its own: no tab from an earlier test reopens."""
    return f"lab/workspaces/{Path(name).stem.replace('_', '-')}/tree/{name}"


def open_notebook(page: Page, url: str) -> None:
    page.goto(url)
    expect(page.locator("#jp-main-statusbar")).to_contain_text("| Idle", timeout=KERNEL_READY_MS)
    expect(page.locator(".jp-Notebook .jp-Cell").first).to_be_visible()


def start_run_all(page: Page) -> None:
    """*Run → Run All Cells*; returns once every cell is queued."""
    prompts = page.locator(CODE_PROMPTS)
    expect(prompts.first).to_have_text("[ ]:")  # a fresh copy: nothing has run yet
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
    expect(prompts.first).not_to_have_text("[ ]:")  # Run All has queued every cell


def wait_run_all(page: Page, timeout_ms: int = RUN_ALL_MS) -> None:
    """Wait until no cell is queued or running."""
    expect(page.locator(CODE_PROMPTS, has_text="[*]")).to_have_count(0, timeout=timeout_ms)
    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1)


def run_all(page: Page, timeout_ms: int = RUN_ALL_MS) -> None:
    start_run_all(page)
    wait_run_all(page, timeout_ms)


def prompts(page: Page) -> list[str]:
    return page.locator(CODE_PROMPTS).all_inner_texts()


def error_outputs(page: Page) -> list[dict]:
    """Every output of type ``error`` in the open notebook: cell index, ``ename``, ``evalue``, source."""
    return page.evaluate(
        """() => {
            const panel = window.jupyterapp.shell.currentWidget;
            const cells = panel.content.model.cells;
            const found = [];
            for (let i = 0; i < cells.length; i++) {
                const cell = cells.get(i);
                if (cell.type !== 'code') continue;
                for (let j = 0; j < cell.outputs.length; j++) {
                    const out = cell.outputs.get(j).toJSON();
                    if (out.output_type === 'error') {
                        found.push({cell: i, ename: out.ename, evalue: out.evalue,
                                    source: cell.sharedModel.getSource().slice(0, 200)});
                    }
                }
            }
            return found;
        }"""
    )


def check_ran_without_errors(page: Page, n_code_cells: int) -> None:
    """Every code cell ran (``[N]:``) and none ended in an error."""
    shown = prompts(page)
    assert len(shown) == n_code_cells, f"{len(shown)} code cells in the page, {n_code_cells} in the file"
    not_run = [i for i, p in enumerate(shown) if not re.fullmatch(r"\[\d+\]:", p.strip())]
    assert not not_run, f"code cells {not_run} did not run: prompts {[shown[i] for i in not_run]}"
    assert error_outputs(page) == []


def label(page: Page, description: str) -> Locator:
    """A widget's description label, matched exactly (``layer`` is not ``layers``)."""
    return page.locator(".widget-label", has_text=re.compile(rf"^{re.escape(description)}$"))


def widget_area(page: Page, *descriptions: str) -> Locator:
    """The output area of the first cell whose widget has sliders labelled with all ``descriptions``."""
    area = page.locator(".jp-Cell-outputArea")
    for description in descriptions:
        area = area.filter(has=page.locator(".widget-slider", has=label(page, description)))
    expect(area.first).to_be_visible(timeout=REDRAW_MS)
    return area.first


def slider(area: Locator, description: str) -> Locator:
    return area.locator(".widget-slider", has=label(area.page, description))


def press(slider_box: Locator, key: str, times: int = 1) -> None:
    handle = slider_box.locator(".noUi-handle[role=slider]")
    handle.focus()
    for _ in range(times):
        handle.press(key)


def drag_to(slider_box: Locator, fraction: float) -> None:
    """Drag the handle with the mouse to ``fraction`` (0 = left end, 1 = right end) of the track."""
    page = slider_box.page
    handle = slider_box.locator(".noUi-handle[role=slider]")
    handle.scroll_into_view_if_needed()
    start = handle.bounding_box()
    track = slider_box.locator(".noUi-base").bounding_box()
    assert start and track, "slider is not on screen"
    y = start["y"] + start["height"] / 2
    page.mouse.move(start["x"] + start["width"] / 2, y)
    page.mouse.down()
    page.mouse.move(track["x"] + fraction * track["width"], y, steps=12)
    page.mouse.up()


def readout(slider_box: Locator) -> Locator:
    return slider_box.locator(".widget-readout")


def control(area: Locator, kind: str, description: str) -> Locator:
    """The widget of class ``widget-<kind>`` (``dropdown``, ``text``, ``toggle-buttons``) whose
    description is ``description`` (a check box shows its description beside the box instead:
    find it by its text)."""
    return area.locator(f".widget-{kind}", has=label(area.page, description))


def printed(area: Locator) -> Locator:
    """The text an explorer prints above its picture."""
    return area.locator(".widget-html pre")


def picture(area: Locator) -> Locator:
    return area.locator("img.widget-image")

"""Saved notebooks carry their widgets' state (what a static viewer draws), with steady model ids."""

from __future__ import annotations

import base64
import json

import nbformat
import pytest
from run_notebooks import WIDGET_STATE, WIDGET_VIEW, run, steady

WIDGET_CELL = """\
import ipywidgets as widgets
from IPython.display import display
from PIL import Image
import io

buffer = io.BytesIO()
Image.new("P", (4, 3), 7).save(buffer, format="png")
hidden = widgets.IntSlider(5, description="never shown")
box = widgets.VBox([widgets.IntSlider(2, description="shown"), widgets.Image(value=buffer.getvalue(), format="png")])
display(box)
"""


def notebook(path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("x"), nbformat.v4.new_code_cell(WIDGET_CELL)])
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A notebook with a widget, saved by ``make notebooks`` twice: the file and its two texts."""
    path = tmp_path_factory.mktemp("widgets") / "w.ipynb"
    notebook(path)
    run(path, timeout=120)
    first = path.read_text()
    run(path, timeout=120)
    return json.loads(first), first, path.read_text()


def test_a_rerun_saves_the_same_file_widget_state_included(saved):
    nb, first, second = saved
    assert first == second
    assert WIDGET_STATE in nb["metadata"]["widgets"]


def test_the_state_holds_what_the_view_shows_and_nothing_else(saved):
    nb = saved[0]
    state = nb["metadata"]["widgets"][WIDGET_STATE]["state"]
    outputs = nb["cells"][1]["outputs"]
    (view,) = [o["data"][WIDGET_VIEW]["model_id"] for o in outputs if WIDGET_VIEW in o.get("data", {})]
    box = state[view]
    assert box["model_name"] == "VBoxModel"
    slider_ref, image_ref = box["state"]["children"]
    slider, image = state[slider_ref.removeprefix("IPY_MODEL_")], state[image_ref.removeprefix("IPY_MODEL_")]
    assert slider["model_name"] == "IntSliderModel"
    assert (slider["state"]["value"], slider["state"]["description"]) == (2, "shown")
    (buffer,) = image["buffers"]
    assert buffer["path"] == ["value"] and base64.b64decode(buffer["data"]).startswith(b"\x89PNG")
    assert not any(m["state"].get("description") == "never shown" for m in state.values())  # never displayed
    for model in state.values():  # every reference points into the saved state
        for value in json.dumps(model["state"]).split('"'):
            if value.startswith("IPY_MODEL_"):
                assert value.removeprefix("IPY_MODEL_") in state


def test_steady_renames_models_from_the_view_and_their_place():
    def saved(ids):
        out = nbformat.v4
        view = out.new_output("display_data", data={WIDGET_VIEW: {"model_id": ids[0]}, "text/plain": "VBox()"})
        nb = out.new_notebook(cells=[out.new_code_cell("box", outputs=[view])])
        models = {ids[0]: {"children": [f"IPY_MODEL_{ids[1]}"], "layout": f"IPY_MODEL_{ids[2]}"},
                  ids[1]: {"layout": f"IPY_MODEL_{ids[2]}"}, ids[2]: {}, ids[3]: {"value": 1}}  # fmt: skip
        nb.metadata.widgets = {WIDGET_STATE: {"state": {k: {"model_name": "M", "state": v} for k, v in models.items()},
                                              "version_major": 2, "version_minor": 0}}  # fmt: skip
        steady(nb, "05_explorers.ipynb")
        return nb

    one, two = saved(["a1", "b2", "c3", "d4"]), saved(["9f", "8e", "7d", "6c"])
    assert one.metadata == two.metadata and one.cells[0].outputs == two.cells[0].outputs
    state = one.metadata.widgets[WIDGET_STATE]["state"]
    view = one.cells[0].outputs[0].data[WIDGET_VIEW]["model_id"]
    assert len(state) == 3 and view in state  # the model no view shows is gone
    child, layout = state[view]["state"]["children"][0], state[view]["state"]["layout"]
    assert state[child.removeprefix("IPY_MODEL_")]["state"]["layout"] == layout
    other = saved(["a1", "b2", "c3", "d4"])
    other.cells[0].outputs[0].data[WIDGET_VIEW]["model_id"] = "elsewhere"  # a view whose model was not saved
    steady(other, "05_explorers.ipynb")
    assert "widgets" not in other.metadata


def test_a_static_html_page_carries_the_state_and_the_view(saved):
    """nbconvert (what a site or a static viewer runs) writes the state and each view into the page,
    for the widgets' HTML manager to draw: no text like ``VBox(children=...)`` in their place."""
    from nbconvert import HTMLExporter

    nb = nbformat.reads(saved[1], as_version=4)
    page, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    view = nb.cells[1].outputs[0].data[WIDGET_VIEW]["model_id"]
    assert f'<script type="{WIDGET_STATE}">' in page
    assert f'<script type="{WIDGET_VIEW}">' in page and view in page

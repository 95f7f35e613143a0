"""``make site`` (tools/build_site.py): one page per notebook and per worked-answer notebook, a landing
page with the map, links between pages that land on an existing page and heading, widgets drawn
from their saved state, nothing fetched from the network but MathJax where there are formulas.
The browser test (tests/browser/test_site.py) looks at the pages in Chromium."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import build_site as course_site  # tools/, on pytest's path
import nbformat
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
ANSWERS = sorted(p.name for p in (ROOT / "notebooks" / "solutions").glob("*.ipynb"))


class Page(HTMLParser):
    """The ids, the links and the loaded resources (script src, link href, img src) of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids, self.links, self.loads = set(), [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag in ("script", "img", "iframe") and attrs.get("src"):
            self.loads.append(attrs["src"])
        if tag == "link" and attrs.get("href"):
            self.loads.append(attrs["href"])


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    course_site.build(out)
    return out


def test_every_notebook_and_every_worked_answer_has_its_own_page_and_the_map_links_them(site):
    assert sorted(p.name for p in site.glob("*.html")) == sorted([n.replace(".ipynb", ".html") for n in NOTEBOOKS]
                                                                 + ["index.html"])  # fmt: skip
    assert sorted(p.name for p in (site / "solutions").glob("*.html")) == [n.replace(".ipynb", ".html")
                                                                           for n in ANSWERS]  # fmt: skip
    index = Page((site / "index.html").read_text())
    expected = [n.replace(".ipynb", ".html") for n in NOTEBOOKS] + [f"solutions/{n.replace('.ipynb', '.html')}"
                                                                    for n in ANSWERS]  # fmt: skip
    assert [link for link in index.links if not link.startswith("http")] == expected
    # each notebook's title and learning goals are on the map
    for name in NOTEBOOKS:
        title, goals = course_site.title_and_goals(nbformat.read(ROOT / "notebooks" / name, as_version=4))
        assert title and goals
        assert title in (site / "index.html").read_text()


def test_every_local_link_lands_on_a_page_and_a_heading_that_exist(site):
    checked, ids = 0, {}  # each page's ids, parsed once (pages of 1 MB were parsed once per link)
    for page in site.rglob("*.html"):
        for link in Page(page.read_text()).links:
            parts = urlsplit(link)
            if parts.scheme:
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            assert target.is_file(), f"{page.relative_to(site)} links to {link}, which does not exist"
            if parts.fragment:
                if target not in ids:
                    ids[target] = Page(target.read_text()).ids
                found = {as_browser_sends(parts.fragment), unquote(parts.fragment)} & ids[target]
                assert found, f"{page.name}: no heading for {link}"
            checked += 1
    assert checked > 3 * len(NOTEBOOKS + ANSWERS)  # the navigation bars alone give more


def as_browser_sends(fragment: str) -> str:
    """A link's fragment as the browser looks it up first: non-ASCII characters and spaces
    percent-encoded (then, failing that, decoded: the other candidate the test accepts)."""
    return "".join(c if c.isascii() and c not in ' "<>`' else quote(c) for c in unquote(fragment))


def test_links_between_notebooks_become_links_between_pages():
    page = '<a href="02_forward_hooks.ipynb#2.-Changing">x</a> <a href="../01_tensor_hooks.ipynb">y</a>'
    assert course_site.local_links(page) == ('<a href="02_forward_hooks.html#2.-Changing">x</a> '
                                             '<a href="../01_tensor_hooks.html">y</a>')  # fmt: skip
    remote = '<a href="https://example.org/a.ipynb">z</a> <a href="#Cell.ipynb">w</a>'
    assert course_site.local_links(remote) == remote


def test_pages_load_nothing_from_the_network_but_mathjax_where_there_are_formulas(site):
    for page in site.rglob("*.html"):
        remote = [src for src in Page(page.read_text()).loads if urlsplit(src).scheme in ("http", "https")]
        source = ROOT / "notebooks" / page.relative_to(site).with_suffix(".ipynb")
        if page.name == "index.html":
            assert remote == []
            continue
        nb = nbformat.read(source, as_version=4)
        has_math = any(re.search(r"\$[^$\n]+\$", c.source) for c in nb.cells if c.cell_type == "markdown")
        assert remote == (["https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js?"
                           "config=TeX-AMS_CHTML-full,Safe"] if has_math else []), page.name  # fmt: skip


def png(color: str) -> str:
    data = io.BytesIO()
    Image.new("RGB", (4, 3), color).save(data, format="PNG")
    return base64.b64encode(data.getvalue()).decode()


def test_a_widget_is_drawn_from_its_saved_state_and_one_without_state_says_where_to_use_it():
    picture, figure = png("red"), png("blue")
    models = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_slider", "IPY_MODEL_row"]}},
        "slider": {"model_name": "SelectionSliderModel",
                   "state": {"description": "layer", "_options_labels": ["conv1", "relu1"], "index": 1}},
        "row": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_image", "IPY_MODEL_out"]}},
        "image": {"model_name": "ImageModel", "state": {"format": "png", "width": "300"},
                  "buffers": [{"path": ["value"], "data": picture, "encoding": "base64"}]},
        "out": {"model_name": "OutputModel", "state": {"outputs": [
            {"output_type": "stream", "name": "stdout", "text": "relu1: 8 channels <dead>\n"},
            {"output_type": "display_data", "data": {"image/png": figure, "text/plain": "<Figure>"}}]}},
    }  # fmt: skip
    view = {"model_id": "box", "version_major": 2, "version_minor": 0}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("explorer", outputs=[
        nbformat.v4.new_output("display_data", data={course_site.WIDGET_VIEW: view, "text/plain": "VBox(...)"}),
        nbformat.v4.new_output("display_data", data={course_site.WIDGET_VIEW: {"model_id": "gone"}}),
    ])])  # fmt: skip
    nb.metadata["widgets"] = {course_site.WIDGET_STATE: {"state": models, "version_major": 2, "version_minor": 0}}

    course_site.draw_widgets(nb)

    drawn, missing = (out["data"] for out in nb.cells[0].outputs)
    assert list(drawn) == ["text/html"] and "widgets" not in nb.metadata
    html = drawn["text/html"]
    assert html.index("layer") < html.index("relu1") < html.index(picture) < html.index("8 channels &lt;dead&gt;")
    assert f"src='data:image/png;base64,{picture}' width='300'>" in html
    assert f"src='data:image/png;base64,{figure}'" in html
    assert "VBox(" not in html
    assert "make lab" in missing["text/html"] and "<img" not in missing["text/html"]


def test_a_site_without_the_worked_answers_lists_no_page_of_them():
    order = course_site.pages(answers=False)
    assert [page for _, page in order] == [n.replace(".ipynb", ".html") for n in NOTEBOOKS]
    index = course_site.index_page(ROOT / "notebooks", order)
    assert "Worked answers" not in index
    assert not [link for link in Page(index).links if "solutions" in link]

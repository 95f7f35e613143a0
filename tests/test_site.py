"""``make site`` (tools/build_site.py): one page per lesson, per field guide notebook (under
``guide/``) and per worked-answer notebook (under ``solutions/``), a landing page with the map
(the lessons, then the field guide), links between pages that land on an existing page and
heading, widgets drawn from their saved state, nothing fetched from the network but MathJax where
there are formulas. The course's own notebooks are checked whether or not the guide has
notebooks yet; a small course written in tmp_path checks the guide's pages and the links between
lessons, guide and worked answers. The browser test (tests/browser/test_site.py) looks at the
pages in Chromium."""

from __future__ import annotations

import base64
import io
import re
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import build_site as course_site  # tools/, on pytest's path
import nbformat
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))  # the lessons
GUIDE = sorted(p.name for p in (ROOT / "notebooks" / "guide").glob("*.ipynb"))  # none yet, or G1_…, G2_…
ANSWERS = sorted(p.name for p in (ROOT / "notebooks" / "solutions").glob("*.ipynb"))  # of lessons and guide
#: every page but the index, in the map's order: lessons, field guide, worked answers
PAGES = [n.replace(".ipynb", ".html") for n in NOTEBOOKS] + [f"guide/{n.replace('.ipynb', '.html')}" for n in GUIDE] \
    + [f"solutions/{n.replace('.ipynb', '.html')}" for n in ANSWERS]  # fmt: skip


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
    assert sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")) == sorted([*PAGES, "index.html"])
    index = Page((site / "index.html").read_text())
    assert [link for link in index.links if not link.startswith("http")] == PAGES
    # each lesson's title and learning goals are on the map, then each guide notebook's title
    text = (site / "index.html").read_text()
    for name in NOTEBOOKS:
        title, goals = course_site.title_and_goals(nbformat.read(ROOT / "notebooks" / name, as_version=4))
        first = "".join(nbformat.read(ROOT / "notebooks" / name, as_version=4).cells[0].source)
        assert title and (goals or "**" not in first.split("\n\n")[1])  # a bold goals line is found
        assert escape(title) in text
    assert ("<h2>Field guide</h2>" in text) == bool(GUIDE)
    for name in GUIDE:
        title, _ = course_site.title_and_goals(nbformat.read(ROOT / "notebooks" / "guide" / name, as_version=4))
        assert title and text.index("<h2>Field guide</h2>") < text.index(escape(title))


def local_links(site: Path) -> tuple[int, list[str]]:
    """How many local links the site's pages have, and those that miss their page or heading."""
    checked, broken, ids = 0, [], {}  # each page's ids, parsed once (pages of 1 MB were parsed once per link)
    for page in sorted(site.rglob("*.html")):
        for link in Page(page.read_text()).links:
            parts = urlsplit(link)
            if parts.scheme:
                continue
            checked += 1
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if not target.is_file():
                broken.append(f"{page.relative_to(site)} links to {link}, which does not exist")
                continue
            if parts.fragment:
                if target not in ids:
                    ids[target] = Page(target.read_text()).ids
                if not {as_browser_sends(parts.fragment), unquote(parts.fragment)} & ids[target]:
                    broken.append(f"{page.relative_to(site)}: no heading for {link}")
    return checked, broken


def test_every_local_link_lands_on_a_page_and_a_heading_that_exist(site):
    checked, broken = local_links(site)
    assert broken == []
    assert checked > 2 * len(PAGES)  # the navigation bars alone give nearly as many


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
    assert [page for _, page in order] == [page for page in PAGES if not page.startswith("solutions/")]
    index = course_site.index_page(ROOT / "notebooks", order)
    assert "Worked answers" not in index
    assert not [link for link in Page(index).links if "solutions" in link]


# --- a small course of two lessons, two guide notebooks and two worked answers, in tmp_path --------


def notebook(path: Path, *markdown: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cells = [nbformat.v4.new_markdown_cell(text) for text in markdown]
    cells.insert(1, nbformat.v4.new_code_cell("import hooklab\nhooklab.setup()"))
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)


def small_course(source: Path) -> Path:
    """Lessons link the guide's sections, the guide links back to a lesson and to itself, and the
    worked answers link their lesson or guide notebook: the links the course's notebooks use."""
    goals = "**After this notebook you will be able to**\n- hook a tensor\n"
    notebook(source / "00_first.ipynb", f"# 00 · First lesson\n\n{goals}", "## 1. A hook\n\nCurious? "
             "[the firing order](guide/G1_tensor_hooks.ipynb#2.-Firing-order) · [next](01_second.ipynb)")
    notebook(source / "01_second.ipynb", f"# 01 · Second lesson\n\n{goals}",
             "## 1. Modules\n\nMore in [the guide](guide/G2_module_hooks.ipynb).")
    notebook(source / "guide" / "G1_tensor_hooks.ipynb", "# G1 · Tensor hooks\n\nWhat tensor hooks do.\n\n"
             "- [1. Registering](#1.-Registering)\n- [2. Firing order](#2.-Firing-order)",
             "## 1. Registering\n\nDocumented.", "## 2. Firing order\n\nMeasured; taught in "
             "[lesson 00](../00_first.ipynb#1.-A-hook).")
    notebook(source / "guide" / "G2_module_hooks.ipynb", "# G2 · Module hooks\n\nWhat module hooks do.",
             "## 1. Order\n\nAs for tensors: [G1 §2](G1_tensor_hooks.ipynb#2.-Firing-order).")
    notebook(source / "solutions" / "00_first_solutions.ipynb", "# 00 · Worked answers",
             "Back to [the lesson](../00_first.ipynb#1.-A-hook).")
    notebook(source / "solutions" / "G1_tensor_hooks_solutions.ipynb", "# G1 · Worked answers",
             "Back to [the guide](../guide/G1_tensor_hooks.ipynb#2.-Firing-order).")  # fmt: skip
    return source


SMALL_PAGES = ["00_first.html", "01_second.html", "guide/G1_tensor_hooks.html", "guide/G2_module_hooks.html",
               "solutions/00_first_solutions.html", "solutions/G1_tensor_hooks_solutions.html"]  # fmt: skip


@pytest.fixture(scope="module")
def small_site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("small")
    course_site.build(folder / "site", source=small_course(folder / "notebooks"))
    return folder / "site"


def nav_links(page: Path) -> list[str]:
    bar = re.search(r"<nav class='hooklab-nav'>.*?</nav>", page.read_text())
    return Page(bar[0]).links


def test_guide_notebooks_get_pages_under_guide_and_the_map_lists_them_after_the_lessons(small_site):
    assert sorted(p.relative_to(small_site).as_posix() for p in small_site.rglob("*.html")) == \
        sorted([*SMALL_PAGES, "index.html"])  # fmt: skip
    index = (small_site / "index.html").read_text()
    assert Page(index).links == SMALL_PAGES
    order = ["<h2>The lessons</h2>", "00 · First lesson", "hook a tensor", "<h2>Field guide</h2>",
             "G1 · Tensor hooks", "G2 · Module hooks", "<h2>Worked answers</h2>", "G1 · Worked answers"]  # fmt: skip
    assert [index.index(part) for part in order] == sorted(index.index(part) for part in order)


def test_links_between_lessons_guide_and_worked_answers_land_on_their_pages_and_headings(small_site):
    checked, broken = local_links(small_site)
    assert broken == [] and checked >= 20
    links = {page: Page((small_site / page).read_text()).links for page in SMALL_PAGES}
    assert "guide/G1_tensor_hooks.html#2.-Firing-order" in links["00_first.html"]
    assert "guide/G2_module_hooks.html" in links["01_second.html"]
    assert "../00_first.html#1.-A-hook" in links["guide/G1_tensor_hooks.html"]
    assert "G1_tensor_hooks.html#2.-Firing-order" in links["guide/G2_module_hooks.html"]
    assert "../guide/G1_tensor_hooks.html#2.-Firing-order" in links["solutions/G1_tensor_hooks_solutions.html"]


def test_each_bar_leads_home_and_on_within_lessons_or_within_the_guide_and_answers_lead_back(small_site):
    assert nav_links(small_site / "00_first.html") == ["index.html", "01_second.html"]
    assert nav_links(small_site / "01_second.html") == ["index.html", "00_first.html"]  # no next into the guide
    assert nav_links(small_site / "guide" / "G1_tensor_hooks.html") == ["../index.html", "G2_module_hooks.html"]
    assert nav_links(small_site / "guide" / "G2_module_hooks.html") == ["../index.html", "G1_tensor_hooks.html"]
    assert nav_links(small_site / "solutions" / "00_first_solutions.html") == ["../index.html", "../00_first.html"]
    assert nav_links(small_site / "solutions" / "G1_tensor_hooks_solutions.html") == [
        "../index.html", "../guide/G1_tensor_hooks.html"]  # fmt: skip


def test_without_the_worked_answers_the_guide_stays_and_no_link_leads_to_an_answer(tmp_path):
    out = tmp_path / "site"
    course_site.build(out, source=small_course(tmp_path / "notebooks"), answers=False)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html")) == \
        sorted([page for page in SMALL_PAGES if not page.startswith("solutions/")] + ["index.html"])  # fmt: skip
    assert local_links(out)[1] == []
    assert "Worked answers" not in (out / "index.html").read_text()


def test_a_predictions_answer_is_folded_until_the_reader_opens_it(site):
    """On a lesson's page the output of each cell that shows a prediction's answer sits in a closed
    <details> block, after the question and the guess cell; other outputs are shown as they are."""
    from release import answer_cells  # tools/

    folded = 0
    for name in NOTEBOOKS:
        nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        page = (site / name.replace(".ipynb", ".html")).read_text()
        answers = answer_cells(nb.cells)
        assert page.count('<details class="hooklab-answer">') == len(answers), name
        first = nb.cells[answers[0]].outputs[0]
        shown = "".join(first.get("text", "")) or "".join(first.get("data", {}).get("text/plain", ""))
        if shown.strip():
            line = escape(shown.strip().splitlines()[0], quote=False)
            assert page.index(line) > page.index('<details class="hooklab-answer">'), name
        folded += len(answers)
    assert folded >= 30

"""Build the course as a static website (``make site``): ``artifacts/site/index.html`` with the
map (the lessons, then the field guide), one page per notebook with its stored outputs and
figures: the lessons beside the index (``01_tensor_hooks.html``), the field guide under
``guide/`` (``guide/G1_tensor_and_graph_hooks.html``), and the worked answers of both on pages of
their own under ``solutions/`` (``--no-answers`` leaves them out:
``make site SITE_ARGS=--no-answers``). Nothing is executed and nothing is downloaded: the pages
are the notebooks as saved (``make notebooks``), rendered by nbconvert's HTML exporter.

The site keeps the folders of ``notebooks/``, so the links between notebooks
(``02_forward_hooks.ipynb#2.-Changing…``, ``guide/G1_….ipynb#3.-…`` from a lesson,
``../01_tensor_hooks.ipynb`` from the guide or the worked answers) become links between pages.
Each page's bar leads home, to the previous and next page of its kind (lesson or guide), and from
a worked answer back to its notebook.

A widget (the explorers, a progress bar) is drawn as it opened, from the widget state the notebook
was saved with: its picture, its printed text and its controls at their first values (shown, not
working: moving a slider needs a kernel). A widget without saved state says where to use it.

The pages load nothing from the network, with one exception: a notebook whose text has formulas
(``$…$``) loads MathJax from its CDN, and offline shows the formulas as written.
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import sys
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from release import answer_cells  # tools/

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
TEMPLATES = Path(__file__).resolve().parent / "site_templates"
NO_STATE = ("<p class='hooklab-widget-note'>An interactive widget: open this notebook in JupyterLab "
            "(<code>make lab</code>) to use it.</p>")  # fmt: skip
SAVED_VIEW = "<p class='hooklab-widget-note'>The widget as it opened; run the notebook to move its controls.</p>"


FOLDERS = ("", "guide", "solutions")  # the lessons, the field guide, the worked answers of both: the map's order


def pages(source: Path = NOTEBOOKS, answers: bool = True) -> list[tuple[Path, str]]:
    """Every notebook and its page, in the map's order: the lessons (``NN_name.html``), the field
    guide (``guide/GK_name.html``), then the worked answers (``solutions/NN_name_solutions.html``,
    ``solutions/GK_name_solutions.html``) unless ``answers`` is false."""
    folders = [name for name in FOLDERS if answers or name != "solutions"]
    found = [p for name in folders for p in sorted((source / name).glob("*.ipynb"))]
    return [(p, p.relative_to(source).with_suffix(".html").as_posix()) for p in found]


# --- widgets, drawn from their saved state -------------------------------------------------------


def widget_html(model_id: str, models: dict) -> str:
    """The HTML of one widget and its children as saved; "" for a model that draws nothing."""
    model = models.get(model_id)
    if model is None:
        return ""
    name, state = model.get("model_name", ""), model.get("state", {})
    label = html.escape(str(state.get("description", "")))
    if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel"):
        children = "".join(widget_html(ref.removeprefix("IPY_MODEL_"), models) for ref in state.get("children", []))
        return f"<div class='hooklab-{'row' if name == 'HBoxModel' else 'column'}'>{children}</div>"
    if name == "ImageModel":
        return image_html(model)
    if name == "OutputModel":
        return "".join(output_html(out) for out in state.get("outputs", []))
    if name in ("HTMLModel", "HTMLMathModel"):
        return f"<div>{state.get('value', '')}</div>"
    if name == "LabelModel":
        return f"<span>{html.escape(str(state.get('value', '')))}</span>"
    if name in ("IntSliderModel", "FloatSliderModel", "IntProgressModel", "FloatProgressModel"):
        low, high, value = state.get("min", 0), state.get("max", 100), state.get("value", 0)
        kind = "progress" if "Progress" in name else "range"
        control = (f"<progress max='{high}' value='{value}'></progress>" if kind == "progress" else
                   f"<input type='range' min='{low}' max='{high}' value='{value}' disabled>")  # fmt: skip
        return f"<label class='hooklab-control'>{label} {control} <output>{html.escape(str(value))}</output></label>"
    if "_options_labels" in state:  # dropdowns, selection sliders, toggle and radio buttons
        labels, index = state["_options_labels"], state.get("index")
        chosen = labels[index] if isinstance(index, int) and 0 <= index < len(labels) else ""
        return f"<label class='hooklab-control'>{label} <output>{html.escape(str(chosen))}</output></label>"
    if name in ("CheckboxModel", "ToggleButtonModel", "TextModel", "ComboboxModel", "ButtonModel"):
        value = state.get("value", "")
        shown = "" if name == "ButtonModel" else f" <output>{html.escape(str(value))}</output>"
        return f"<label class='hooklab-control'>{label}{shown}</label>"
    return ""


def image_html(model: dict) -> str:
    """An Image widget's picture, from its saved bytes (a buffer, base64) or a data URL."""
    state = model.get("state", {})
    data = next((b["data"] for b in model.get("buffers", []) if b.get("path") == ["value"]), None)
    if data is None and isinstance(state.get("value"), str):
        data = state["value"]
    if not data:
        return ""
    size = "".join(f" {key}='{html.escape(str(state[key]))}'" for key in ("width", "height") if state.get(key))
    source = f"data:image/{state.get('format', 'png')};base64,{data}"
    return f"<img class='hooklab-picture' alt='saved picture' src='{source}'{size}>"


def output_html(out: dict) -> str:
    """One output of an Output widget, the way the page shows a cell's output."""
    data = out.get("data", {})
    if "image/png" in data:
        return f"<img class='hooklab-picture' alt='saved figure' src='data:image/png;base64,{data['image/png'].strip()}'>"  # noqa: E501
    if "text/html" in data:
        return "".join(data["text/html"])
    text = out.get("text") or data.get("text/plain") or ""
    return f"<pre>{html.escape(''.join(text))}</pre>" if text else ""


def draw_widgets(nb) -> None:
    """Replace every widget view with its saved drawing, then drop the state (nbconvert would
    otherwise add scripts that fetch the widget renderer from a CDN)."""
    models = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                continue
            drawn = widget_html(view.get("model_id", ""), models)
            body = SAVED_VIEW + f"<div class='hooklab-widget'>{drawn}</div>" if drawn else NO_STATE
            out["data"] = {"text/html": body}


ANSWER = "<details class='hooklab-answer'><summary>The answer: write your guess first, then open</summary>{}</details>"


def fold_answers(nb) -> None:
    """The outputs of each cell that shows a prediction's answer (``release.answer_cells``) become
    one folded block that a reader opens after guessing, as a student runs the cell after guessing."""
    for index in answer_cells(nb.cells):
        cell = nb.cells[index]
        shown = "".join(output_html(out) for out in cell.outputs)
        if shown:
            cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": ANSWER.format(shown)})]


# --- pages ---------------------------------------------------------------------------------------


LINK = re.compile(r"""href=(["'])(?![a-z][a-z0-9+.-]*:|#|/)([^"'#]*?)\.ipynb(#[^"']*)?\1""")


def local_links(page: str) -> str:
    """Links to another notebook point to its page."""
    return LINK.sub(lambda m: f"href={m[1]}{m[2]}.html{m[3] or ''}{m[1]}", page)


def title_and_goals(nb) -> tuple[str, str]:
    """The notebook's H1 title and the markdown of its learning goals: the list after a bold line
    "**After this notebook you will be able to**" (or "**You will be able to:**", "**After this lesson you
    can**"), or the sentence that follows such a bold start; a lesson that opens straight with its
    problem has none."""
    first = next((c.source for c in nb.cells if c.cell_type == "markdown"), "")
    title = next((line[2:].strip() for line in first.splitlines() if line.startswith("# ")), "")
    bold = r"\*\*(?:After [^*\n]*)?(?:[Yy]ou will be able to|you can):?\*\*:?\n"
    goals = re.search(bold + r"((?:[-*] .*\n?(?:  .*\n?)*)+)", first)
    if goals:
        return title, goals[1]
    inline = re.search(bold.removesuffix(r"\n") + r"[ \t]*(\S.*?)(?:\n\n|\Z)", first, re.S)  # the goals as a sentence
    return title, " ".join(inline[1].split()) if inline else ""


def nav(page: str, order: list[str]) -> str:
    """The bar at the top of a page: home, then the previous and next page of its kind (``order``:
    the lessons' and the guide's pages), or, for a worked answer, back to its lesson or guide page."""
    folder, _, name = page.rpartition("/")
    links = [f"<a href='{'../' if folder else ''}index.html'>Hook Lab</a>"]
    if folder == "solutions":
        notebook = name.replace("_solutions", "")
        back = next((p for p in order if p in (notebook, f"guide/{notebook}")), None)
        if back:
            links.append(f"<a href='../{back}'>back to the notebook</a>")
    else:
        kind = [p.rpartition("/")[2] for p in order if p.rpartition("/")[0] == folder]
        at = kind.index(name)
        if at > 0:
            links.append(f"<a href='{kind[at - 1]}'>← previous</a>")
        if at + 1 < len(kind):
            links.append(f"<a href='{kind[at + 1]}'>next →</a>")
    return f"<nav class='hooklab-nav'>{' · '.join(links)}</nav>"


def render(path: Path, page: str, order: list[str], exporter: HTMLExporter) -> str:
    nb = nbformat.read(path, as_version=4)
    draw_widgets(nb)
    fold_answers(nb)
    nb.metadata["title"] = title_and_goals(nb)[0] or path.stem
    has_math = any(re.search(r"\$[^$\n]+\$", c.source) for c in nb.cells if c.cell_type == "markdown")
    body, _ = exporter.from_notebook_node(nb, resources={"hooklab_math": has_math})
    body = re.sub(r"(<body[^>]*>\s*<main>)", lambda m: m[1] + nav(page, order), body, count=1)
    return local_links(body)


INDEX = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Hook Lab</title><style>{css}</style></head>
<body><main class="hooklab-index">
<h1>Hook Lab</h1>
{intro}
<h2>The lessons</h2>
<ul class="hooklab-map">{rows}</ul>
{guide}{answers}<h2>Run it yourself</h2>
<p>These pages show the notebooks as saved. To run them, move the sliders and check your answers, get the
course and type <code>make lab</code> (Python 3.11, 3.12 or 3.13 and <code>make</code> are all it needs).</p>
</main></body></html>
"""
CSS = """body{font-family:system-ui,sans-serif;line-height:1.5;margin:0;color:#222}
.hooklab-index{max-width:50rem;margin:2rem auto;padding:0 1rem}
.hooklab-map{list-style:none;padding:0}.hooklab-map>li{margin-bottom:1rem}.hooklab-map a{font-weight:600}
.hooklab-map li p{margin:0}.hooklab-map ul{margin:.2rem 0}
.hooklab-guide{list-style:none;padding:0}.hooklab-guide>li{margin-bottom:.4rem}.hooklab-guide a{font-weight:600}
code{background:#f3f3f3;padding:0 .2em}"""


def index_page(source: Path, order: list[tuple[Path, str]]) -> str:
    readme = (source.parent / "README.md").read_text() if (source.parent / "README.md").is_file() else ""
    intro = re.search(r"^# [^\n]*\n+(.*?)\n## ", readme, re.S)
    rows, guide, answers = [], [], []
    for path, page in order:
        title, goals = title_and_goals(nbformat.read(path, as_version=4))
        link = f"<a href='{page}'>{html.escape(title or path.stem)}</a>"
        if page.startswith("solutions/"):
            answers.append(f"<li>{link}</li>")
        elif page.startswith("guide/"):
            guide.append(f"<li>{link}</li>")
        else:
            rows.append(f"<li>{link}{markdown2html_mistune(goals) if goals else ''}</li>")
    if guide:
        guide = ["<h2>Field guide</h2>\n<p>The depth behind the lessons: one kind of hook a notebook, one behaviour a "
                 "section, each marked documented (with a link to PyTorch's documentation) or measured. The lessons "
                 "link to its sections.</p>\n<ul class='hooklab-guide'>", *guide, "</ul>\n"]  # fmt: skip
    if answers:
        answers = ["<h2>Worked answers</h2>\n<p>Try the exercises first: each checks your answer as you go.</p>\n"
                   "<ul>", *answers, "</ul>\n"]  # fmt: skip
    return INDEX.format(css=CSS, intro=markdown2html_mistune(intro[1]) if intro else "", rows="".join(rows),
                        guide="".join(guide), answers="".join(answers))  # fmt: skip


def build(out: Path, source: Path = NOTEBOOKS, answers: bool = True) -> list[Path]:
    """Write the site of the notebooks in ``source`` (lessons; ``guide/`` and ``solutions/`` below
    it) into ``out`` (replaced), with the worked answers or without; return the pages."""
    order = pages(source, answers)
    if not order:
        raise SystemExit(f"no notebooks in {source}: nothing to build")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    exporter = HTMLExporter(template_name="hooklab", extra_template_basedirs=[str(TEMPLATES)])
    main_pages = [page for _, page in order if not page.startswith("solutions/")]
    written = []
    for path, page in order:
        (out / page).parent.mkdir(exist_ok=True)
        (out / page).write_text(render(path, page, main_pages, exporter), encoding="utf-8")
        written.append(out / page)
    (out / "index.html").write_text(index_page(source, order), encoding="utf-8")
    return [out / "index.html", *written]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "site", help="default: artifacts/site")
    parser.add_argument("--no-answers", action="store_true", help="leave out the worked answers (notebooks/solutions)")
    args = parser.parse_args(argv)
    written = build(args.out, answers=not args.no_answers)
    print(f"wrote {len(written)} pages to {args.out} (open {args.out / 'index.html'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

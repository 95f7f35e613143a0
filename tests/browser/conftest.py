"""Fixtures for the real-browser tests: a private JupyterLab server, Debian's Chromium driven by
Playwright (never a downloaded browser), a fresh page per test, screenshots in ``artifacts/``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from . import notebook_page as nb
from .lab import LabServer

ROOT = Path(__file__).resolve().parents[2]
#: The course notebooks the tests open, the longest Run All first: they run side by side.
COURSE_NOTEBOOKS = ("05_explorers_and_applications.ipynb", "00_start_here.ipynb")
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="session")
def lab_root(tmp_path_factory) -> Path:
    """The folder JupyterLab serves: fresh copies of the notebooks go here (JupyterLab autosaves)."""
    return tmp_path_factory.mktemp("lab-root")


@pytest.fixture(scope="session")
def lab(lab_root, tmp_path_factory):
    with LabServer(lab_root, tmp_path_factory.mktemp("lab-home")) as server:  # stopped also on failure
        yield server


@pytest.fixture(scope="session")
def chromium():
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run tools/ensure_browser.sh (make browser does) to install Debian's chromium"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser):
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.set_default_timeout(20_000)
    return page


@pytest.fixture
def page(chromium, request):
    page = new_page(chromium)
    try:
        yield page
    finally:
        screenshot_if_failed(request, [page])
        page.context.close()


@pytest.fixture(scope="session")
def course_pages(lab, lab_root, chromium):
    """Fresh copies of the course notebooks, each in a page of its own, with Run All started in
    all of them at once (the kernels run side by side). Maps notebook name -> (page, copy)."""
    pages = {}
    try:
        for name in COURSE_NOTEBOOKS:
            page = new_page(chromium)
            copy = nb.fresh_copy(ROOT / "notebooks" / name, lab_root)
            pages[name] = (page, copy)
            nb.open_notebook(page, lab.url(nb.notebook_path(copy.name)))
            nb.start_run_all(page)
        yield pages
    finally:
        for page, _ in pages.values():
            page.context.close()


def screenshot_if_failed(request, pages) -> None:
    report = getattr(request.node, "rep_call", None)
    if report is None or not report.failed:
        return
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for i, page in enumerate(pages):
        if not page.is_closed():
            page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-FAILED-{i}.png"))


@pytest.fixture(autouse=True)
def screenshot_course_pages_on_failure(request):
    """When a test that uses the course notebooks fails, a screenshot of each goes to ``artifacts/browser/``."""
    yield
    if "course_pages" in request.node.funcargs:
        screenshot_if_failed(request, [page for page, _ in request.node.funcargs["course_pages"].values()])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """``artifacts/browser/`` in the repository (git-ignored), emptied at the start of a run."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    return ARTIFACTS

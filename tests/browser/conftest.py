"""Fixtures for the real-browser tests: a private JupyterLab server, Debian's Chromium driven by
Playwright (never a downloaded browser), a fresh page per test, screenshots in ``artifacts/``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .lab import LabServer

ROOT = Path(__file__).resolve().parents[2]
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
    server = LabServer(lab_root, tmp_path_factory.mktemp("lab-home"))
    try:
        yield server.start()
    finally:
        server.stop()


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


@pytest.fixture
def page(chromium, request):
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(20_000)
    try:
        yield page
    finally:
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-FAILED.png"), full_page=False)
        context.close()


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

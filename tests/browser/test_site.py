"""The static site (``make site``, tools/build_site.py) in a real Chromium, with the network cut off:
the map leads to every lesson and, once the course has guide notebooks, to the field guide; the
bars and the links in the text lead on (a lesson's link into the guide lands on its section);
and notebook 05's page shows the explorer's picture, drawn from the widget state saved in the
notebook."""

from __future__ import annotations

import re
from pathlib import Path

import build_site  # tools/, on pytest's path
import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser
MATHJAX = "https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js?config=TeX-AMS_CHTML-full,Safe"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    build_site.build(out)
    return out


def offline(page) -> list[str]:
    """Refuse every request that would leave the machine; return the list of those asked for."""
    asked: list[str] = []

    def refuse(route):
        asked.append(route.request.url)
        route.abort()

    page.route(re.compile(r"^https?://"), refuse)
    return asked


def test_the_map_leads_to_every_notebook_and_the_links_lead_on(page, site):
    asked = offline(page)
    page.goto((site / "index.html").as_uri())
    notebooks = page.locator(".hooklab-map > li > a")
    expect(notebooks).to_have_count(len(list(site.glob("0*.html"))))
    notebooks.nth(1).click()
    expect(page).to_have_title(re.compile(r"^01 · "))
    page.locator(".hooklab-nav a", has_text="next").click()
    expect(page).to_have_title(re.compile(r"^02 · "))
    # back to the map, on to 06, whose text links to sections of earlier notebooks
    page.locator(".hooklab-nav a", has_text="Hook Lab").click()
    notebooks.nth(6).click()
    expect(page).to_have_title(re.compile(r"^06 · "))
    section_link = page.locator("main a[href^='0'][href*='.html#']").first
    target = section_link.get_attribute("href")
    section_link.click()
    expect(page).to_have_title(re.compile(rf"^{target[:2]} · "))
    section = page.evaluate("location.hash.slice(1)")
    assert section == target.split("#", 1)[1]
    heading = page.locator(f"[id='{section}'], [id='{page.evaluate('decodeURIComponent(location.hash.slice(1))')}']")
    expect(heading.first).to_be_in_viewport()
    assert set(asked) <= {MATHJAX}  # formulas load MathJax; offline they stay as written


def test_the_map_leads_to_the_field_guide_and_a_lesson_link_lands_on_a_guide_section(page, site):
    guide = sorted((site / "guide").glob("*.html"))
    if not guide:
        pytest.skip("the course has no field guide notebook yet")
    lessons_linking = [p for p in sorted(site.glob("0*.html")) if re.search(r"href=\"guide/[^\"#]+#", p.read_text())]
    asked = offline(page)
    page.goto((site / "index.html").as_uri())
    entries = page.locator(".hooklab-guide > li > a")
    expect(entries).to_have_count(len(guide))
    entries.first.click()
    expect(page).to_have_url(guide[0].as_uri())
    page.locator(".hooklab-nav a", has_text="Hook Lab").click()
    expect(page).to_have_url((site / "index.html").as_uri())
    assert lessons_linking, "no lesson links a section of the field guide"
    page.goto(lessons_linking[0].as_uri())
    section_link = page.locator("main a[href^='guide/'][href*='.html#']").first
    target = section_link.get_attribute("href")
    section_link.click()
    expect(page).to_have_url(re.compile(re.escape((site / target.split("#")[0]).as_uri()) + "#"))
    section = page.evaluate("decodeURIComponent(location.hash.slice(1))")
    heading = page.locator(f"[id='{page.evaluate('location.hash.slice(1)')}'], [id='{section}']")
    expect(heading.first).to_be_in_viewport()
    assert set(asked) <= {MATHJAX}


def test_notebook_05_shows_the_explorer_picture(page, site, artifacts):
    asked = offline(page)
    page.goto((site / "05_explorers_and_applications.html").as_uri())
    # the first widget with a picture: the layer explorer (the training progress bar has none)
    picture = page.locator(".hooklab-widget img").first
    expect(picture).to_be_visible()
    picture.scroll_into_view_if_needed()
    assert picture.evaluate("img => img.complete && img.naturalWidth > 100 && img.naturalHeight > 100")
    page.screenshot(path=str(artifacts / "site-05-explorer.png"))
    assert asked == []

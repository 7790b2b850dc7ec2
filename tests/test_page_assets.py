"""The page's scripts and styles go compressed, its libraries are kept a year under versioned paths, and its
own files are asked again each time (issue 32, item 11: 387 KB uncompressed, no Cache-Control, on every load)."""

import gzip
import urllib.request
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from pocketchat.web.assets import vendor_files
from tests.conftest import AppProcess

pytestmark = pytest.mark.browser


def fetch(app: AppProcess, path: str, **headers: str) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(app.url + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as answer:
        with answer:
            return answer.code, answer.headers, answer.read()


def test_libraries_are_kept_a_year_and_the_pages_own_files_revalidate_both_compressed(app):
    library = next(path for path in vendor_files() if path.endswith("marked.esm.js"))
    status, headers, body = fetch(app, f"/vendor/{library}", **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert b"marked" in gzip.decompress(body)
    status, headers, body = fetch(app, "/static/app.js", **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip" and headers["Cache-Control"] == "no-cache"
    assert fetch(app, "/static/app.js", **{"If-None-Match": headers["ETag"]})[0] == 304
    assert fetch(app, "/static/app.js")[1].get("Content-Encoding") is None  # a client that takes no gzip
    assert fetch(app, "/", **{"Accept-Encoding": "gzip"})[1]["Content-Encoding"] == "gzip"  # the page itself
    # Not the API: its answers hold secrets (a share link's token) beside what a user wrote (BREACH).
    assert fetch(app, "/api/tools", **{"Accept-Encoding": "gzip"})[1].get("Content-Encoding") is None


def resources(page: Any) -> list[dict[str, Any]]:
    """What the page loaded: each script, style and image, with its bytes on the wire and in full."""
    return page.evaluate(
        """performance.getEntriesByType("resource")
            .filter((entry) => /\\/(static|vendor)\\//.test(entry.name))
            .map((entry) => ({name: entry.name, wire: entry.transferSize, body: entry.encodedBodySize,
                              full: entry.decodedBodySize}))"""
    )


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 800}, {"width": 390, "height": 844}])
def test_a_reload_takes_the_libraries_from_the_cache_and_little_else(browser: Browser, app: AppProcess, viewport):
    context = browser.new_context(base_url=app.url, viewport=viewport)
    try:
        page = context.new_page()
        page.goto("/")
        expect(page.locator("#send")).to_be_enabled()
        first = resources(page)
        scripts = [entry for entry in first if entry["name"].endswith((".js", ".mjs", ".css"))]
        assert scripts and all(entry["body"] < entry["full"] for entry in scripts if entry["full"] > 2000)
        page.goto("/")  # not a hard reload: as a person comes back to the page
        expect(page.locator("#send")).to_be_enabled()
        again = resources(page)
        vendor = [entry for entry in again if "/vendor/" in entry["name"]]
        assert vendor and all(entry["wire"] == 0 for entry in vendor)  # from the cache, no request
        # The page's own scripts and styles (an icon Chromium may fetch anew: it is not what this is about).
        own = [entry for entry in again if "/static/" in entry["name"] and entry["name"].endswith((".js", ".css"))]
        assert own and [entry for entry in own if entry["wire"] > 500] == []  # asked again: a 304, headers alone
    finally:
        context.close()

"""The page's weight on the wire: requests and bytes of a first load (an empty cache) and of a second visit,
in Chromium against the app (`python -m bench.page_weight [--root CHECKOUT]`: another checkout's app,
for a before and after in one run)."""

import argparse
import tempfile
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from tests import chromium
from tests.conftest import ROOT, AppProcess

MEASURED = """performance.getEntriesByType("navigation").concat(performance.getEntriesByType("resource"))
    .map((entry) => ({name: entry.name, wire: entry.transferSize, full: entry.decodedBodySize}))"""


def visit(page: object) -> dict[str, int]:
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    entries = page.evaluate(MEASURED)
    asked = [entry for entry in entries if entry["wire"] > 0]  # 0: from the cache, no request
    return {
        "requests": len(asked),
        "wire bytes": sum(entry["wire"] for entry in entries),
        "decoded bytes": sum(entry["full"] for entry in entries),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose app to measure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        app = AppProcess(Path(tmp), ["--provider", "openai", "--base-url", "http://127.0.0.1:9/v1"], root=args.root)
        app.start()
        browser = chromium.launch(playwright)
        try:
            page = browser.new_context(base_url=app.url).new_page()
            first, second = visit(page), visit(page)
        finally:
            browser.close()
            app.kill()
    print("| visit | requests | bytes on the wire | bytes decoded |\n|---|---|---|---|")
    for name, figures in (("first (empty cache)", first), ("second", second)):
        print(f"| {name} | {figures['requests']} | {figures['wire bytes']:,} | {figures['decoded bytes']:,} |")


if __name__ == "__main__":
    main()

"""Take the README's screenshots (docs/screenshots/*.png) of the page against the fake provider.

.venv/bin/python -m docs.make_screenshots      (or: make screenshots)
"""

import tempfile
from pathlib import Path

from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests import chromium
from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAIThread, Reply

OUT = Path(__file__).resolve().parent / "screenshots"
ANSWER = [
    "Here are three ways to reverse a list in Python:\n\n",
    "| way | copies? |\n|---|---|\n| `reversed(xs)` | no, an iterator |\n| `xs[::-1]` | yes |\n",
    "| `xs.reverse()` | no, in place |\n\n",
    "```python\nxs = [1, 2, 3]\nprint(xs[::-1])  # [3, 2, 1]\n```\n\n",
    "Use **slicing** when you need a new list.",
]


def chat(browser: Browser, app: AppProcess, **context: object) -> Page:
    page = browser.new_context(base_url=app.url, **context).new_page()
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    return page


def ask(page: Page, text: str) -> None:
    page.locator("#input").fill(text)
    page.locator("#input").press("Enter")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with FakeOpenAIThread() as fake, tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        app = AppProcess(Path(tmp), ["--base-url", f"http://127.0.0.1:{fake.port}/v1", "--api-key", "sk-demo"])
        app.start()
        browser = chromium.launch(playwright)
        try:
            welcome = chat(browser, app, viewport={"width": 1200, "height": 760})
            welcome.get_by_label("Model").select_option("SmolLM2-135M-Instruct.Q4_1")  # and its notice shows
            expect(welcome.locator("#model-notice")).to_be_visible()
            welcome.screenshot(path=OUT / "welcome.png")
            welcome.context.close()

            for scheme in ("light", "dark"):
                fake.queue(Reply(tokens=ANSWER, reasoning=["The user wants ", "list reversal options."]))
                page = chat(browser, app, color_scheme=scheme, viewport={"width": 1200, "height": 760})
                ask(page, "How do I reverse a list in Python?")
                expect(page.locator("#send")).to_have_text("Send", timeout=10_000)
                page.screenshot(path=OUT / f"{scheme}.png")
                page.context.close()

            fake.queue(Reply(tokens=ANSWER))
            phone = chat(browser, app, viewport={"width": 390, "height": 780}, is_mobile=True)
            ask(phone, "How do I reverse a list in Python?")
            expect(phone.locator("#send")).to_have_text("Send", timeout=10_000)
            phone.screenshot(path=OUT / "phone.png")
            phone.context.close()

            fake.queue(Reply(status=429, message="Rate limit reached for requests. Try again in 20s."))
            fake.queue(*[Reply(status=429, message="Rate limit reached for requests. Try again in 20s.")] * 2)
            failed = chat(browser, app, viewport={"width": 1200, "height": 560})
            ask(failed, "Summarise this page for me")
            expect(failed.get_by_role("button", name="Retry")).to_be_visible(timeout=10_000)
            failed.screenshot(path=OUT / "error.png")
            failed.context.close()

            fake.queue(Reply(tokens=[word + " " for word in ("Streaming " * 400).split()], pace=0.03))
            streaming = chat(browser, app, viewport={"width": 1200, "height": 560})
            ask(streaming, "Write me a long poem")
            expect(streaming.locator(".message.assistant .body")).to_contain_text("Streaming " * 30)
            streaming.screenshot(path=OUT / "streaming.png")
            streaming.context.close()

            fake.queue(Reply(tokens=["Slice it: `xs[::-1]` gives a reversed copy."]), Reply(tokens=ANSWER))
            versions = chat(browser, app, viewport={"width": 1200, "height": 620})
            ask(versions, "How do I reverse a list in Python?")
            versions.get_by_role("button", name="Regenerate").click(timeout=10_000)
            expect(versions.locator(".versions-count")).to_have_text("2/2", timeout=10_000)
            expect(versions.locator("#send")).to_have_text("Send", timeout=10_000)
            versions.screenshot(path=OUT / "versions.png")
            versions.context.close()
            # The conversations above, found again with the palette (Ctrl+K).
            searching = chat(browser, app, viewport={"width": 1200, "height": 560})
            searching.keyboard.press("Control+k")
            searching.keyboard.type("reverse pyth")
            expect(searching.locator("#palette-results [role=option]")).to_have_count(4)
            searching.screenshot(path=OUT / "search.png")
            searching.context.close()
        finally:
            browser.close()
            app.kill()
    print(f"screenshots written to {OUT}")


if __name__ == "__main__":
    main()

"""Take the README's screenshots (docs/screenshots/*.png) of the page against the fake provider.

.venv/bin/python -m docs.make_screenshots      (or: make screenshots)
"""

import tempfile
from datetime import datetime, timedelta
from pathlib import Path

from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests import chromium
from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAIThread, Reply
from tests.test_import import imported
from tests.test_page_sidebar import chatgpt_file

OUT = Path(__file__).resolve().parent / "screenshots"
ANSWER = [
    "Here are three ways to reverse a list in Python:\n\n",
    "| way | copies? |\n|---|---|\n| `reversed(xs)` | no, an iterator |\n| `xs[::-1]` | yes |\n",
    "| `xs.reverse()` | no, in place |\n\n",
    "```python\nxs = [1, 2, 3]\nprint(xs[::-1])  # [3, 2, 1]\n```\n\n",
    "Use **slicing** when you need a new list.",
]
TABLE = [
    "The three ways side by side:\n\n",
    "| Way | Returns | Copies | Speed | Use it when |\n|---|---|---|---|---|\n",
    "| `xs[::-1]` | a new list | yes | fast | you need a reversed copy |\n",
    "| `reversed(xs)` | an iterator | no | fastest | you loop over it once |\n",
    "| `xs.reverse()` | None | no, in place | fast | the original can change |\n",
]
CODE = [
    "A palindrome reads the same both ways, so compare the word with its reverse:\n\n",
    "```python\ndef is_palindrome(word: str) -> bool:\n",
    '    """Whether `word` reads the same backwards, ignoring case."""\n',
    "    letters = word.casefold()\n    return letters == letters[::-1]\n\n\n",
    'print(is_palindrome("Level"))  # True\n```\n\n',
    "And in the shell:\n\n```bash\npython -c 'print(\"level\"[::-1])'\n```\n",
]
# A sidebar that has lived a while: (title, hours ago).
HISTORY = [
    ("Fix the flaky upload test", 2), ("Weekend in Lisbon with the kids", 5), ("Sourdough starter schedule", 30),
    ("Compare two job offers", 75), ("Bike gears skipping", 130), ("Tax return checklist", 300),
    ("Birthday party ideas", 600), ("Learn Rust ownership", 1500), ("Garden plan for spring", 2600),
]  # fmt: skip


def chat(browser: Browser, app: AppProcess, **context: object) -> Page:
    page = browser.new_context(base_url=app.url, **context).new_page()
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    return page


def ask(page: Page, text: str) -> None:
    page.locator("#input").fill(text)
    page.locator("#input").press("Enter")


def answered(page: Page) -> None:
    expect(page.locator(".message.assistant[data-status=complete]")).to_have_count(1, timeout=10_000)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with FakeOpenAIThread() as fake, tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        app = AppProcess(Path(tmp), ["--base-url", f"http://127.0.0.1:{fake.port}/v1", "--api-key", "sk-demo"])
        app.start()
        now = datetime.now().astimezone()
        imported(app, chatgpt_file([(title, now - timedelta(hours=hours)) for title, hours in HISTORY]))
        browser = chromium.launch(playwright)
        try:
            welcome = chat(browser, app, viewport={"width": 1200, "height": 760})
            welcome.get_by_label("Model").select_option("SmolLM2-135M-Instruct.Q4_1")  # and its notice shows
            expect(welcome.locator("#model-notice")).to_be_visible()
            welcome.screenshot(path=OUT / "welcome.png")
            welcome.context.close()

            # The sidebar: conversations by date, a row's ⋯ menu open.
            sidebar = chat(browser, app, viewport={"width": 1200, "height": 700})
            sidebar.get_by_role("button", name="Weekend in Lisbon with the kids", exact=True).click()
            expect(sidebar.locator("#title")).to_have_text("Weekend in Lisbon with the kids")
            sidebar.get_by_role("button", name="Actions for “Sourdough starter schedule”").click()
            expect(sidebar.get_by_role("menuitem", name="Rename")).to_be_focused()
            sidebar.screenshot(path=OUT / "sidebar.png")
            sidebar.context.close()

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
            # A code block says its language; its Copy button sits above the code.
            fake.queue(Reply(tokens=CODE))
            code = chat(browser, app, viewport={"width": 1200, "height": 700})
            ask(code, "Write a Python function that tells whether a word is a palindrome")
            answered(code)
            code.screenshot(path=OUT / "code.png")
            code.context.close()

            # A phone: a wide table scrolls sideways, the message box has the room.
            fake.queue(Reply(tokens=TABLE))
            table = chat(browser, app, viewport={"width": 390, "height": 780}, is_mobile=True, has_touch=True)
            ask(table, "Compare the ways to reverse a list")
            answered(table)
            table.locator("#input").fill("Which one is fastest?")
            table.screenshot(path=OUT / "phone-table.png")
            table.context.close()

            # The conversations above, found again with the palette (Ctrl+K).
            searching = chat(browser, app, viewport={"width": 1200, "height": 560})
            searching.keyboard.press("Control+k")
            searching.keyboard.type("reverse pyth")
            # The four questions above, and the palindrome's code (it says "reverse").
            expect(searching.locator("#palette-results [role=option]")).to_have_count(5)
            searching.screenshot(path=OUT / "search.png")
            searching.context.close()
        finally:
            browser.close()
            app.kill()
    print(f"screenshots written to {OUT}")


if __name__ == "__main__":
    main()

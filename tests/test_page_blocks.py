"""Tables and code blocks in a reply, in real Chromium against the app and the fake provider, on a
desktop (1280x800) and a phone (390x844): a wide table scrolls sideways and never breaks a word; a
code block says its language, and its Copy button sits in a bar above the code, never over it."""

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_page import PageUnderTest, replies, send, wait_done
from tests.test_page_composer import SCREENS
from tests.test_page_welcome import AXE

pytestmark = pytest.mark.browser
TABLE = """Ways to sort a list in Python:

| Method | Returns | Stable | In place | Complexity | Notes |
|---|---|---|---|---|---|
| sorted(xs) | a new list | Stable | no | O(n log n) | works on any iterable |
| xs.sort() | None | Stable | yes | O(n log n) | lists only |
| heapq.nsmallest | a new list | Unstable | no | O(n log k) | the k smallest |
"""
CODE = """Here it is:

```python
def reverse_words(sentence: str) -> str:  # a first line long enough to reach the Copy button on a phone
    return " ".join(reversed(sentence.split()))
```

And the output, unlabelled:

```
dlrow olleh
```
"""
# The words of each cell that the browser drew over more than one line.
BROKEN_WORDS = """(table) => {
  const broken = [];
  for (const cell of table.querySelectorAll("th, td")) {
    const text = cell.firstChild;
    for (const match of text.textContent.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(text, match.index);
      range.setEnd(text, match.index + match[0].length);
      if (new Set([...range.getClientRects()].map((rect) => Math.round(rect.top))).size > 1) broken.push(match[0]);
    }
  }
  return broken;
}"""


@pytest.fixture(params=[(screen, scheme) for screen in SCREENS for scheme in ("light", "dark")], ids=str)
def page(request: pytest.FixtureRequest, browser: Browser, app: AppProcess) -> Iterator[Page]:
    screen, scheme = request.param
    under_test = PageUnderTest(browser, app, color_scheme=scheme, **SCREENS[screen])
    under_test.context.add_init_script(path=AXE)
    yield under_test.open()
    under_test.context.close()
    assert under_test.errors == []


def test_a_wide_table_scrolls_sideways_and_breaks_no_word(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(tokens=[TABLE]))
    send(page, "How do I sort a list?")
    wait_done(page)
    table = replies(page).last.locator("table")
    assert table.evaluate(BROKEN_WORDS) == []
    width = page.viewport_size["width"]
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # the page itself does not scroll
    if width < 720:  # too wide for a phone: the table scrolls, and its last column can be reached
        assert table.evaluate("(t) => t.scrollWidth > t.clientWidth")
        table.evaluate("(t) => { t.scrollLeft = t.scrollWidth; }")
        expect(table.locator("td").last).to_be_in_viewport(ratio=1)
    assert axe_violations(page) == []


def axe_violations(page: Page) -> list[str]:
    """What axe-core finds wrong in the last reply (WCAG A and AA: the colours, a region the keyboard cannot scroll)."""
    found = page.evaluate(
        "async () => (await axe.run('.message.assistant', {runOnly: ['wcag2a', 'wcag2aa']})).violations"
    )
    return [f"{violation['id']} {[node['target'] for node in violation['nodes']]}" for violation in found]


# The box of a code block's first line of text, as far as it is shown (the block scrolls sideways).
FIRST_LINE = """(code) => {
  const range = document.createRange();
  range.selectNodeContents(code);
  const rects = [...range.getClientRects()].filter((rect) => rect.width > 0);
  const line = rects.filter((rect) => Math.abs(rect.top - rects[0].top) < 2);
  const shown = code.closest("pre").getBoundingClientRect();
  const left = Math.min(...line.map((rect) => rect.left));
  const right = Math.min(Math.max(...line.map((rect) => rect.right)), shown.right);
  return { x: left, y: rects[0].top, width: right - left, height: rects[0].height };
}"""


def overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and \
        a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]  # fmt: skip


def test_a_code_block_says_its_language_and_its_copy_button_covers_no_code(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(tokens=[CODE]))
    send(page, "Reverse the words of a sentence")
    wait_done(page)
    blocks = replies(page).last.locator(".code-block")
    expect(blocks).to_have_count(2)
    expect(blocks.locator(".code-language")).to_have_text(["python", "text"])
    for index in range(2):
        block = blocks.nth(index)
        copy = block.get_by_role("button", name="Copy code")
        expect(copy).to_be_in_viewport(ratio=1)
        first_line = block.locator("code").evaluate(FIRST_LINE)
        assert not overlap(copy.bounding_box(), first_line), "the Copy button covers the code"
    assert axe_violations(page) == []

"""The message box, in real Chromium against the app and the fake provider, on a desktop (1280x800) and a
phone (390x844): after a stop the Regenerate row stays in view above the box, whatever one types."""

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_page import PageUnderTest, replies, send, wait_done

pytestmark = pytest.mark.browser
DESKTOP = {"viewport": {"width": 1280, "height": 800}}
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
SCREENS = {"desktop": DESKTOP, "phone": PHONE}
LONG_REPLY = Reply(tokens=[f"line {i} of a long answer\n\n" for i in range(600)], pace=0.02)


@pytest.fixture(params=list(SCREENS))
def page(request: pytest.FixtureRequest, browser: Browser, app: AppProcess) -> Iterator[Page]:
    under_test = PageUnderTest(browser, app, **SCREENS[request.param])
    yield under_test.open()
    under_test.context.close()
    assert under_test.errors == []


def test_after_a_stop_the_regenerate_row_stays_in_view_above_the_box(page: Page, fake: FakeOpenAI):
    fake.queue(LONG_REPLY)
    send(page, "Tell me a long story")
    expect(replies(page).last.locator(".body")).to_contain_text("line 30")
    page.locator("#send").click()
    wait_done(page)
    regenerate = replies(page).last.get_by_role("button", name="Regenerate")
    expect(regenerate).to_be_in_viewport(ratio=1)
    expect(page.get_by_role("button", name="Jump to latest ↓")).to_be_hidden()
    # A long follow-up typed after the stop grows the box, and the view above it shrinks.
    page.locator("#input").press_sequentially("A follow-up question, " * 12)
    for _ in range(3):
        page.locator("#input").press("Shift+Enter")
    page.wait_for_timeout(100)  # a frame or two: what moves the view has moved it
    bottom = page.locator("#scroller").bounding_box()
    row = regenerate.bounding_box()
    assert row["y"] + row["height"] <= bottom["y"] + bottom["height"], "the Regenerate row is under the message box"
    expect(page.get_by_role("button", name="Jump to latest ↓")).to_be_hidden()

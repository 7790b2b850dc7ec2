"""The message box, in real Chromium against the app and the fake provider, on a desktop (1280x800) and a
phone (390x844): Enter while a reply streams keeps the message and stops nothing; the box has the room
on a phone; after a stop the Regenerate row stays in view above the box, whatever one types."""

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


def test_enter_while_a_reply_streams_keeps_the_message_and_stops_nothing(page: Page, fake: FakeOpenAI):
    fake.queue(LONG_REPLY, Reply(tokens=["the answer to the follow-up"]))
    send(page, "Tell me a long story")
    reply = replies(page).last
    expect(reply.locator(".body")).to_contain_text("line 3")
    page.locator("#input").fill("and a follow-up")
    page.locator("#input").press("Enter")
    expect(reply.locator(".body")).to_contain_text("line 12")  # still streaming: it was not stopped
    expect(reply).to_have_attribute("data-status", "streaming")
    expect(page.locator("#input")).to_have_value("and a follow-up")
    expect(page.locator(".message.user")).to_have_count(1)
    expect(page.locator("#composer-hint")).to_contain_text("your message waits here")  # and the page says so
    expect(page.locator("#composer-hint")).to_be_in_viewport()
    page.keyboard.press("Escape")  # Escape (or the Stop button) alone stops it
    wait_done(page)
    expect(reply).to_have_attribute("data-status", "stopped")
    expect(page.locator("#composer-hint")).to_be_hidden()
    page.locator("#input").press("Enter")  # and now Enter sends what waited
    wait_done(page, count=2)
    expect(page.locator(".message.user .body").last).to_have_text("and a follow-up")
    expect(page.locator("#input")).to_have_value("")
    assert fake.hangups == 1


# The width the placeholder's text takes in the box's font, and the room the box has for it.
PLACEHOLDER_ROOM = """(box) => {
  const style = getComputedStyle(box);
  const context = document.createElement("canvas").getContext("2d");
  context.font = `${style.fontSize} ${style.fontFamily}`;
  const room = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return [context.measureText(box.placeholder).width, room];
}"""


def test_the_message_box_has_the_room_and_its_placeholder_shows_whole(page: Page):
    box = page.locator("#input")
    text_width, room = box.evaluate(PLACEHOLDER_ROOM)
    assert text_width <= room, f"the placeholder needs {text_width:.0f} px, the box has {room:.0f}"
    width = page.viewport_size["width"]
    assert box.bounding_box()["width"] >= 0.65 * min(width, 832), box.bounding_box()  # 832: the column's width
    for name in ("Attach a file", "Send message"):
        button = page.get_by_role("button", name=name)
        expect(button).to_be_in_viewport(ratio=1)
        size = button.bounding_box()
        assert width > 720 or (size["width"] >= 44 and size["height"] >= 44), (name, size)  # a finger's size


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
    expect(regenerate).to_be_in_viewport(ratio=1)  # not scrolled out of the view, under the box
    expect(page.get_by_role("button", name="Jump to latest ↓")).to_be_hidden()

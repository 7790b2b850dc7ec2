"""Versions in the page, in real Chromium: a regenerated reply shows `< 3/3 >`, its arrows show the other
versions in every tab (and after a reload), and an edit of an earlier message branches from there."""

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_page import PageUnderTest, replies, send, wait_done

pytestmark = pytest.mark.browser


@pytest.fixture
def tabs(browser: Browser, app: AppProcess) -> Iterator[PageUnderTest]:
    """Tabs of one browser on the app: a tab opened after another shows the conversation it shows."""
    tabs = PageUnderTest(browser, app)
    yield tabs
    tabs.context.close()
    assert tabs.errors == []


def shows(page: Page, reply: str, count: str) -> None:
    """The last reply on the page is `reply`, and its place among its versions `count` (`2/3`)."""
    expect(replies(page).last.locator(".body")).to_have_text(reply)
    expect(replies(page).last.locator(".versions-count")).to_have_text(count)


def test_a_switch_between_versions_shows_in_the_other_tab_and_after_a_reload(tabs: PageUnderTest, fake: FakeOpenAI):
    fake.queue(*(Reply(tokens=[f"{n} answer"]) for n in ("first", "second", "third")))
    page = tabs.open()
    send(page, "question")
    wait_done(page)
    other = tabs.open()  # the same conversation: the page remembers it
    expect(replies(other).last.locator(".body")).to_have_text("first answer")
    expect(replies(other).last.locator(".versions")).to_be_hidden()  # one version: no arrows
    for answer in ("second answer", "third answer"):
        replies(page).last.get_by_role("button", name="Regenerate").click()
        expect(replies(page).last.locator(".body")).to_have_text(answer)
        wait_done(page)
    shows(page, "third answer", "3/3")
    shows(other, "third answer", "3/3")
    expect(replies(page).last.get_by_role("button", name="Next version")).to_be_disabled()

    replies(page).last.get_by_role("button", name="Previous version").click()
    shows(page, "second answer", "2/3")
    shows(other, "second answer", "2/3")
    replies(other).last.get_by_role("button", name="Previous version").click()
    shows(other, "first answer", "1/3")
    shows(page, "first answer", "1/3")
    page.reload()
    shows(page, "first answer", "1/3")
    expect(page.locator(".message.user")).to_have_count(1)


def test_an_edit_of_an_earlier_message_branches_from_there(tabs: PageUnderTest, fake: FakeOpenAI):
    fake.queue(*(Reply(tokens=[text]) for text in ("about cats", "more cats", "about dogs")))
    page = tabs.open()
    send(page, "tell me about cats")
    wait_done(page)
    send(page, "more")
    wait_done(page, 2)
    page.locator(".message.user").first.get_by_role("button", name="Edit").click()
    page.get_by_label("Edit your message").fill("tell me about dogs")
    page.get_by_role("button", name="Send edited").click()
    wait_done(page)
    expect(page.locator(".message.user .body")).to_have_text(["tell me about dogs"])
    expect(page.locator(".message.user .versions-count")).to_have_text("2/2")
    expect(replies(page).locator(".body")).to_have_text(["about dogs"])
    assert fake.chat_requests[-1]["json"]["messages"][1:] == [{"role": "user", "content": "tell me about dogs"}]
    # The first version comes back with what followed it.
    page.locator(".message.user").get_by_role("button", name="Previous version").click()
    expect(page.locator(".message.user .body")).to_have_text(["tell me about cats", "more"])
    expect(replies(page).locator(".body")).to_have_text(["about cats", "more cats"])
    expect(page.locator(".message.user .versions-count")).to_have_text(["1/2"])

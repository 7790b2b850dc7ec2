"""Search in the page, in real headless Chromium: the sidebar's box and the Ctrl+K palette, a hit opening
its conversation at its message, and a snippet shown as text however much it looks like markup."""

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_page import PageUnderTest

pytestmark = pytest.mark.browser

ATTACK = "the xylophone <img src=x onerror=window.__xss=1> <b>loud</b>"
LONG_REPLY = ["A paragraph of filler text that takes room.\n\n"] * 30


@pytest.fixture
def conversations(app: AppProcess, fake: FakeOpenAI) -> dict[str, str]:
    """Two conversations, long enough to scroll: `music` (with the attack at its 3rd message of 40) and
    `zoo` (a zebra at its 31st of 40). Made over the socket before the page opens."""
    made = {}
    for name, words in (("music", {2: ATTACK}), ("zoo", {30: "where does the zebra sleep"})):
        client = app.client()
        made[name] = client.hello()["conversation_id"]
        for n in range(0, 40, 2):
            fake.queue(Reply(tokens=LONG_REPLY))
            assert client.turn(words.get(n, f"{name} question {n}"))[-1]["status"] == "complete"
        client.close()
    return made


@pytest.fixture
def page(browser: Browser, app: AppProcess, conversations: dict[str, str]) -> Iterator[Page]:
    under_test = PageUnderTest(browser, app)
    yield under_test.open()
    under_test.context.close()
    assert under_test.errors == []


def message_id(app: AppProcess, conversation_id: str, index: int) -> str:
    return app.get(f"/api/conversations/{conversation_id}")["messages"][index]["id"]


def test_typing_in_the_sidebar_shows_highlighted_hits_and_a_click_opens_the_message(page, app, conversations):
    box = page.get_by_role("searchbox", name="Search conversations")
    box.press_sequentially("xyloph", delay=20)
    hit = page.locator("#search-results .hit")
    expect(hit).to_have_count(1)
    expect(page.locator("#conversation-list")).to_be_hidden()
    expect(hit.locator("mark")).to_have_text(["xylophone"])
    # The snippet's markup is text: no element made of it, no script run.
    expect(hit.locator(".hit-snippet")).to_contain_text("<img src=x onerror=window.__xss=1> <b>loud</b>")
    assert hit.locator("img, b").count() == 0
    hit.click()
    target = page.locator(f'.message[data-id="{message_id(app, conversations["music"], 2)}"]')
    expect(target).to_be_in_viewport()
    expect(target).to_have_class(re.compile(r"\bfound\b"))
    expect(page.locator("#title")).to_have_text("music question 0")
    assert page.evaluate("window.__xss") is None
    box.press("Escape")
    expect(box).to_have_value("")
    expect(page.locator("#conversation-list")).to_be_visible()
    expect(page.locator("#search-results")).to_be_hidden()


def test_the_palette_works_from_the_keyboard_alone(page, app, conversations):
    page.locator("#input").focus()
    page.keyboard.press("Control+k")
    dialog = page.get_by_role("dialog", name="Search conversations")
    expect(dialog).to_be_visible()
    combobox = page.get_by_role("combobox", name="Search conversations")
    expect(combobox).to_be_focused()
    page.keyboard.type("question")
    options = dialog.get_by_role("option")
    expect(options).to_have_count(2)  # each conversation once, at its best message
    expect(options.first).to_have_attribute("aria-selected", "true")
    page.keyboard.press("ArrowDown")
    expect(options.nth(1)).to_have_attribute("aria-selected", "true")
    expect(combobox).to_have_attribute("aria-activedescendant", "palette-option-1")
    page.keyboard.press("ArrowDown")  # around to the first again
    expect(options.first).to_have_attribute("aria-selected", "true")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(page.locator("#input")).to_be_focused()  # back where it was
    # Another part of the page (the shortcuts list) opens it with an event.
    page.evaluate("document.dispatchEvent(new CustomEvent('pocketchat:search'))")
    expect(combobox).to_be_focused()
    page.keyboard.type("zebra")
    expect(options).to_have_count(1)
    expect(options.locator("mark")).to_have_text(["zebra"])
    page.keyboard.press("Enter")
    expect(dialog).to_be_hidden()
    target = page.locator(f'.message[data-id="{message_id(app, conversations["zoo"], 30)}"]')
    expect(target).to_be_in_viewport()
    expect(target).to_have_class(re.compile(r"\bfound\b"))
    expect(page.locator("#input")).to_be_focused()


def test_a_hit_on_a_version_not_shown_shows_its_branch(browser: Browser, app: AppProcess, fake: FakeOpenAI):
    client = app.client()
    conversation_id = client.hello()["conversation_id"]
    fake.queue(Reply(tokens=["The gannet dives for fish."]))
    client.turn("Which seabird dives?")
    fake.queue(Reply(tokens=["A pelican, sometimes."]))
    client.send("regenerate")
    client.until("turn_end")
    client.close()
    first = app.get(f"/api/conversations/{conversation_id}")
    under_test = PageUnderTest(browser, app)
    page = under_test.open()
    box = page.get_by_role("searchbox", name="Search conversations")
    reply = page.locator(".message.assistant")
    # The hit is the earlier version of the reply: the page opens the conversation, asks for the hit's
    # branch and shows it there; then, in the same conversation, the other way round.
    for word, count in (("gannet", "1/2"), ("pelican", "2/2")):
        box.fill("")
        box.press_sequentially(word, delay=20)
        page.locator("#search-results .hit").filter(has_text=word).click()
        expect(reply).to_have_text(re.compile(word))
        expect(reply.locator(".versions-count")).to_have_text(count)
        expect(reply).to_have_class(re.compile(r"\bfound\b"))
    assert app.get(f"/api/conversations/{conversation_id}")["messages"] == first["messages"]
    under_test.context.close()
    assert under_test.errors == []


def test_a_search_over_the_limit_is_said_in_the_servers_words(browser: Browser, start_app):
    app = start_app("--limit-searches-per-minute", "2")
    under_test = PageUnderTest(browser, app)
    page = under_test.open()
    box = page.get_by_role("searchbox", name="Search conversations")
    status = page.locator("#search-status")
    for query, answered in (("apple", 200), ("banana", 200), ("cherry", 429)):
        # Each query's own answer (the box waits for typing to pause: a status could be the last one's).
        with page.expect_response(lambda response, query=query: f"q={query}" in response.url) as response:
            box.fill(query)
        assert response.value.status == answered
    expect(status).to_have_text("Search failed: You searched 2 times in the last minute; wait a moment.")
    under_test.context.close()
    assert under_test.errors == []

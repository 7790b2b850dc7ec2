"""Share links in real headless Chromium: the owner's share dialog (make, copy, list, revoke) and the
read-only page a visitor opens, where markup in the snapshot runs nothing and loads nothing."""

import pytest
from playwright.sync_api import Browser, expect

from tests.conftest import AppProcess
from tests.fake_openai import Reply
from tests.test_page import XSS, PageUnderTest, menu_item, send, wait_done

pytestmark = pytest.mark.browser


@pytest.fixture
def owner(browser: Browser, app: AppProcess):
    under_test = PageUnderTest(browser, app, permissions=["clipboard-read", "clipboard-write"])
    yield under_test
    under_test.context.close()
    assert under_test.errors == []


@pytest.fixture
def visitor(browser: Browser, app: AppProcess):
    """Another browser, with no session: the one a link is sent to."""
    under_test = PageUnderTest(browser, app)
    yield under_test
    under_test.context.close()
    assert under_test.errors == []


def test_the_owner_makes_copies_lists_and_revokes_a_link(owner: PageUnderTest, visitor: PageUnderTest, fake):
    page = owner.open()
    fake.queue(Reply(tokens=["**Bold** ", "answer"]))
    send(page, "a question")
    wait_done(page)
    dialog = page.locator("#share-dialog")
    menu_item(page, "Share…").click()
    expect(dialog.locator(".share-list")).to_have_text("No links yet.")
    dialog.get_by_role("button", name="Make a link").click()
    link = dialog.get_by_label("New link")
    expect(link).not_to_have_value("")
    url = link.input_value()
    assert url.startswith(f"{owner.app.url}/s/")
    dialog.get_by_role("button", name="Copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == url
    expect(dialog.locator(".share-item")).to_have_count(1)
    expect(dialog.locator(".share-item")).to_contain_text("Made ")

    shared = visitor.context.new_page()
    shared.on("pageerror", lambda error: visitor.errors.append(str(error)))
    shared.goto(url)
    expect(shared.locator("h1")).to_have_text("a question")
    expect(shared.locator(".message.user .body")).to_have_text("a question")
    expect(shared.locator(".message.assistant .body strong")).to_have_text("Bold")

    dialog.get_by_role("button", name="Revoke the link made").click()
    expect(dialog.locator(".share-list")).to_have_text("No links yet.")
    assert shared.goto(url).status == 404


def test_markup_in_a_snapshot_runs_nothing_and_loads_nothing(owner: PageUnderTest, visitor: PageUnderTest, fake):
    page = owner.open()
    fake.queue(Reply(tokens=[XSS[i : i + 40] for i in range(0, len(XSS), 40)]))
    send(page, XSS)
    wait_done(page)
    menu_item(page, "Share…").click()
    page.locator("#share-dialog").get_by_role("button", name="Make a link").click()
    link = page.locator("#share-dialog").get_by_label("New link")
    expect(link).not_to_have_value("")

    shared = visitor.context.new_page()
    requests: list[str] = []
    shared.on("request", lambda request: requests.append(request.url))
    shared.on("pageerror", lambda error: visitor.errors.append(str(error)))
    shared.on("dialog", lambda dialog: (visitor.dialogs.append(dialog.message), dialog.dismiss()))
    shared.goto(link.input_value())
    transcript = shared.locator("#transcript")
    expect(transcript.locator(".message")).to_have_count(2)
    for anchor in transcript.locator("a").all():
        anchor.click(modifiers=["Shift"]) if anchor.get_attribute("href") else anchor.click()
    expect(transcript.locator("img, script, iframe, svg, style")).to_have_count(0)
    expect(transcript.locator("a[href^='javascript' i]")).to_have_count(0)
    expect(shared.locator(".message.user .body")).to_have_text(XSS)
    assert shared.evaluate("window.pwned") is None
    assert visitor.dialogs == []
    # The page asked for its snapshot and its own files, nothing of the app's API, no socket.
    app_requests = [url.removeprefix(visitor.app.url) for url in requests if url.startswith(visitor.app.url)]
    assert not any(path.startswith(("/api/conversations", "/ws", "/api/models")) for path in app_requests)
    assert all(url.startswith(visitor.app.url) for url in requests), requests
    assert shared.context.cookies() == []

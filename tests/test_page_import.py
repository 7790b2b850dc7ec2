"""Import and JSON export in the page, in real Chromium against the app: a ChatGPT file picked with
Import…, its progress shown, its conversations listed and opened; a message in one still being imported
kept in its box with why; a bad file's reason said; the Export JSON link gives our format."""

import pytest
from playwright.sync_api import Page, expect

from tests.test_import import trips
from tests.test_page import send
from tests.test_page_documents import opened

pytestmark = pytest.mark.browser


def pick(page: Page, name: str, data: bytes) -> None:
    with page.expect_file_chooser() as chooser:
        page.locator("#import").click()
    chooser.value.set_files({"name": name, "mimeType": "application/json", "buffer": data})


def test_a_chatgpt_file_is_imported_with_its_progress_shown_and_listed(browser, start_app):
    app = start_app()
    with opened(browser, app) as page:
        pick(page, "conversations.json", trips(300))
        status = page.locator("#import-status")
        expect(status).to_contain_text("Importing:", timeout=20_000)
        expect(status).to_contain_text("Imported 300 conversations.", timeout=60_000)
        expect(status).to_contain_text("tool calls")
        expect(page.locator("#conversation-list li")).to_have_count(300)
        page.get_by_role("button", name="Trip 7", exact=True).click()
        expect(page.locator("#title")).to_have_text("Trip 7")
        expect(page.locator("#transcript")).to_contain_text("Plan a weekend in Lisbon")
        href = page.locator("#export-json").get_attribute("href")
        assert href and href.endswith("/export.json")
        exported = page.evaluate("async (url) => (await fetch(url)).json()", href)
        assert exported["format"] == "pocketchat.conversation" and len(exported["messages"]) == 7


def test_a_message_or_edit_in_a_conversation_still_being_imported_is_kept_with_why(browser, start_app):
    app = start_app()
    with opened(browser, app) as page:
        pick(page, "conversations.json", trips(1500))
        page.get_by_role("button", name="Trip 0", exact=True).click()  # listed as soon as it is written
        expect(page.locator("#title")).to_have_text("Trip 0")
        send(page, "Can we add Porto?")
        notice = page.locator(".message.notice-only .notice")
        expect(notice).to_contain_text("still being imported")
        expect(page.locator("#input")).to_have_value("Can we add Porto?")
        page.locator(".message.user").first.get_by_role("button", name="Edit").click()
        page.get_by_label("Edit your message").fill("Plan a weekend in Porto")
        page.get_by_role("button", name="Send edited").click()
        expect(notice.last).to_contain_text("still being imported")
        expect(page.get_by_label("Edit your message")).to_have_value("Plan a weekend in Porto")  # not lost
        expect(page.locator("#input")).to_have_value("Can we add Porto?")
        expect(page.locator("#import-status")).to_contain_text("Importing:")  # while it ran
        expect(page.locator("#transcript")).not_to_contain_text("Can we add Porto?", use_inner_text=True)


def test_a_bad_file_is_refused_with_its_reason(browser, start_app):
    app = start_app()
    with opened(browser, app) as page:
        pick(page, "notes.json", b"{not json")
        status = page.locator("#import-status")
        expect(status).to_contain_text("could not be imported: The file is not JSON")
        expect(status).to_have_class("import-status warning")
        expect(page.locator("#conversation-list li")).to_have_count(0)

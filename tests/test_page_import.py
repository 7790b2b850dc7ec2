"""Import and JSON export in the page, in real Chromium against the app: a ChatGPT file picked with
Import…, its progress shown, its conversations listed and opened; a bad file's reason said; the Export
JSON link gives our format."""

import json
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.test_page_documents import opened

pytestmark = pytest.mark.browser

CHATGPT = Path(__file__).parent / "files" / "chatgpt_conversations.json"


def pick(page: Page, name: str, data: bytes) -> None:
    with page.expect_file_chooser() as chooser:
        page.locator("#import").click()
    chooser.value.set_files({"name": name, "mimeType": "application/json", "buffer": data})


def test_a_chatgpt_file_is_imported_with_its_progress_shown_and_listed(browser, start_app):
    app = start_app()
    lisbon = json.loads(CHATGPT.read_text())[0]
    many = [lisbon | {"title": f"Trip {number}"} for number in range(300)]
    with opened(browser, app) as page:
        pick(page, "conversations.json", json.dumps(many).encode())
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


def test_a_bad_file_is_refused_with_its_reason(browser, start_app):
    app = start_app()
    with opened(browser, app) as page:
        pick(page, "notes.json", b"{not json")
        status = page.locator("#import-status")
        expect(status).to_contain_text("could not be imported: The file is not JSON")
        expect(status).to_have_class("import-status warning")
        expect(page.locator("#conversation-list li")).to_have_count(0)

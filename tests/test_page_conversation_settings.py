"""A conversation's settings in real headless Chromium: set, refused out of range, cleared, beside the
system prompt. (Apart from tests/test_conversation_settings.py: a module with a browser holds an event
loop on its thread, which the PostgreSQL fixtures of the other mode cannot share.)"""

import pytest
from playwright.sync_api import expect

from tests.test_page import menu_item

pytestmark = pytest.mark.browser


def test_the_page_sets_and_clears_settings_beside_the_system_prompt(browser, app, fake):
    context = browser.new_context(base_url=app.url)
    page = context.new_page()
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    dialog = page.locator("#system-prompt-dialog")
    menu_item(page, "System prompt…").click()
    dialog.get_by_label("Temperature").fill("0.3")
    dialog.get_by_label("Max tokens").fill("50")
    dialog.get_by_role("button", name="Save").click()
    summary = page.locator("#system-prompt-summary")
    expect(summary).to_contain_text("temperature 0.3, max tokens 50")
    # Out of range: the browser keeps the dialog open, and Cancel changes nothing.
    menu_item(page, "System prompt…").click()
    expect(dialog.get_by_label("Temperature")).to_have_value("0.3")
    dialog.get_by_label("Top p").fill("3")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    # An emptied field goes back to the default.
    menu_item(page, "System prompt…").click()
    dialog.get_by_label("Temperature").fill("")
    dialog.get_by_role("button", name="Save").click()
    expect(summary).to_have_text("System prompt: You are a helpful assistant. · max tokens 50")
    page.locator("#input").fill("hello")
    page.locator("#input").press("Enter")
    expect(page.locator(".message.assistant[data-status=complete]")).to_have_count(1)
    sent = fake.chat_requests[-1]["json"]
    assert sent["max_tokens"] == 50 and "temperature" not in sent and "top_p" not in sent
    context.close()

"""The flow a conversation runs is picked in the page, beside the model, and kept with it (issue 33, part 4)."""

import pytest
from playwright.sync_api import Browser, expect

from tests.conftest import AppProcess
from tests.fake_openai import Reply

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 800}, {"width": 390, "height": 844}])
def test_a_conversation_picks_research_sees_its_plan_and_keeps_it_over_a_reload(
    browser: Browser, app: AppProcess, fake, viewport
):
    context = browser.new_context(base_url=app.url, viewport=viewport)
    page = context.new_page()
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    picker = page.locator("#flow-picker")
    expect(picker.locator("option")).to_contain_text(["Chat", "Research"])  # among the flows offered, in order
    picker.select_option("research")
    expect(picker).to_have_value("research")
    fake.queue(Reply(tokens=["1. Where is Rome?\n", "2. How old is it?"]), Reply(tokens=["Old, in Italy."]))
    page.locator("#input").fill("Tell me about Rome")
    page.locator("#input").press("Enter")
    reply = page.locator(".message.assistant").last
    expect(reply).to_have_attribute("data-status", "complete", timeout=20_000)
    expect(reply.locator(".step-markdown")).to_contain_text("How old is it?")
    expect(reply.locator("progress")).to_have_count(1)
    page.reload()
    expect(page.locator("#flow-picker")).to_have_value("research")
    context.close()


def test_with_one_flow_offered_there_is_no_picker(browser: Browser, start_app):
    app = start_app("--flows", "chat")
    page = browser.new_context(base_url=app.url).new_page()
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#flow-picker")).to_be_hidden()

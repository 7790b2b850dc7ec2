"""The memory flow in the page (issue 33, part 5): what a reply remembered shows under it with a Forget button
that works, and the Memory dialog of the header's menu lists the facts, edits one, turns memory off, exports
and forgets all."""

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import AppProcess
from tests.fake_openai import Reply
from tests.test_memory import FACTS, METRIC
from tests.test_page_welcome import AXE

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 800}, {"width": 390, "height": 844}])
def test_a_remembered_fact_is_forgotten_from_the_reply_and_the_memory_dialog_manages_the_rest(
    browser: Browser, app: AppProcess, fake, viewport
):
    context = browser.new_context(base_url=app.url, viewport=viewport, accept_downloads=True)
    context.add_init_script(path=AXE)  # as the browser's own: the page's policy allows no inline script
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    page.locator("#flow-picker").select_option("memory")
    expect(page.locator("#flow-picker")).to_have_value("memory")
    fake.queue(Reply(tokens=["Noted."]), FACTS)
    page.locator("#input").fill(METRIC)
    page.locator("#input").press("Enter")
    reply = page.locator(".message.assistant").last
    expect(reply).to_have_attribute("data-status", "complete", timeout=20_000)
    metric = reply.locator(".step.shaped", has_text="Remembered: Prefers metric units")
    metric.get_by_role("button", name="Forget").click()
    expect(metric.get_by_role("button", name="Forget")).to_have_class(re.compile("pressed"))
    assert len(app.get("/api/memory")["facts"]) == 1  # told pressed once on_press is done

    page.locator("#menu-button").click()
    page.locator("#memory-button").click()
    dialog = page.locator("#memory-dialog")
    field = dialog.get_by_role("textbox", name="Fact")
    expect(field).to_have_value("Works on project Zephyr, a weather app")  # the one forgotten is gone
    assert axe_violations(page) == []
    field.fill("Works on project Apollo")
    field.press("Enter")
    expect(dialog.locator(".memory-note")).to_have_text("Saved.")
    expect(dialog).to_be_visible()  # Enter saved the fact, and left the dialog open
    assert [fact["text"] for fact in app.get("/api/memory")["facts"]] == ["Works on project Apollo"]
    dialog.get_by_label("Remember and use facts about me").uncheck()
    expect(dialog.locator(".memory-note")).to_contain_text("Memory is off")
    assert app.get("/api/memory")["on"] is False
    with page.expect_download() as download:
        dialog.get_by_role("link", name="Export").click()
    exported = json.loads(Path(download.value.path()).read_text())
    assert [fact["text"] for fact in exported["facts"]] == ["Works on project Apollo"] and exported["on"] is False
    page.once("dialog", lambda asked: asked.accept())
    dialog.get_by_role("button", name="Forget all").click()
    expect(dialog.locator(".memory-facts")).to_have_text("Nothing remembered yet.")
    assert app.get("/api/memory")["facts"] == []

    page.reload()
    pressed = page.locator(".message.assistant").last.locator(".step-button.pressed")
    expect(pressed).to_have_count(1)  # the press is kept with the reply
    assert errors == []
    context.close()


def axe_violations(page: Page) -> list[str]:
    """What axe-core finds wrong in the Memory dialog (WCAG A and AA: labels, colours, names)."""
    found = page.evaluate("async () => (await axe.run('#memory-dialog', {runOnly: ['wcag2a', 'wcag2aa']})).violations")
    return [f"{violation['id']} {[node['target'] for node in violation['nodes']]}" for violation in found]

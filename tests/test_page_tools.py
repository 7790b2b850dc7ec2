"""Tools in the page, in real headless Chromium: the calls and results of a reply as they happen, across a
reload; the Tools dialog (a conversation turns a server off, sees which fail, and that the embedded
model takes no tools)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import AppProcess
from tests.fake_openai import Call, FakeOpenAI, Reply
from tests.test_page import PageUnderTest, menu_item, replies, send, wait_done
from tests.test_tools import mcp_config, offered

pytestmark = pytest.mark.browser


@pytest.fixture
def app(start_app, tmp_path: Path) -> AppProcess:
    return start_app("--mcp-config", mcp_config(tmp_path, {"test": [], "broken": ["--fail-at-start"]}))


@pytest.fixture
def pages(browser: Browser, app: AppProcess) -> Iterator[PageUnderTest]:
    under_test = PageUnderTest(browser, app)
    yield under_test
    under_test.context.close()
    assert under_test.errors == []


def tool(page: Page, name: str):
    return replies(page).last.locator("details.tool", has_text=f"Tool {name}")


def test_a_question_calls_the_calculator_and_an_mcp_tool_and_a_reload_mid_tool_shows_the_same_and_goes_on(
    pages: PageUnderTest, fake: FakeOpenAI
):
    fake.queue(
        Reply(
            tokens=["Let me work it out. "],
            calls=[Call("calculator", {"expression": "6*7"}), Call("test__slow", {"seconds": 3})],
        ),
        Reply(tokens=["So ", "the answer ", "is 42."], pace=0.05),
    )
    page = pages.open()
    send(page, "What is 6*7, and wait a little?")
    expect(tool(page, "calculator")).to_have_count(1)
    expect(tool(page, "test.slow")).to_contain_text("running…")
    page.reload()  # in the middle of the MCP call
    expect(page.locator(".message.assistant[data-status=streaming]")).to_have_count(1)
    expect(tool(page, "calculator")).to_have_count(1)
    expect(tool(page, "test.slow")).to_contain_text("running…")
    expect(replies(page).last.locator(".body")).to_have_text("Let me work it out.")
    wait_done(page)
    expect(tool(page, "test.slow")).not_to_contain_text("running")
    reply = replies(page).last
    expect(reply.locator(".body")).to_have_text("Let me work it out. So the answer is 42.")
    expect(reply.locator("details.tool")).to_have_count(2)
    calculator = tool(page, "calculator")
    calculator.locator("summary").click()
    expect(calculator.locator(".tool-arguments")).to_contain_text('"expression": "6*7"')
    expect(calculator.locator(".tool-result")).to_have_text("42")
    slow = tool(page, "test.slow")
    slow.locator("summary").click()
    expect(slow.locator(".tool-result")).to_have_text("done")
    # And so it stays: the steps are kept with the reply.
    page.reload()
    expect(replies(page).last.locator("details.tool")).to_have_count(2)


def test_the_tools_dialog_turns_a_server_off_shows_the_failed_one_and_what_the_embedded_model_cannot(
    pages: PageUnderTest, fake: FakeOpenAI
):
    page = pages.open()
    expect(page.locator("#tools-button")).to_have_class("warning")
    expect(page.locator("#tools-button")).to_have_attribute("title", "Tool servers failing: broken")
    # The header's menu holds the Tools item: its button says so too, before it is opened.
    expect(page.locator("#menu-button")).to_have_attribute("title", "Tool servers failing: broken")
    menu_item(page, "Tools").click()
    dialog = page.locator("#tools-dialog")
    expect(dialog.locator(".tool-source")).to_have_count(3)
    expect(dialog.locator(".tool-source[data-source=broken]")).to_contain_text("failed: it exited")
    expect(dialog.locator(".tool-source[data-source=test]")).to_contain_text("test.add")
    expect(dialog.locator(".tools-note")).to_be_hidden()
    dialog.get_by_label("test").uncheck()
    dialog.get_by_role("button", name="Done").click()
    send(page, "no server tools please")
    wait_done(page)
    names = offered(fake.chat_requests[-1])
    assert "calculator" in names and not any(name.startswith("test__") for name in names)
    page.reload()  # kept with the conversation
    menu_item(page, "Tools").click()
    expect(dialog.get_by_label("test")).not_to_be_checked()
    expect(dialog.get_by_label("Built-in tools")).to_be_checked()
    dialog.get_by_role("button", name="Done").click()
    page.get_by_label("Model").select_option("SmolLM2-135M-Instruct.Q4_1")
    menu_item(page, "Tools").click()
    expect(dialog.locator(".tools-note")).to_contain_text("Tools need a provider that supports them")


def test_a_tool_result_is_shown_as_text_never_as_markup(pages: PageUnderTest, fake: FakeOpenAI):
    markup = "<img src=x onerror=alert(1)><b>bold</b>"
    fake.queue(Reply(calls=[Call("test__shout", {"text": markup})]), Reply(tokens=["Done."]))
    page = pages.open()
    send(page, "shout some markup")
    wait_done(page)
    shouted = tool(page, "test.shout")
    shouted.locator("summary").click()
    expect(shouted.locator(".tool-result")).to_have_text(markup.upper())
    expect(shouted.locator(".tool-arguments")).to_contain_text(markup)
    assert replies(page).last.locator("img, b").count() == 0
    assert pages.dialogs == []


def test_the_tools_dialog_says_what_a_big_server_and_the_cap_leave_out(browser: Browser, start_app, tmp_path: Path):
    app = start_app("--mcp-config", mcp_config(tmp_path, {"many": ["--many-tools", "10000"]}))
    pages = PageUnderTest(browser, app)
    page = pages.open()
    menu_item(page, "Tools").click()
    dialog = page.locator("#tools-dialog")
    expect(dialog.locator(".tool-source[data-source=many]")).to_contain_text(
        "offers 10,007 tools; the first 128 are used"
    )
    expect(dialog.locator(".tools-note")).to_have_text(
        "The model is offered 128 tools at most (--max-tools): of the 132 of the sources on, the last 4 are left out."
    )
    dialog.get_by_label("Built-in tools").uncheck()  # 128 on: nothing left out
    expect(dialog.locator(".tools-note")).to_be_hidden()
    pages.context.close()
    assert pages.errors == []

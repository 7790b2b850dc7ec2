"""The first screen, in real headless Chromium against the app and the fake provider: who answers and
example prompts on a new conversation, the demo model's banner, the header's menu and its keyboard, the
header on a phone, the keyboard shortcuts, the web app manifest, and axe-core's rules on the page."""

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from main import HERE
from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_page import PageUnderTest, menu_item, replies, send, wait_done
from tests.test_page_sign_in import sign_in

pytestmark = pytest.mark.browser
EMBEDDED = "SmolLM2-135M-Instruct.Q4_1"
AXE = HERE / "node_modules" / "axe-core" / "axe.min.js"


@pytest.fixture
def pages(browser: Browser, app: AppProcess) -> Iterator[PageUnderTest]:
    under_test = PageUnderTest(browser, app)
    yield under_test
    under_test.context.close()
    assert under_test.errors == []


@pytest.fixture
def page(pages: PageUnderTest) -> Page:
    return pages.open()


def focused(page: Page) -> str:
    """What has focus: its id, or its text."""
    return page.evaluate("document.activeElement.id || document.activeElement.textContent.trim()")


def test_a_new_conversation_names_its_model_and_offers_prompts_that_send_on_a_click(
    page: Page, app: AppProcess, fake: FakeOpenAI
):
    welcome = page.get_by_role("region", name="What can I help with?")
    expect(welcome).to_be_visible()
    expect(welcome.locator("#welcome-model")).to_have_text(
        f"Answered by fake-model, via http://127.0.0.1:{fake.port}/v1/"
    )
    examples = welcome.get_by_role("list", name="Example prompts").get_by_role("button")
    expect(examples).to_have_count(4)
    prompt = examples.nth(1).inner_text()
    fake.queue(Reply(tokens=["def is_palindrome(word): ..."]))
    examples.nth(1).click()
    wait_done(page)
    expect(page.locator(".message.user .body")).to_have_text(prompt)
    assert fake.chat_requests[-1]["json"]["messages"][-1]["content"] == prompt
    expect(page.locator("#input")).to_have_value("")
    expect(welcome).to_be_hidden()
    page.reload()
    expect(replies(page)).to_have_count(1)
    expect(welcome).to_be_hidden()
    page.get_by_role("button", name="New chat").click()
    expect(page.locator(".message")).to_have_count(0)
    expect(welcome).to_be_visible()


def test_the_demo_models_notice_is_a_banner_dismissed_for_good(page: Page):
    notice = page.locator("#model-notice")
    expect(notice).to_be_hidden()  # a provider answers
    page.get_by_label("Model").select_option(EMBEDDED)
    expect(notice).to_be_visible()
    expect(notice).to_contain_text(f"{EMBEDDED}: a small offline demo model")
    expect(notice).to_contain_text("POCKETCHAT_BASE_URL")
    expect(page.locator("header")).not_to_contain_text("demo")
    expect(page.locator("#welcome-model")).to_have_text(f"Answered by {EMBEDDED}, a small demo model on this machine")
    notice.get_by_role("button", name="Dismiss this notice").click()
    expect(notice).to_be_hidden()
    expect(page.locator("#input")).to_be_focused()
    page.reload()
    expect(page.get_by_label("Model")).to_have_value(EMBEDDED)
    expect(page.locator("#welcome-model")).to_contain_text("a small demo model")
    expect(notice).to_be_hidden()


def test_on_a_phone_the_header_takes_at_most_two_lines(browser: Browser, app: AppProcess):
    under_test = PageUnderTest(browser, app, viewport={"width": 390, "height": 844}, is_mobile=True)
    page = under_test.open()
    send(page, "hello")
    wait_done(page)
    conversation = page.evaluate("localStorage.getItem('pocketchat.conversation')")
    long = {"title": "A rather long title for a conversation " * 3, "system_prompt": "Answer briefly. " * 20}
    page.request.patch(f"/api/conversations/{conversation}", data=long)
    page.get_by_label("Model").select_option(EMBEDDED)  # the longest name
    expect(page.locator("#title")).to_have_text(long["title"].strip())
    header = page.locator("header.chat-header")
    lines = header.evaluate("""(header) => {
      const style = getComputedStyle(header);
      const content = header.clientHeight - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom);
      return content / parseFloat(style.lineHeight);
    }""")
    assert lines <= 2, f"the header is {lines:.1f} lines high"
    for control in ("#toggle-sidebar", "#model-picker", "#menu-button"):
        expect(page.locator(control)).to_be_in_viewport(ratio=1)
    under_test.context.close()
    assert under_test.errors == []


def test_the_header_menu_by_keyboard(page: Page):
    button = page.get_by_role("button", name="More actions")
    menu = page.get_by_role("menu")
    expect(button).to_have_attribute("aria-expanded", "false")
    button.focus()
    page.keyboard.press("Enter")
    expect(button).to_have_attribute("aria-expanded", "true")
    expect(menu).to_be_visible()
    expect(page.get_by_role("menuitem", name="System prompt")).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(page.get_by_role("menuitem", name="Tools")).to_be_focused()
    page.keyboard.press("ArrowUp")
    page.keyboard.press("ArrowUp")  # round to the last
    expect(page.get_by_role("menuitem", name="Keyboard shortcuts")).to_be_focused()
    page.keyboard.press("Home")
    expect(page.get_by_role("menuitem", name="System prompt")).to_be_focused()
    page.keyboard.press("e")  # the next item whose name starts with it
    expect(page.get_by_role("menuitem", name="Export as Markdown")).to_be_focused()
    page.keyboard.press("Escape")
    expect(menu).to_be_hidden()
    expect(button).to_have_attribute("aria-expanded", "false")
    expect(button).to_be_focused()
    page.keyboard.press("ArrowUp")  # opens on the last item
    expect(page.get_by_role("menuitem", name="Keyboard shortcuts")).to_be_focused()
    page.keyboard.press("End")
    page.keyboard.press("Tab")  # leaves the menu, and closes it
    expect(menu).to_be_hidden()
    assert focused(page) not in ("menu-button", "Keyboard shortcuts")
    # An item that opens a dialog: closing the dialog gives focus back to the menu's button.
    button.focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    dialog = page.get_by_role("dialog", name="System prompt")
    expect(dialog).to_be_visible()
    expect(menu).to_be_hidden()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(button).to_be_focused()
    # A click elsewhere closes it too.
    button.click()
    expect(menu).to_be_visible()
    page.locator("#title").click()
    expect(menu).to_be_hidden()
    expect(button).to_have_attribute("aria-expanded", "false")


def test_each_keyboard_shortcut(page: Page, fake: FakeOpenAI):
    page.locator("#title").click()  # focus on nothing in particular
    page.keyboard.press("?")
    dialog = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(dialog).to_be_visible()
    for does in ("New chat", "Search conversations", "Stop the reply", "Focus the message box"):
        expect(dialog.locator("dd", has_text=does)).to_have_count(1)
    expect(dialog.locator("dt").nth(1)).to_have_text("Ctrl + K")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    # Shift+Esc: to the message box, where `?` is just a character.
    page.keyboard.press("Shift+Escape")
    expect(page.locator("#input")).to_be_focused()
    page.keyboard.press("?")
    expect(page.locator("#input")).to_have_value("?")
    expect(dialog).to_be_hidden()
    # Esc stops a reply while it streams.
    fake.queue(Reply(count=500, pace=0.02))
    send(page, "Go on and on")
    expect(replies(page).last.locator(".body")).to_contain_text("tok3")
    page.keyboard.press("Escape")
    wait_done(page)
    expect(replies(page).last).to_have_attribute("data-status", "stopped")
    # Ctrl+Shift+O: a new chat, ready to type in.
    before = page.evaluate("localStorage.getItem('pocketchat.conversation')")
    page.locator("#title").click()  # focus on nothing in particular
    page.keyboard.press("Control+Shift+O")
    expect(page.locator(".message")).to_have_count(0)
    expect(page.locator("#input")).to_be_focused()
    page.wait_for_function("(before) => localStorage.getItem('pocketchat.conversation') !== before", arg=before)
    # Search is search.js's Ctrl+K; the menu asks for it with an event.
    page.evaluate("document.addEventListener('pocketchat:search', () => { window.searched = true; })")
    menu_item(page, "Search conversations").click()
    assert page.evaluate("window.searched") is True


LOADED_WIDTH = (
    "async (src) => { const image = new Image(); image.src = src; await image.decode(); return image.naturalWidth; }"
)


def test_the_page_is_installable(page: Page):
    assert page.locator("meta[name=theme-color]").count() == 2
    href = page.locator("link[rel=manifest]").get_attribute("href")
    response = page.request.get(href)
    assert response.ok and response.headers["content-type"] == "application/manifest+json"
    manifest = json.loads(response.text())
    assert manifest["name"] == "PocketChat" and manifest["start_url"] == "/" and manifest["display"] == "standalone"
    icons = {(icon["type"], icon["sizes"], icon["purpose"]): icon["src"] for icon in manifest["icons"]}
    assert set(icons) == {
        ("image/svg+xml", "any", "any"),
        ("image/png", "192x192", "any"),
        ("image/png", "512x512", "any"),
        ("image/png", "512x512", "maskable"),
    }
    # Each one loads in the page (its policy lets it), at the size the manifest says.
    for (_, sizes, _), src in icons.items():
        width = page.evaluate(LOADED_WIDTH, src)
        assert sizes == "any" or sizes == f"{width}x{width}", (src, width)


def axe_violations(page: Page) -> list[str]:
    results = page.evaluate(
        "axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'best-practice']}})"
    )
    return [
        f"{violation['id']} ({violation['help']}): {[node['target'] for node in violation['nodes']]}"
        for violation in results["violations"]
    ]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_nothing_on_the_page(browser: Browser, start_app, fake: FakeOpenAI, scheme: str):
    app = start_app("--auth", "token", "--token", "a-token-for-axe-0123456789")
    context = browser.new_context(color_scheme=scheme)
    context.add_init_script(path=AXE)  # as the browser's own: the page's policy allows no inline script
    page = context.new_page()
    page.goto(app.url + "/")
    assert axe_violations(page) == []  # the sign-in page
    sign_in(page, app, "a-token-for-axe-0123456789")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#welcome")).to_be_visible()
    assert axe_violations(page) == []  # a new conversation
    menu_item(page, "Keyboard shortcuts")
    assert axe_violations(page) == []  # the menu open
    fake.queue(Reply(tokens=["A table:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nprint(1)\n```\n"]))
    send(page, "Show me a table and some code")
    wait_done(page)
    assert axe_violations(page) == []  # a conversation
    context.close()


def test_with_no_model_to_answer_the_banner_says_why_and_stays(browser: Browser, start_app, tmp_path):
    app = start_app("--provider", "local", "--model-path", str(tmp_path / "absent.gguf"))
    under_test = PageUnderTest(browser, app)
    page = under_test.open()
    notice = page.locator("#model-notice")
    expect(notice).to_contain_text("No model can answer:")
    expect(notice).to_contain_text("POCKETCHAT_BASE_URL")
    expect(notice.get_by_role("button", name="Dismiss this notice")).to_be_hidden()
    expect(page.locator("#welcome-model")).to_have_text("No model can answer yet: see the notice above.")
    under_test.context.close()
    assert under_test.errors == []


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_nothing_in_the_sidebar_and_the_message_box_on_a_phone(browser: Browser, app, fake, scheme: str):
    under_test = PageUnderTest(
        browser, app, color_scheme=scheme, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True
    )
    under_test.context.add_init_script(path=AXE)
    page = under_test.open()
    fake.queue(Reply(count=400, pace=0.02))
    send(page, "Tell me a long story")
    expect(replies(page).last.locator(".body")).to_contain_text("tok3")
    page.locator("#input").fill("a follow-up")
    page.locator("#input").press("Enter")
    expect(page.locator("#composer-hint")).to_be_visible()
    assert axe_violations(page) == []  # a reply streaming, a message waiting in the box
    page.keyboard.press("Escape")
    wait_done(page)
    page.get_by_role("button", name="Show conversations").click()
    assert axe_violations(page) == []  # the drawer open, its list grouped by date
    page.get_by_role("button", name="Actions for “Tell me a long story”").click()
    expect(page.get_by_role("menu")).to_be_visible()
    assert axe_violations(page) == []  # a row's menu open
    page.keyboard.press("Escape")
    page.locator("#search-box").fill("zebra")
    expect(page.locator("#search-status")).to_contain_text("No conversations match")
    assert axe_violations(page) == []  # a search without hits
    under_test.context.close()
    assert under_test.errors == []

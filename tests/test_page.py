"""The page in real headless Chromium (Debian's, driven by playwright) against the app and the fake."""

import itertools
import random
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAI, Reply

pytestmark = pytest.mark.browser

MARKDOWN_REPLY = [
    "Here is a table:\n\n",
    "| fruit | count |\n",
    "|---|---|\n",
    "| apple | 3 |\n\n",
    "```python\n",
    "print('copy me')\n",
    "```\n",
]


class PageUnderTest:
    """A browser context on the app, recording every request, dialog and script error."""

    def __init__(self, browser: Browser, app: AppProcess, **context: object) -> None:
        self.app = app
        self.context = browser.new_context(base_url=app.url, **context)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []

    def open(self) -> Page:
        page = self.context.new_page()
        page.on("request", lambda request: self.requests.append(request.url))
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        page.goto("/")
        expect(page.locator("#send")).to_be_enabled()  # connected: the server answered `ready`
        return page


@pytest.fixture
def pages(browser: Browser, app: AppProcess) -> Iterator[PageUnderTest]:
    under_test = PageUnderTest(browser, app, permissions=["clipboard-read", "clipboard-write"])
    yield under_test
    under_test.context.close()
    assert under_test.errors == []


@pytest.fixture
def page(pages: PageUnderTest) -> Page:
    return pages.open()


def send(page: Page, text: str) -> None:
    page.locator("#input").fill(text)
    page.locator("#input").press("Enter")


def menu_item(page: Page, name: str):
    """An item of the header's menu, the menu opened."""
    if page.locator("#menu-button").get_attribute("aria-expanded") != "true":
        page.locator("#menu-button").click()
    return page.get_by_role("menuitem", name=name)


def replies(page: Page):
    return page.locator(".message.assistant:not(.notice-only)")


def wait_done(page: Page, count: int = 1, timeout: float = 20_000) -> None:
    # The reply is on screen first (turn_start), then no longer streaming: in the other order, the
    # check for "nothing streaming" could pass before the reply began.
    expect(replies(page)).to_have_count(count, timeout=timeout)
    expect(page.locator(".message.assistant[data-status=streaming]")).to_have_count(0, timeout=timeout)
    expect(page.locator("#send")).to_have_text("Send")


def test_a_reply_streams_in_as_markdown_with_a_working_copy_button(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(tokens=MARKDOWN_REPLY, pace=0.03))
    send(page, "Show me a table and some code")
    expect(page.locator("#send")).to_have_text("Stop")
    wait_done(page)
    reply = replies(page).last
    expect(reply.locator("table td").first).to_have_text("apple")
    expect(reply.locator("pre code.hljs.language-python")).to_contain_text("print('copy me')")
    reply.locator(".code-block button.copy").click()
    expect(reply.locator(".code-block button.copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "print('copy me')\n"
    expect(reply.locator(".meta")).to_contain_text("fake-model")
    expect(reply.locator(".meta")).to_contain_text("tokens/s")
    expect(page.locator(".message.user .body")).to_have_text("Show me a table and some code")


STREAMED_MARKDOWN = """# Streaming Markdown

Some prose with **bold**, `code` and a [reference link][docs].

[docs]: https://example.org/docs "The docs"

Setext heading
--------------

1. first
2. second

   still the second item

3. third
- a bullet list right after
**a lazy line of the last item**

| language | typed |
|---|:---:|
| Python | gradually |
| Rust | yes |

```python
def greet(name: str) -> str:
    return f"hello {name}"
```
Between the blocks, without a blank line.
```javascript
const add = (a, b) => a + b;
```

```rust
fn main() {
    println!("hi");
}
```

> a quote
continued lazily

    indented code

```sql
SELECT 1;
```
"""
# A full render of `text` in the page, by the page's own module, into an element of its own.
FULL_RENDER = """async (text) => {
  const { MarkdownView } = await import("/static/markdown.js");
  const element = document.createElement("div");
  new MarkdownView(element).render(text);
  return element.innerHTML;
}"""
# A drawn reply's blocks as HTML, out of the sections that a streaming reply keeps its finished blocks in.
BLOCKS_HTML = """(body) => {
  const copy = body.cloneNode(true);
  for (const section of copy.querySelectorAll(":scope > .blocks")) section.replaceWith(...section.childNodes);
  return copy.innerHTML;
}"""


def test_a_streamed_reply_keeps_its_finished_blocks_and_ends_as_a_full_render(page: Page, fake: FakeOpenAI):
    sizes = [1, 3, 2, 5, 7, 4]  # uneven pieces, so that fences, rows and list markers arrive split
    pieces, start = [], 0
    for size in itertools.cycle(sizes):
        if start >= len(STREAMED_MARKDOWN):
            break
        pieces.append(STREAMED_MARKDOWN[start : start + size])
        start += size
    fake.queue(Reply(tokens=pieces, pace=0.005))
    send(page, "Show me some Markdown")
    reply = replies(page).last
    heading = reply.locator(".body h1")
    expect(reply.locator(".body h2")).to_have_count(1)  # the heading is finished: blocks follow it
    heading.evaluate("(h1) => { window.firstHeading = h1; }")
    wait_done(page)
    assert heading.evaluate("(h1) => h1 === window.firstHeading")  # drawn once, never replaced
    for language in ["python", "javascript", "rust", "sql"]:
        expect(reply.locator(f"pre code.hljs.language-{language}")).to_have_count(1)
    expect(reply.locator("a[href='https://example.org/docs']")).to_have_text("reference link")
    assert reply.locator(".body").evaluate(BLOCKS_HTML) == page.evaluate(FULL_RENDER, STREAMED_MARKDOWN)


# Texts after which marked changes its mind about lines it has read as more text arrives: lists that go
# on after a blank line or take in a lazy line, a line that an ordered list cannot interrupt, underlines
# that make a heading, rows that make a table, link definitions that come after their links.
TRICKY_TEXTS = [
    "abc\n10. ten\n- item\n", "| a | b |\n2. b\n  - deep\n[x]\n", "- item\n**bold** line\n", "1. a\n\n2. b\n",
    "para\n| a | b |\n|---|---|\n| 1 | 2 |\n", "Setext\n---\nnext\n", "[x][foo]\n\n[foo]: https://example.org/foo\n",
    "[x][bar]\n\na\n\nb\n\nc\n\n[bar]: https://example.org/bar\n",
]  # fmt: skip
# And random texts of such pieces.
TRICKY_PIECES = [
    "# Title\n", "Prose with *emphasis* and a [link](https://example.org).\n", "\n", "\n\n", "abc\n", "| c |\n",
    "- item\n", "  continued\n", "-\n", "* star\n", "1. first\n", "2. second\n", "10. ten\n", "1.\n", "\t- tab\n",
    "   - nested\n", "- [x] done\n", "**bold\n", "text**\n", "===\n", "---\n", "| a | b |\n", "|---|---|\n",
    "| 1 | 2 |\n", "```python\nx = 1\n", "```\n", "~~~\n", "    indented\n", "> quote\n", "<div>\n",
    "<!-- c -->\n", "[ref][foo]\n", "[foo]: https://example.org/foo\n", "[Foo]\n", "x  \n", "\\\n",
]  # fmt: skip
# Render each text in turn into one element, block by block: the first whose drawing differs from a full
# render of it (or null), and the most sections of finished blocks the element had.
FIRST_DIFFERENT = (
    """async (texts) => {
  const { MarkdownView } = await import("/static/markdown.js");
  const blocksHtml = """
    + BLOCKS_HTML
    + """;
  const full = (text) => {
    const element = document.createElement("div");
    new MarkdownView(element).render(text);
    return element.innerHTML;
  };
  const element = document.createElement("div");
  const view = new MarkdownView(element);
  let sections = 0;
  const different = texts.find((text) => {
    view.render(text);
    sections = Math.max(sections, element.querySelectorAll(":scope > .blocks").length);
    return blocksHtml(element) !== full(text);
  }) ?? null;
  return [different, sections];
}"""
)


def test_markdown_drawn_block_by_block_equals_a_full_render_at_every_step(page: Page):
    pick = random.Random(8)
    texts = TRICKY_TEXTS + ["".join(pick.choices(TRICKY_PIECES, k=pick.randint(3, 14))) for _ in range(150)]
    texts.append("# One\n\na\n\nb\n\nc\n\nd\n")
    texts.append("".join(f"## Part {i}\n\nProse {i}.\n\n- item\n" for i in range(20)))  # several sections
    growing = [text[:end] for text in texts for end in range(1, len(text) + 1)]
    edited = "# Two\n\na\n\nb\n\nc\n\nd\n"  # a change among the finished blocks of the text before
    different, sections = page.evaluate(FIRST_DIFFERENT, [*growing, edited])
    assert different is None and sections >= 2


XSS = (
    '<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> '
    '[click me](javascript:window.pwned=3) <a href="javascript:window.pwned=4">raw link</a> '
    '<iframe src="http://127.0.0.1:9/frame"></iframe> ![tracker](http://127.0.0.1:9/pixel.png) '
    '<svg onload="window.pwned=5"></svg> <style>body{background:url(http://127.0.0.1:9/bg.png)}</style>'
)


def test_markup_from_the_model_or_the_user_runs_nothing_and_loads_nothing(pages: PageUnderTest, fake: FakeOpenAI):
    page = pages.open()
    fake.queue(Reply(tokens=[XSS[i : i + 40] for i in range(0, len(XSS), 40)]))
    send(page, XSS)
    wait_done(page)
    for link in page.locator("#transcript a").all():
        link.click(modifiers=["Shift"]) if link.get_attribute("href") else link.click()
    transcript = page.locator("#transcript")
    expect(transcript.locator("img, script, iframe, svg, style")).to_have_count(0)
    expect(transcript.locator("a[href^='javascript' i]")).to_have_count(0)
    expect(page.locator(".message.user .body")).to_have_text(XSS)
    assert page.evaluate("window.pwned") is None
    assert pages.dialogs == []
    assert all(url.startswith(pages.app.url) for url in pages.requests), pages.requests


def test_reload_in_the_middle_of_a_reply_ends_with_the_same_transcript(pages: PageUnderTest, fake: FakeOpenAI):
    fake.queue(Reply(count=80, pace=0.025))
    reloaded = pages.open()
    send(reloaded, "Tell me a long story")
    expect(replies(reloaded).last.locator(".body")).to_contain_text("tok10")
    undisturbed = pages.open()  # same browser storage: it opens the same conversation mid-reply
    reloaded.reload()
    expect(reloaded.locator(".message.assistant[data-status=streaming]")).to_have_count(1)
    wait_done(reloaded)
    wait_done(undisturbed)
    final = reloaded.locator("#transcript").inner_text()
    assert final == undisturbed.locator("#transcript").inner_text()
    assert "tok1 tok2" in final and "tok80" in final


def test_stop_ends_the_reply_and_keeps_what_came(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(count=500, pace=0.02))
    send(page, "Go on and on")
    expect(replies(page).last.locator(".body")).to_contain_text("tok3")
    page.locator("#send").click()
    wait_done(page)
    expect(replies(page).last).to_have_attribute("data-status", "stopped")
    expect(replies(page).last.locator(".notice")).to_have_text("Stopped.")
    assert fake.hangups == 1


def test_regenerate_replaces_the_last_reply(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(tokens=["first answer"]), Reply(tokens=["second answer"]))
    send(page, "question")
    wait_done(page)
    replies(page).last.get_by_role("button", name="Regenerate").click()
    expect(replies(page).last.locator(".body")).to_have_text("second answer")
    wait_done(page)
    expect(page.locator(".message.user")).to_have_count(1)


def test_edit_and_resend_the_last_message(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(tokens=["about cats"]), Reply(tokens=["about dogs"]))
    send(page, "tell me about cats")
    wait_done(page)
    page.locator(".message.user").get_by_role("button", name="Edit").click()
    page.get_by_label("Edit your message").fill("tell me about dogs")
    page.get_by_role("button", name="Send edited").click()
    expect(page.locator(".message.user .body")).to_have_text("tell me about dogs")
    expect(replies(page).last.locator(".body")).to_have_text("about dogs")
    wait_done(page)
    assert fake.chat_requests[-1]["json"]["messages"][-1]["content"] == "tell me about dogs"


def test_switching_away_from_a_streaming_conversation_and_back(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(count=150, pace=0.02), Reply(tokens=["quick"]))
    send(page, "the long one")
    expect(replies(page).last.locator(".body")).to_contain_text("tok2")
    page.locator("#new-chat").click()
    expect(page.locator(".message")).to_have_count(0)
    send(page, "the short one")
    wait_done(page)
    page.locator("#conversation-list .open", has_text="the long one").click()
    expect(page.locator("#title")).to_have_text("the long one")
    expect(replies(page).last).to_have_attribute("data-status", "streaming")
    wait_done(page)
    expect(replies(page).last.locator(".body")).to_contain_text("tok150")


def test_a_provider_error_shows_in_place_with_a_retry_that_works(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(status=400, message="Model is overloaded in a strange way"), Reply(tokens=["recovered"]))
    send(page, "hi")
    wait_done(page)
    failed = replies(page).last
    expect(failed.locator(".notice.error")).to_contain_text("Model is overloaded in a strange way")
    failed.get_by_role("button", name="Retry").click()
    expect(replies(page).last.locator(".body")).to_have_text("recovered")
    wait_done(page)


def test_a_reply_whose_chunks_come_joined_streams_in_whole_without_a_resync(pages: PageUnderTest, fake: FakeOpenAI):
    # A provider that sends the whole reply at once: the socket gets frames carrying several chunks
    # (first_seq to seq). The page adds each once and follows on, with no hello to resync from what
    # would look like a gap.
    sent: list[str] = []
    received: list[str] = []
    page = pages.context.new_page()
    page.on("pageerror", lambda error: pages.errors.append(str(error)))
    page.on(
        "websocket",
        lambda ws: (
            ws.on("framesent", lambda text: sent.append(str(text))),
            ws.on("framereceived", lambda text: received.append(str(text))),
        ),
    )
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    fake.queue(Reply(count=300))
    send(page, "all at once")
    wait_done(page)
    expect(replies(page).last.locator(".body")).to_have_text(" ".join(f"tok{i}" for i in range(1, 301)))
    assert any('"first_seq"' in frame for frame in received)
    assert sum('"type":"hello"' in frame.replace(" ", "") for frame in sent) == 1


def test_reasoning_streams_collapsed_above_the_reply_and_stays(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(reasoning=["Let me ", "think."], tokens=["Answer."]))
    send(page, "why?")
    wait_done(page)
    reasoning = replies(page).last.locator("details.reasoning")
    expect(reasoning).to_be_visible()
    assert reasoning.get_attribute("open") is None
    reasoning.locator("summary").click()
    expect(reasoning.locator(".reasoning-body")).to_have_text("Let me think.")
    page.reload()
    expect(replies(page).last.locator(".reasoning-body")).to_have_text("Let me think.", use_inner_text=False)


def test_model_picker_and_system_prompt_belong_to_the_conversation(page: Page, fake: FakeOpenAI):
    send(page, "first")
    wait_done(page)
    picker = page.get_by_label("Model")
    expect(picker.locator("option")).to_have_text(["fake-model", "fake-model-large", "SmolLM2-135M-Instruct.Q4_1"])
    picker.select_option("fake-model-large")
    menu_item(page, "System prompt").click()
    page.locator("#system-prompt-input").fill("Talk like a pirate.")
    page.locator("#system-prompt-dialog").get_by_role("button", name="Save").click()
    expect(page.locator("#system-prompt-summary")).to_have_text("System prompt: Talk like a pirate.")
    send(page, "second")
    wait_done(page, count=2)
    sent = fake.chat_requests[-1]["json"]
    assert sent["model"] == "fake-model-large" and sent["messages"][0]["content"] == "Talk like a pirate."
    page.reload()
    expect(page.get_by_label("Model")).to_have_value("fake-model-large")
    expect(page.locator("#system-prompt-summary")).to_have_text("System prompt: Talk like a pirate.")


def test_the_connection_banner_shows_while_the_server_is_down_and_nothing_is_lost(pages: PageUnderTest):
    page = pages.open()
    send(page, "before the outage")
    wait_done(page)
    pages.app.stop()
    banner_text = page.locator("#banner-text")
    expect(page.locator("#banner")).to_be_visible()
    expect(banner_text).to_contain_text(re.compile(r"Reconnecting .*attempt \d"))
    attempt = int(re.search(r"attempt (\d+)", banner_text.inner_text()).group(1))
    page.get_by_role("button", name="Reconnect now").click()  # tries at once, and fails: still down
    expect(banner_text).to_contain_text(re.compile(rf"attempt ({attempt + 1}|{attempt + 2})\b"))
    page.locator("#input").fill("typed while offline")
    page.locator("#input").press("Enter")
    pages.app.start()
    expect(page.locator("#banner")).to_be_hidden(timeout=40_000)
    expect(page.locator("#input")).to_have_value("typed while offline")
    expect(page.locator(".message.user .body")).to_have_text(["before the outage"])
    page.locator("#input").press("Enter")
    wait_done(page, count=2)
    pages.errors.clear()  # the browser logs the refused reconnection attempts


RECORD_SOCKETS = """
window.__sockets = [];
window.__mostAlive = 0; // the most sockets ever open or connecting at once
const count = () => {
  const alive = window.__sockets.filter((s) => s.readyState <= WebSocket.OPEN).length;
  window.__mostAlive = Math.max(window.__mostAlive, alive);
};
window.WebSocket = class extends WebSocket {
  constructor(...args) {
    super(...args);
    window.__sockets.push(this);
    count();
  }
};
setInterval(count, 5);
"""


def test_reconnect_now_while_a_socket_is_connecting_replaces_it(pages: PageUnderTest, fake: FakeOpenAI):
    pages.context.add_init_script(RECORD_SOCKETS)
    page = pages.open()
    pages.app.stop()
    # A listener that never accepts: the TCP connection opens, the WebSocket handshake never ends.
    with socket.create_server(("127.0.0.1", pages.app.port)):
        page.wait_for_function("() => window.__sockets.length > 1 && window.__sockets.at(-1).readyState === 0")
        for _ in range(3):
            page.get_by_role("button", name="Reconnect now").click()
            page.wait_for_timeout(200)
        expect(page.locator("#banner-text")).to_contain_text(re.compile(r"Reconnecting \(attempt \d+\)"))
        assert page.evaluate("window.__mostAlive") == 1
        assert page.evaluate("window.__sockets.at(-1).readyState") == 0  # the newest one is still trying
    pages.app.start()
    expect(page.locator("#banner")).to_be_hidden(timeout=40_000)
    fake.queue(Reply(tokens=["back"]))
    send(page, "still there?")
    wait_done(page)
    expect(replies(page).last.locator(".body")).to_have_text("back")
    states = page.evaluate("window.__sockets.map((s) => s.readyState)")
    assert states[-1] == 1 and set(states[:-1]) == {3}, states  # one open socket, every other one closed
    assert page.evaluate("window.__mostAlive") == 1


def test_keyboard_only_send_stop_and_new_chat(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(count=300, pace=0.02))

    def tab_to(selector: str) -> None:
        for _ in range(40):
            page.keyboard.press("Tab")
            if page.evaluate("(s) => document.activeElement.matches(s)", selector):
                return
        raise AssertionError(f"Tab never reached {selector}")

    tab_to("#input")
    page.keyboard.type("typed with the keyboard")
    page.keyboard.press("Enter")
    expect(replies(page).last.locator(".body")).to_contain_text("tok2")
    tab_to("#send")
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"  # focus is visible
    page.keyboard.press("Enter")
    wait_done(page)
    expect(replies(page).last).to_have_attribute("data-status", "stopped")
    tab_to("#new-chat")
    page.keyboard.press("Enter")
    expect(page.locator(".message")).to_have_count(0)
    expect(page.locator("#input")).to_be_focused()


def test_screen_readers_hear_a_reply_start_and_end_not_every_token(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(count=40, pace=0.02))
    expect(page.locator("#transcript")).to_have_attribute("aria-live", "polite")
    send(page, "hello")
    expect(page.locator("#announcer")).to_have_text("The assistant is replying.")
    expect(replies(page).last).to_have_attribute("aria-busy", "true")
    wait_done(page)
    expect(replies(page).last).to_have_attribute("aria-busy", "false")
    expect(page.locator("#announcer")).to_have_text("The reply is complete.")


def test_dark_theme_and_phone_layout(browser: Browser, app: AppProcess):
    dark = PageUnderTest(browser, app, color_scheme="dark").open()
    background = dark.evaluate("getComputedStyle(document.body).backgroundColor")
    dark.context.close()
    phone_context = PageUnderTest(browser, app, viewport={"width": 390, "height": 844}, is_mobile=True)
    phone = phone_context.open()
    assert background != phone.evaluate("getComputedStyle(document.body).backgroundColor")
    sidebar = phone.locator("#sidebar")
    assert sidebar.bounding_box()["x"] < 0  # off screen until asked for
    phone.get_by_role("button", name="Show conversations").click()
    expect(phone.locator("#toggle-sidebar")).to_have_attribute("aria-expanded", "true")
    expect(sidebar).to_be_in_viewport(ratio=0.9)
    phone_context.context.close()


def test_export_downloads_the_conversation_as_markdown(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(tokens=["exported answer"]))
    send(page, "export me")
    wait_done(page)
    with page.expect_download() as download:
        menu_item(page, "Export as Markdown").click()
    text = Path(download.value.path()).read_text()
    assert "## You\n\nexport me" in text and "exported answer" in text


def test_a_long_history_renders_every_message(page: Page, app: AppProcess, fake: FakeOpenAI):
    client = app.client()
    session = page.evaluate("localStorage.getItem('pocketchat.conversation')")
    client.hello(session)
    for index in range(30):
        client.turn(f"message {index}")
    page.reload()
    expect(page.locator(".message")).to_have_count(60)
    expect(page.locator(".message.user .body").first).to_have_text("message 0")


def test_the_view_sticks_to_the_bottom_unless_the_user_scrolls_up(page: Page, fake: FakeOpenAI):
    fake.queue(Reply(tokens=[f"line {i}\n\n" for i in range(400)], pace=0.01))
    send(page, "a very long answer")
    expect(replies(page).last.locator(".body")).to_contain_text("line 60")
    at_bottom = "(s => s.scrollHeight - s.scrollTop - s.clientHeight < 48)(document.getElementById('scroller'))"
    assert page.evaluate(at_bottom)
    jump = page.get_by_role("button", name="Jump to latest ↓")
    expect(jump).to_be_hidden()
    page.locator("#scroller").evaluate("s => s.scrollTop = 0")
    expect(jump).to_be_visible()
    page.wait_for_timeout(300)
    assert page.locator("#scroller").evaluate("s => s.scrollTop") == 0  # the stream did not pull the view down
    jump.click()
    expect(jump).to_be_hidden()
    assert page.evaluate(at_bottom)
    wait_done(page)


@pytest.mark.model
def test_the_page_says_when_the_small_offline_demo_model_answers(browser: Browser, start_app):
    app = start_app("--provider", "local", "--max-tokens", "8")
    under_test = PageUnderTest(browser, app)
    page = under_test.open()
    note = page.locator("#model-notice")
    expect(note).to_contain_text("SmolLM2-135M-Instruct.Q4_1: a small offline demo model")
    expect(note).to_contain_text("POCKETCHAT_BASE_URL")
    expect(page.get_by_label("Model").locator("option")).to_have_text(["SmolLM2-135M-Instruct.Q4_1"])
    send(page, "Hello")
    wait_done(page, timeout=60_000)  # the model loads at the first turn: seconds on a busy machine
    expect(replies(page).last.locator(".meta")).to_contain_text("(counted)")
    under_test.context.close()
    assert under_test.errors == []

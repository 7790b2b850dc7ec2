"""Documents in the page, in real Chromium against the app and the fake provider: attach (button, drop,
paste), watch them index, ask, see the sources; refused files said as messages; remove."""

import base64
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAI, Reply
from tests.pdfs import scanned_pdf, text_pdf
from tests.test_documents import NOTES, REPORT_PAGES

pytestmark = pytest.mark.browser


@contextmanager
def opened(browser: Browser, app: AppProcess) -> Iterator[Page]:
    """The app's page, ready to send; no script error may happen on it."""
    context = browser.new_context(base_url=app.url)
    errors: list[str] = []
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    yield page
    context.close()
    assert errors == []


@pytest.fixture
def page(browser: Browser, start_app) -> Iterator[Page]:
    with opened(browser, start_app("--context-budget", "1200", "--limit-document-bytes", "200000")) as page:
        yield page


def drop(page: Page, name: str, data: bytes, mime: str) -> None:
    """Drop a file on the page, as a file dragged from the desktop is."""
    page.evaluate(
        """([name, data, mime]) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], name, { type: mime }));
            const main = document.querySelector(".main");
            main.dispatchEvent(new DragEvent("dragover", { dataTransfer: transfer, bubbles: true, cancelable: true }));
            main.dispatchEvent(new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true }));
        }""",
        [name, base64.b64encode(data).decode(), mime],
    )


def paste(page: Page, name: str, data: bytes, mime: str) -> None:
    """Paste a file into the message box, as a copied file is."""
    page.evaluate(
        """([name, data, mime]) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], name, { type: mime }));
            const input = document.getElementById("input");
            const event = new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true, cancelable: true });
            input.dispatchEvent(event);
        }""",
        [name, base64.b64encode(data).decode(), mime],
    )


def test_a_pdf_and_a_markdown_file_attached_in_the_page_answer_with_their_sources(page: Page, fake: FakeOpenAI):
    page.locator("#file-picker").set_input_files(
        [{"name": "report.pdf", "mimeType": "application/pdf", "buffer": text_pdf(REPORT_PAGES)}]
    )
    drop(page, "garden.md", NOTES.encode(), "text/markdown")
    items = page.locator("#documents .document")
    expect(items).to_have_count(2)
    # Two uploads at once: listed in the order the server took them, which need not be the order given.
    for name in ("report.pdf", "garden.md"):
        expect(items.filter(has=page.locator(".document-name", has_text=name))).to_have_count(1)
    expect(page.locator("#documents .document[data-status=ready]")).to_have_count(2, timeout=60_000)
    expect(items.first).to_contain_text("ready")

    fake.queue(Reply(tokens=["The oven is in Lyon [1]."]))
    page.locator("#input").fill("Where was the sourdough oven installed?")
    page.locator("#input").press("Enter")
    expect(page.locator(".message.assistant[data-status=complete]")).to_have_count(1, timeout=20_000)
    # The passage reached the model; the sources under the reply name the file and the page.
    assert "The new sourdough oven was installed in Lyon" in fake.chat_requests[-1]["json"]["messages"][0]["content"]
    source = page.locator(".sources .source").first
    expect(source.locator("summary")).to_have_text("[1] report.pdf, p. 2")
    source.locator("summary").click()
    expect(source.locator(".passage")).to_contain_text("installed in Lyon on the fourth of March")
    page.reload()  # kept with the reply, and the documents with the conversation
    expect(page.locator(".sources .source").first.locator("summary")).to_have_text("[1] report.pdf, p. 2")
    expect(page.locator("#documents .document[data-status=ready]")).to_have_count(2)


def test_refused_files_are_said_as_messages_and_a_document_can_be_removed(page: Page, fake: FakeOpenAI):
    page.locator("#file-picker").set_input_files(
        [{"name": "big.txt", "mimeType": "text/plain", "buffer": b"word " * 50_000}]
    )
    expect(page.locator(".notice-only")).to_contain_text("“big.txt” is over the limit of 0.2 MB a file")
    page.locator("#file-picker").set_input_files(
        [{"name": "huge.txt", "mimeType": "text/plain", "buffer": b"word " * 200_000}]  # refused as it comes
    )
    expect(page.locator(".notice-only").nth(1)).to_contain_text("“huge.txt” could not be attached: The request body")
    paste(page, "scan.pdf", scanned_pdf(), "application/pdf")
    expect(page.locator(".notice-only").nth(2)).to_contain_text("“scan.pdf”: No text found; scanned PDFs are not read")
    paste(page, "notes.md", b"A note about herons.", "text/markdown")
    item = page.locator("#documents .document")
    expect(item).to_have_count(1)
    expect(item).to_have_attribute("data-status", "ready", timeout=60_000)
    item.get_by_role("button", name="Remove “notes.md”").click()
    expect(page.locator("#documents")).to_be_hidden()


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 800}, {"width": 390, "height": 844}])
def test_a_question_asked_while_a_document_is_indexed_says_it_was_not_read(browser, start_app, fake, viewport):
    """Issue 32, item 2: the reply used to go on without the document, with no word."""
    app = start_app("--embedding-model", "fake-embedder")
    fake.embed_delay = 8.0  # the document stays `indexing` for the whole test
    context = browser.new_context(base_url=app.url, viewport=viewport)
    page = context.new_page()
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    page.locator("#file-picker").set_input_files(
        [{"name": "invoice.md", "mimeType": "text/markdown", "buffer": b"Invoice 42: 300 euros, due in May."}]
    )
    expect(page.locator("#documents .document")).to_contain_text("invoice.md")
    page.locator("#input").fill("How much is the invoice?")
    page.locator("#input").press("Enter")
    reply = page.locator(".message.assistant").last
    expect(reply.locator(".step-text")).to_have_text(
        "Not read yet: “invoice.md” is still being indexed, so this reply does not use it. Ask again once it is ready."
    )
    expect(reply).to_have_attribute("data-status", "complete")
    page.reload()  # kept with the reply
    expect(page.locator(".message.assistant").last.locator(".step-text")).to_contain_text("Not read yet")
    context.close()

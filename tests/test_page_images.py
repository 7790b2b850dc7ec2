"""Images in the page, in real Chromium against the app and the fake provider: attach (button, paste, drop)
as thumbnails above the message box, remove one, send them with a message, see them on it (after a reload
too); with a model that cannot see images, the page says so before anything is sent, and the text may go
alone."""

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.fake_openai import FakeOpenAI, Reply
from tests.test_images import JPEG, PNG, VISION, WEBP, data_url
from tests.test_page_documents import drop, opened, paste

pytestmark = pytest.mark.browser


@pytest.fixture
def page(browser: Browser, start_app) -> Iterator[Page]:
    with opened(browser, start_app(*VISION)) as page:
        # The models are known, and so is which of them see images.
        expect(page.locator("#model-picker option[value=fake-model-large]")).to_have_count(1)
        yield page


def loaded(images) -> list[int]:
    """The natural widths of these <img> elements: 0 for one the browser could not show."""
    return images.evaluate_all("(all) => all.map((img) => img.complete ? img.naturalWidth : 0)")


def test_images_attached_three_ways_go_with_the_message_and_show_on_it(page: Page, fake: FakeOpenAI):
    tray = page.locator("#images .tray-image")
    # One after the other, each in the tray before the next: the server lists them in the order they came.
    page.locator("#file-picker").set_input_files([{"name": "red.png", "mimeType": "image/png", "buffer": PNG}])
    expect(tray).to_have_count(1)
    paste(page, "green.jpg", JPEG, "image/jpeg")
    expect(tray).to_have_count(2)
    drop(page, "blue.webp", WEBP, "image/webp")
    expect(tray).to_have_count(3)
    expect(page.locator("#images-note")).to_be_hidden()  # fake-model sees images
    page.reload()  # they wait on the server: a reload shows them again
    expect(tray).to_have_count(3)
    expect(page.locator("#documents")).to_be_hidden()  # images, not documents
    tray.get_by_role("button", name="Remove “green.jpg”").click()
    expect(tray).to_have_count(2)

    fake.queue(Reply(tokens=["A red and a blue square."]))
    page.locator("#input").fill("What colours?")
    page.locator("#input").press("Enter")
    expect(page.locator(".message.assistant[data-status=complete]")).to_have_count(1, timeout=20_000)
    content = fake.chat_requests[-1]["json"]["messages"][-1]["content"]
    assert content == [
        {"type": "text", "text": "What colours?"},
        {"type": "image_url", "image_url": {"url": data_url("image/png", PNG)}},
        {"type": "image_url", "image_url": {"url": data_url("image/webp", WEBP)}},
    ]
    expect(page.locator("#images")).to_be_hidden()  # sent: the tray is empty again
    shown = page.locator(".message.user .message-images img")
    expect(shown).to_have_count(2)
    expect(shown.nth(0)).to_have_attribute("alt", "red.png")
    page.wait_for_function("() => [...document.querySelectorAll('.message-images img')].every((i) => i.naturalWidth)")
    page.reload()  # in the history: drawn again, and served again
    expect(shown).to_have_count(2)
    page.wait_for_function("() => [...document.querySelectorAll('.message-images img')].every((i) => i.naturalWidth)")
    assert loaded(shown) == [48, 48]
    expect(page.locator(".message.user .body")).to_have_text("What colours?")


def test_a_model_that_cannot_see_images_is_said_before_anything_is_sent_and_the_text_can_go_alone(
    page: Page, fake: FakeOpenAI
):
    paste(page, "fake.png", b"not an image at all", "image/png")
    expect(page.locator(".notice-only")).to_contain_text("“fake.png” is not a PNG, JPEG or WebP image")
    paste(page, "chart.png", PNG, "image/png")
    expect(page.locator("#images .tray-image")).to_have_count(1)
    page.locator("#model-picker").select_option("fake-model-large")
    note = page.locator("#images-note")
    expect(note).to_contain_text("“fake-model-large” cannot see images")  # said as soon as it is known
    asked = len(fake.chat_requests)
    page.locator("#input").fill("Describe the chart")
    page.locator("#input").press("Enter")
    expect(page.locator(".notice-only").nth(1)).to_contain_text(
        "“fake-model-large” cannot see images, so this message and its images were not sent"
    )
    expect(page.locator("#input")).to_have_value("Describe the chart")  # back in the box
    expect(page.locator("#images .tray-image")).to_have_count(1)
    assert len(fake.chat_requests) == asked and page.locator(".message.user").count() == 0

    page.get_by_role("button", name="Remove “chart.png”").click()
    expect(note).to_be_hidden()
    page.locator("#input").press("Enter")
    expect(page.locator(".message.assistant[data-status=complete]")).to_have_count(1, timeout=20_000)
    assert fake.chat_requests[-1]["json"]["messages"][-1]["content"] == "Describe the chart"

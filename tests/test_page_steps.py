"""The page draws what a node shows by its shape and place (static/steps.js), with no page change for a new
node: a copy of this checkout with one node after the reply that shows every shape, seen in Chromium, at
a desktop's and a phone's width, light and dark."""

import pytest
from playwright.sync_api import Browser, expect

from tests.fake_openai import Reply
from tests.test_add_a_node import apply, changed_files, chat, copy_of_checkout
from tests.test_add_a_node import start as start  # the fixture: the app of a changed copy

pytestmark = pytest.mark.browser

NODE = '''
class ShowEverything(AsyncNode):
    """Every shape a step can take, in every place."""

    async def post_async(self, shared: dict[str, Any], _: None, __: None) -> None:
        log = shared["log"]
        log.append_step("ShowEverything", "note", "A plain line.", shape="text")
        markdown = "**bold** <script>alert(1)</script>"
        log.append_step("ShowEverything", "md", markdown, shape="markdown", display="below")
        log.append_step("ShowEverything", "kv", {"words": 3, "minutes": 1}, shape="keyvalue", display="below")
        table = {"columns": ["city", "people"], "rows": [["Rome", "2.8M"], ["Oslo", "0.7M"]]}
        log.append_step("ShowEverything", "table", table, shape="table")
        links = [{"label": "PocketFlow", "url": "https://example.org/pocketflow"}]
        links.append({"label": "evil", "url": "javascript:alert(1)"})
        log.append_step("ShowEverything", "links", links, shape="links")
        log.append_step("ShowEverything", "bar", {"value": 0.3, "label": "Reading"}, shape="progress", step_id="bar")
        log.append_step("ShowEverything", "bar", {"value": 0.8, "label": "Reading"}, shape="progress", step_id="bar")
        log.append_step("ShowEverything", "aside", "An aside.", shape="text", display="inline")
        log.append_step("ShowEverything", "secret", "Never drawn.", shape="text", display="hidden")
'''


@pytest.fixture
def showing(tmp_path):
    copy = copy_of_checkout(tmp_path / "copy")
    apply(copy, "nodes.py", "add at the end", NODE)
    apply(copy, "flow.py", "in create_chat_flow, add to after_a_complete_reply", "ShowEverything()")
    flow = (copy / "flow.py").read_text()
    (copy / "flow.py").write_text(flow.replace("    BuildPrompt,", "    BuildPrompt,\n    ShowEverything,", 1))
    assert changed_files(copy) == {"nodes.py", "flow.py"}
    return copy


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 800}, {"width": 390, "height": 844}])
def test_every_shape_is_drawn_in_its_place_and_nothing_runs_or_loads(
    showing, start, browser: Browser, fake, scheme, viewport
):
    app = start(showing)
    fake.queue(Reply(tokens=["Rome ", "is ", "old."]))
    page = chat(browser, app, "Tell me about Rome", color_scheme=scheme, viewport=viewport)
    reply = page.locator(".message.assistant").last
    above, below, body = reply.locator(".steps").first, reply.locator(".steps.below"), reply.locator(".body")
    expect(above.locator(".step-text")).to_have_text("A plain line.")
    expect(below.locator(".step-markdown strong")).to_have_text("bold")
    expect(below.locator(".step-markdown script")).to_have_count(0)  # raw HTML is text, as in replies
    expect(below.locator(".step-keyvalue dt")).to_have_text(["words", "minutes"])
    expect(above.locator(".step-table td")).to_have_text(["Rome", "2.8M", "Oslo", "0.7M"])
    expect(above.locator(".step-links a")).to_have_count(1)  # the javascript: link is text, not a link
    expect(above.locator(".step-links a")).to_have_attribute("rel", "noopener noreferrer")
    expect(above.locator("progress")).to_have_count(1)  # the bar moved: one step, the last
    expect(above.locator("progress")).to_have_attribute("value", "0.8")
    expect(body.locator(".inline-step .step-text")).to_have_text("An aside.")
    expect(reply).not_to_contain_text("Never drawn.")
    page.reload()  # kept with the reply
    reply = page.locator(".message.assistant").last
    expect(reply.locator("progress")).to_have_count(1)
    expect(reply.locator(".body .inline-step")).to_contain_text("An aside.")
    app.stop()

"""docs/add-a-node.md works as written: its blocks, applied to a copy of this checkout, give a node
whose test passes and whose step a real browser shows, with nothing else changed; and a node of a
kind the page does not know is shown plainly."""

import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import API_KEY, NO_LIMITS, ROOT, AppProcess
from tests.fake_openai import FakeOpenAI, Reply

pytestmark = pytest.mark.browser

GUIDE = (ROOT / "docs" / "add-a-node.md").read_text()
FIRST, REST = GUIDE.split("\n## Part 2", 1)
SECOND, THIRD = REST.split("\n## Part 3", 1)
BLOCK = re.compile(r"```python\n# (\S+): ([^\n]*)\n(.*?)```", re.S)
BLOCKS, SECOND_BLOCKS, THIRD_BLOCKS = BLOCK.findall(FIRST), BLOCK.findall(SECOND), BLOCK.findall(THIRD)
AFTER_THE_REPLY = re.compile(r"(after_a_complete_reply: list\[AsyncNode\] = \[)([^\]]*)\]")


def copy_of_checkout(into: Path) -> Path:
    """The files of this checkout (tracked, or new and not ignored), copied; the page's libraries linked."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    for name in listed.stdout.splitlines():
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    (into / "node_modules").symlink_to(ROOT / "node_modules")
    return into


def apply(copy: Path, path: str, how: str, code: str) -> None:
    """One block of a guide: a new file, lines added at the end or to the imports, or a line changed."""
    target = copy / path
    text = target.read_text() if target.exists() else ""
    if how.startswith("a new file"):
        text = code
    elif how.startswith("add at the end"):
        text += "\n\n" + code
    elif how.startswith("add to the imports"):
        last_import = max(m.end() for m in re.finditer(r"^from utils\.\S+ import [^\n]+\n", text, re.M))
        text = text[:last_import] + code + text[last_import:]
    elif how.startswith("add before FLOWS"):
        text = text.replace("\nFLOWS: ", "\n" + code + "\n\nFLOWS: ", 1)
    elif how.startswith("add to FLOWS"):
        start = text.index("\nFLOWS: ")
        end = text.index("\n}", start)
        text = text[:end] + "\n    " + code.strip() + text[end:]
    else:  # a node added to create_chat_flow's list of nodes after a complete reply
        listed = AFTER_THE_REPLY.search(text)
        assert listed, "flow.py no longer lists the nodes after a complete reply"
        nodes = ", ".join(part for part in (listed[2].strip().rstrip(","), code.strip()) if part)
        text = text[: listed.start()] + f"{listed[1]}{nodes}]" + text[listed.end() :]
    target.write_text(text)


def changed_files(copy: Path) -> set[str]:
    changed = set()
    for path in copy.rglob("*"):
        name = path.relative_to(copy).as_posix()
        if path.is_file() and not path.is_symlink() and "__pycache__" not in name and ".pytest_cache" not in name:
            original = ROOT / name
            if not original.is_file() or original.read_bytes() != path.read_bytes():
                changed.add(name)
    return changed


@pytest.fixture
def start(tmp_path: Path, fake: FakeOpenAI) -> Iterator[Callable[[Path], AppProcess]]:
    """Start the app of a changed copy against the fake (killed at the end, whatever happened)."""
    started: list[AppProcess] = []

    def run(copy: Path) -> AppProcess:
        flags = ["--base-url", f"http://127.0.0.1:{fake.port}/v1", "--retry-wait", "0.05", *NO_LIMITS]
        started.append(AppProcess(tmp_path, flags, {"POCKETCHAT_API_KEY": API_KEY}, root=copy))
        return started[-1].start()

    yield run
    for app in started:
        app.kill()


def chat(browser: Browser, app: AppProcess, text: str, **context: Any) -> Page:
    page = browser.new_context(base_url=app.url, **context).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    page.locator("#input").fill(text)
    page.locator("#input").press("Enter")
    expect(page.locator(".message.assistant[data-status=complete]")).to_have_count(1, timeout=20_000)
    assert errors == []
    return page


def applied(tmp_path: Path, blocks: list[tuple[str, str, str]], node: str, test: str) -> Path:
    """A copy of this checkout with a part of the guide applied (`node` named in flow.py's imports), whose
    own test, `test`, passed there."""
    copy = copy_of_checkout(tmp_path / "copy")
    for path, how, code in blocks:
        apply(copy, path, how, code)
    flow = (copy / "flow.py").read_text()
    (copy / "flow.py").write_text(flow.replace("    BuildPrompt,", f"    BuildPrompt,\n    {node},", 1))
    guide_test = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=copy, capture_output=True, text=True
    )
    assert guide_test.returncode == 0 and "1 passed" in guide_test.stdout, guide_test.stdout + guide_test.stderr
    return copy


def test_the_guides_follow_ups_are_four_blocks_whose_test_passes_and_whose_buttons_send_the_question(
    tmp_path, fake, browser, start
):
    assert [path for path, _, _ in BLOCKS] == [
        "utils/follow_ups.py",
        "nodes.py",
        "nodes.py",
        "flow.py",
        "tests/test_follow_ups.py",
    ]
    copy = applied(tmp_path, BLOCKS, "SuggestFollowUps", "tests/test_follow_ups.py")
    assert changed_files(copy) == {"nodes.py", "flow.py", "utils/follow_ups.py", "tests/test_follow_ups.py"}

    app = start(copy)
    fake.queue(Reply(tokens=["Rome ", "is ", "old."]), Reply(tokens=["1. Why is it old?\n2. Who built it?\n3. When?"]))
    page = chat(browser, app, "Tell me about Rome")
    suggestions = page.locator(".steps.below .step-button")
    expect(suggestions).to_have_text(["Why is it old?", "Who built it?", "When?"])
    page.reload()  # kept with the reply: back from the history
    expect(page.locator(".steps.below .step-button")).to_have_count(3)
    fake.queue(Reply(tokens=["Emperors ", "did."]))
    page.locator(".steps.below .step-button").nth(1).click()  # sent as the next message
    expect(page.locator(".message.user").last).to_contain_text("Who built it?")
    expect(page.locator(".message.assistant[data-status=complete]")).to_have_count(2, timeout=20_000)
    app.stop()
    assert "Flow ends" not in app.logs() and "Traceback" not in app.logs()


def test_the_guides_footer_with_a_button_needs_no_page_change_survives_a_reload_and_cannot_fail_the_reply(
    tmp_path, fake, browser, start
):
    """Issue 33's proof: a node that shows a line under complete replies, with a button, is a class in
    nodes.py, an entry in flow.py and a test; no file of the page, no other test."""
    assert [path for path, _, _ in SECOND_BLOCKS] == ["nodes.py", "nodes.py", "flow.py", "tests/test_reply_stats.py"]
    copy = applied(tmp_path, SECOND_BLOCKS, "ReplyStats", "tests/test_reply_stats.py")
    assert changed_files(copy) == {"nodes.py", "flow.py", "tests/test_reply_stats.py"}

    app = start(copy)
    fake.queue(Reply(tokens=["Rome ", "is ", "very ", "old."]))
    page = chat(browser, app, "Tell me about Rome")
    footer = page.locator(".message.assistant .steps.below")
    expect(footer.locator(".step-keyvalue")).to_contain_text("words4")
    helped = footer.get_by_role("button", name="👍 This helped")
    helped.click()
    expect(helped).to_be_disabled()
    expect(helped).to_have_class(re.compile("pressed"))
    page.reload()  # the press is kept with the reply, and refused again
    helped = page.locator(".message.assistant .steps.below").get_by_role("button", name="👍 This helped")
    expect(helped).to_be_disabled()
    expect(helped).to_have_class(re.compile("pressed"))
    app.stop()
    assert "marked helped" in app.logs() and "Traceback" not in app.logs()

    # The same node, broken: the reply is whole all the same, and says plainly that the node could not run.
    nodes = (copy / "nodes.py").read_text()
    (copy / "nodes.py").write_text(nodes.replace("        words = len(reply.split())", "        words = 1 // 0", 1))
    app = start(copy)
    fake.queue(Reply(tokens=["Still ", "whole."]))
    page = chat(browser, app, "Tell me about Rome")
    expect(page.locator(".message.assistant").last).to_contain_text("Still whole.")
    expect(page.locator(".steps.below .step-text")).to_have_text("ReplyStats could not run; the reply is not affected.")
    app.stop()
    assert "ZeroDivisionError" in app.logs()  # the trace is the server log's, not the page's


def test_a_node_of_a_kind_the_page_does_not_know_is_shown_plainly(tmp_path, fake, browser, start):
    copy = copy_of_checkout(tmp_path / "copy")
    node = '''
class CountWords(AsyncNode):
    """Show how many words the reply has."""

    async def prep_async(self, shared: dict[str, Any]) -> str:
        return shared["turn"].reply.content

    async def post_async(self, shared: dict[str, Any], reply: str, _: None) -> None:
        shared["log"].append_step("CountWords", "word_count", {"words": len(reply.split())})
'''
    apply(copy, "nodes.py", "add at the end", node)
    apply(copy, "flow.py", "in create_chat_flow, add to after_a_complete_reply", "CountWords()")
    flow = (copy / "flow.py").read_text()
    (copy / "flow.py").write_text(flow.replace("BuildPrompt,", "BuildPrompt, CountWords,", 1))
    assert changed_files(copy) == {"nodes.py", "flow.py"}

    app = start(copy)
    fake.queue(Reply(tokens=["one ", "two ", "three"]))
    page = chat(browser, app, "Count")
    shown = page.locator(".steps details.other")
    expect(shown.locator("summary")).to_have_text("CountWords · word_count")
    shown.locator("summary").click()
    expect(shown.locator("pre")).to_contain_text('"words": 3')


def test_the_guides_flow_of_its_own_is_picked_in_the_page_and_shapes_the_prompt(tmp_path, fake, browser, start):
    """Issue 33: a flow of one's own, with a node that shapes the prompt, picked in the page."""
    assert [path for path, _, _ in THIRD_BLOCKS] == ["nodes.py", "flow.py", "flow.py", "tests/test_brief.py"]
    copy = applied(tmp_path, THIRD_BLOCKS, "AnswerBriefly", "tests/test_brief.py")
    assert changed_files(copy) == {"nodes.py", "flow.py", "tests/test_brief.py"}

    app = start(copy)
    page = browser.new_context(base_url=app.url).new_page()
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    picker = page.locator("#flow-picker")
    expect(picker.locator("option").first).to_have_text("Chat")
    expect(picker.locator("option").last).to_have_text("Brief")  # the guide's flow joins the list
    picker.select_option("brief")
    expect(picker).to_have_value("brief")
    fake.queue(Reply(tokens=["Rome ", "is ", "old."]))
    page.locator("#input").fill("Tell me about Rome")
    page.locator("#input").press("Enter")
    expect(page.locator(".message.assistant[data-status=complete]")).to_have_count(1, timeout=20_000)
    assert fake.chat_requests[-1]["json"]["messages"][0]["content"].endswith("Answer in three sentences at most.")
    page.reload()
    expect(page.locator("#flow-picker")).to_have_value("brief")
    app.stop()

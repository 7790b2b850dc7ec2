"""Page benchmark: a 20,000-token reply streams into the page in headless Chromium at 100 tokens/s.

The reply mixes prose, lists, tables and fenced code in several languages. Long tasks (main-thread
tasks over 50 ms) are recorded with the browser's PerformanceObserver and the main thread's busy
time with Chrome's own counters. Target: no task over 50 ms. The baseline, in the same run, is the
page as it drew a streaming reply before: the whole Markdown rendered again at every frame (served in
place of static/markdown.js by this script only). Each run also checks that the reply ends exactly
as a full render of its text.

    .venv/bin/python -m bench.page_stream [--tokens 20000] [--repeat 3]
"""

import argparse
import itertools
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from playwright.sync_api import BrowserContext, Page, expect, sync_playwright

from bench.page_long_chat import OBSERVE_LONG_TASKS
from tests import chromium
from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAIThread, Reply
from tests.test_page import BLOCKS_HTML, FULL_RENDER

PACE = 0.01  # seconds between chunks: 100 tokens/s
# Polled once a second: a tighter wait would cost the page time of its own.
REPLY_DONE = """() => document.querySelector(".message.assistant:last-child")?.dataset.status === "complete" """
# The page before: every render draws the whole text at once, as a new view's first render does
# (marked, DOMPurify and highlight.js over the whole text, as the page did at every frame).
WHOLE_TEXT_EVERY_FRAME = """
import { MarkdownView as BlockByBlock, copyCode } from "/static/markdown.js?block-by-block";
export { copyCode };
export class MarkdownView {
  constructor(element) {
    this.element = element;
  }
  render(text) {
    new BlockByBlock(this.element).render(text);
  }
}
"""
CODE = {
    "python": 'def total_{i}(items: list[int]) -> int:\n    """Sum them."""\n    return sum(x * {i} for x in items)\n',
    "javascript": "function total{i}(items) {{\n  return items.reduce((sum, x) => sum + x * {i}, 0);\n}}\n",
    "rust": "fn total_{i}(items: &[i64]) -> i64 {{\n    items.iter().map(|x| x * {i}).sum()\n}}\n",
    "sql": "SELECT id, SUM(amount) * {i} AS total\nFROM orders\nWHERE status = 'paid'\nGROUP BY id;\n",
    "bash": 'for file in *.log; do\n  grep -c "error {i}" "$file"\ndone\n',
}
SECTION = """## Step {i}: {language}

This step explains **part {i}** of the answer, with `inline_code_{i}()` and a
[link](https://example.org/step/{i}). The sentence goes on for a while, so that the paragraph wraps
over several lines on a normal screen and layout has some real work to do.

- a first point about step {i}
- a second point, with *emphasis*
  - and a nested detail

```{language}
{code}```

| step | language | lines |
|------|----------|-------|
| {i} | {language} | {lines} |

"""


def reply_text(tokens: int) -> list[str]:
    """About `tokens` word-sized pieces of Markdown, as a model would stream them."""
    pieces: list[str] = []
    for i, language in zip(itertools.count(1), itertools.cycle(CODE)):
        code = CODE[language].format(i=i)
        section = SECTION.format(i=i, language=language, code=code, lines=code.count("\n"))
        pieces += re.findall(r"\s*\S+|\s+", section)
        if len(pieces) >= tokens:
            return pieces[:tokens]
    raise AssertionError("unreachable")


@dataclass
class Run:
    long_tasks: list[float]
    busy_s: float  # main-thread task time during the stream
    seconds: float  # from sending the message to the reply drawn complete


def measure(context: BrowserContext, url: str, fake_queue, pieces: list[str]) -> Run:
    page = context.new_page()
    page.goto(url)
    expect(page.locator("#send")).to_be_enabled()
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")
    fake_queue(Reply(tokens=pieces, pace=PACE))
    page.locator("#input").fill("Explain it step by step, with code.")
    page.evaluate("window.__longTasks.length = 0")  # the page's loading is not measured
    busy_before = task_seconds(cdp)
    started = time.monotonic()
    page.locator("#input").press("Enter")
    page.wait_for_function(REPLY_DONE, polling=1000, timeout=len(pieces) * PACE * 3000 + 60_000)
    run = Run(page.evaluate("window.__longTasks"), task_seconds(cdp) - busy_before, time.monotonic() - started)
    drawn = page.locator(".message.assistant").last.locator(".body").evaluate(BLOCKS_HTML)
    check_final_render(page, drawn, "".join(pieces))
    page.close()
    return run


def task_seconds(cdp) -> float:
    metrics = cdp.send("Performance.getMetrics")["metrics"]
    return next(metric["value"] for metric in metrics if metric["name"] == "TaskDuration")


def check_final_render(page: Page, drawn: str, text: str) -> None:
    if drawn != page.evaluate(FULL_RENDER, text):
        raise AssertionError("the streamed reply does not end as a full render of its text")


def new_context(browser, baseline: bool) -> BrowserContext:
    context = browser.new_context()
    context.add_init_script(OBSERVE_LONG_TASKS)
    if baseline:
        # Only the module's own URL: the wrapper imports it again under a query string.
        context.route(re.compile(r"/static/markdown\.js$"), lambda route: route.fulfill(
            body=WHOLE_TEXT_EVERY_FRAME, content_type="text/javascript"
        ))  # fmt: skip
    return context


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pieces = reply_text(args.tokens)
    variants = {"whole text every frame (before)": True, "open blocks only (now)": False}
    results: dict[str, list[Run]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAIThread() as fake:
        server = AppProcess(Path(tmp), ["--base-url", f"http://127.0.0.1:{fake.port}/v1"])
        try:
            server.start()
            with sync_playwright() as playwright:
                browser = chromium.launch(playwright)
                for _ in range(args.repeat):
                    for name, baseline in variants.items():
                        context = new_context(browser, baseline)
                        results[name].append(measure(context, server.url + "/", fake.queue, pieces))
                        context.close()
                browser.close()
        finally:
            server.stop()
    report(results, args, len("".join(pieces)))


def report(results: dict[str, list[Run]], args: argparse.Namespace, chars: int) -> None:
    print(f"a {args.tokens}-token reply ({chars} characters) at {1 / PACE:.0f} tokens/s, {args.repeat} runs each")
    print("medians:\n")
    longest, busy = {}, {}
    for name, runs in results.items():
        longest[name] = statistics.median(max(run.long_tasks, default=0.0) for run in runs)
        busy[name] = statistics.median(run.busy_s for run in runs)
        count = statistics.median(len(run.long_tasks) for run in runs)
        total = statistics.median(sum(run.long_tasks) for run in runs)
        seconds = statistics.median(run.seconds for run in runs)
        print(
            f"{name:>31}: longest task {longest[name]:5.0f} ms, {count:5.0f} long tasks, "
            f"{total:6.0f} ms in long tasks, main thread busy {busy[name]:6.1f} s of {seconds:.0f} s"
        )
    before, now = results
    worst = max(max(run.long_tasks, default=0.0) for run in results[now])
    print(f"\nlongest task of any run now: {worst:.0f} ms (target: none over 50 ms)")
    print(f"main thread busy, before / now: x{busy[before] / busy[now]:.1f}")
    if longest[now]:
        print(f"longest task, before / now: x{longest[before] / longest[now]:.1f}")


if __name__ == "__main__":
    main()

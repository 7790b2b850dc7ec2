"""Page benchmark: open a 500-message conversation and scroll through it in headless Chromium,
recording long tasks (main-thread tasks over 50 ms) with the browser's PerformanceObserver.
Target: no long task over 200 ms. The baseline, in the same run, opens a 2-message conversation.

    .venv/bin/python -m bench.page_long_chat [--messages 500] [--repeat 3]
"""

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from playwright.sync_api import Page, expect, sync_playwright

from pocketchat.records import ConversationRecord, Message
from pocketchat.store.sqlite import SqliteStore
from tests import chromium
from tests.conftest import AppProcess

REPLY = """Here is what I found about item {i}:

1. **First**, a point with `inline code` and a [link](https://example.org/{i}).
2. *Second*, a longer sentence that wraps across the line on a narrow screen, to give layout some work.

| key | value |
|-----|-------|
| id  | {i}   |

```python
def item_{i}(x: int) -> int:
    return x * {i}
```
"""
OBSERVE_LONG_TASKS = """
window.__longTasks = [];
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) window.__longTasks.push(entry.duration);
}).observe({ type: "longtask", buffered: true });
"""


def make_conversation(db: Path, messages: int) -> str:
    async def write() -> str:
        store = SqliteStore(db)
        await store.open()
        record = ConversationRecord(model="bench-model", system_prompt="", title=f"{messages} messages")
        await store.create_conversation(record)
        history = [
            Message(role="user", content=f"Question {i}: tell me about item {i}.")
            if i % 2 == 0
            else Message(role="assistant", content=REPLY.format(i=i), meta={"model": "bench-model"})
            for i in range(messages)
        ]
        await store.save_messages(record.id, history)
        await store.close()
        return record.id

    return asyncio.run(write())


def measure(page: Page, url: str, session: str, messages: int) -> list[float]:
    """Open the conversation, wait for every message, scroll to the top and back; the long tasks seen."""
    page.add_init_script(f"localStorage.setItem('pocketchat.session', {session!r});" + OBSERVE_LONG_TASKS)
    page.goto(url)
    expect(page.locator(".message")).to_have_count(messages, timeout=60_000)
    for fraction in [i / 10 for i in range(10, -1, -1)] + [i / 10 for i in range(11)]:
        page.evaluate(f"(s => s.scrollTop = s.scrollHeight * {fraction})(document.getElementById('scroller'))")
        page.wait_for_timeout(60)
    page.wait_for_timeout(300)
    return page.evaluate("window.__longTasks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # No provider is needed to open a stored conversation.
        server = AppProcess(Path(tmp), ["--base-url", "http://127.0.0.1:9/v1", "--model", "bench-model"])
        long_chat = make_conversation(server.db_path, args.messages)
        short_chat = make_conversation(server.db_path, 2)
        try:
            server.start()
            results: dict[str, list[list[float]]] = {"2 messages": [], f"{args.messages} messages": []}
            with sync_playwright() as playwright:
                browser = chromium.launch(playwright)
                for _ in range(args.repeat):
                    for name, session, count in (
                        ("2 messages", short_chat, 2),
                        (f"{args.messages} messages", long_chat, args.messages),
                    ):
                        context = browser.new_context()
                        results[name].append(measure(context.new_page(), server.url + "/", session, count))
                        context.close()
                browser.close()
        finally:
            server.stop()
    print(f"long tasks (> 50 ms) while opening and scrolling, {args.repeat} runs each, medians\n")
    longest = {}
    for name, runs in results.items():
        longest[name] = statistics.median(max(run, default=0.0) for run in runs)
        count = statistics.median(len(run) for run in runs)
        total = statistics.median(sum(run) for run in runs)
        print(f"{name:>13}: longest {longest[name]:6.0f} ms, {count:3.0f} long tasks, {total:6.0f} ms in long tasks")
    worst = max(max(run, default=0.0) for run in results[f"{args.messages} messages"])
    print(f"\nlongest task of any {args.messages}-message run: {worst:.0f} ms (target: none over 200 ms)")
    base = longest["2 messages"]
    if base:
        print(
            f"ratio of longest tasks, {args.messages} / 2 messages: x{longest[f'{args.messages} messages'] / base:.2f}"
        )


if __name__ == "__main__":
    main()

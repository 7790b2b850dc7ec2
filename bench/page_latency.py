"""Page benchmark: what a daily user feels first, in headless Chromium against the fake provider at no delay.

- first paint: the page's first contentful paint, a cold load (a new browser context each time);
- weight on the wire: requests, and bytes transferred (compressed or not) and decoded, of a cold load and
  of a later visit (what the cache saves: a file the cache holds and may use unasked costs no request);
- Enter to the first visible token: from the Enter key's event to the first animation frame at which the
  reply shows text.

The baseline, in the same run, is another commit of this checkout (`--baseline`, default the branch's
merge base with `main`), extracted with `git archive` and run the same way, turn about with this one.

    .venv/bin/python -m bench.page_latency [--baseline REF] [--repeat 15]
"""

import argparse
import statistics
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests import chromium
from tests.conftest import NO_LIMITS, ROOT, AppProcess
from tests.fake_openai import FakeOpenAIThread, Reply

# Installed before the page's scripts: the Enter key's time is taken before the page's own handler runs.
WATCH_ENTER = """
document.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && event.target.id === "input") window.__enterAt = event.timeStamp;
}, { capture: true });
"""
# Watches for the next reply: window.__firstToken resolves with the ms from Enter to the first frame at
# which it shows text.
WATCH_FIRST_TOKEN = """() => { window.__firstToken = new Promise((resolve) => {
  const transcript = document.getElementById("transcript");
  const before = transcript.querySelectorAll(".message.assistant").length;
  const shown = () => {
    const replies = transcript.querySelectorAll(".message.assistant");
    return replies.length > before && replies[replies.length - 1].querySelector(".body").textContent.trim() !== "";
  };
  const observer = new MutationObserver(() => {
    if (!shown()) return;
    observer.disconnect();
    requestAnimationFrame(() => resolve(performance.now() - window.__enterAt));
  });
  observer.observe(transcript, { childList: true, subtree: true, characterData: true });
}); }"""
WEIGHT = """() => {
  const entries = [...performance.getEntriesByType("navigation"), ...performance.getEntriesByType("resource")];
  const files = entries.filter((e) => /\\/(static|vendor)\\//.test(e.name));
  const sum = (list, key) => list.reduce((total, e) => total + e[key], 0);
  const fetched = entries.filter((e) => e.transferSize > 0); // not from the cache without asking
  return { requests: entries.length, fetched: fetched.length, files: files.length,
           transferred: sum(entries, "transferSize"),
           filesTransferred: sum(files, "transferSize"), filesDecoded: sum(files, "decodedBodySize") };
}"""
FIRST_PAINT = """() => performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? null"""


@dataclass
class Runs:
    first_paint: list[float] = field(default_factory=list)
    first_token: list[float] = field(default_factory=list)
    cold: dict = field(default_factory=dict)
    later: dict = field(default_factory=dict)


def checkout_of(ref: str, into: Path) -> Path:
    """The files of commit `ref`, with this checkout's node_modules."""
    into.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "node_modules").symlink_to(ROOT / "node_modules")
    return into


def opened(browser: Browser, app: AppProcess) -> Page:
    page = browser.new_context(base_url=app.url).new_page()
    page.add_init_script(WATCH_ENTER)
    page.goto("/")
    expect(page.locator("#send")).to_be_enabled()
    page.wait_for_load_state("networkidle")  # every request the page makes at its start has ended
    return page


def measure(browser: Browser, app: AppProcess, turns: int, runs: Runs) -> None:
    """One cold load (its first paint and weight), a later visit's weight, then `turns` messages sent with Enter."""
    page = opened(browser, app)
    runs.first_paint.append(page.evaluate(FIRST_PAINT))
    runs.cold = page.evaluate(WEIGHT)
    page.goto("/")  # a later visit: what the cache saves
    expect(page.locator("#send")).to_be_enabled()
    page.wait_for_load_state("networkidle")  # every request the page makes at its start has ended
    runs.later = page.evaluate(WEIGHT)
    for index in range(turns):
        page.locator("#input").fill(f"Say something short, number {index}")
        page.evaluate(WATCH_FIRST_TOKEN)
        page.locator("#input").press("Enter")
        runs.first_token.append(page.evaluate("window.__firstToken"))
        expect(page.locator(".message.assistant[data-status=streaming]")).to_have_count(0)
    page.context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="a commit or branch (default: the merge base with main)")
    parser.add_argument("--repeat", type=int, default=15, help="cold loads of each; each sends 3 messages")
    args = parser.parse_args()
    baseline = (
        args.baseline
        or subprocess.run(
            ["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    results = {f"before ({baseline[:10]})": Runs(), "now": Runs()}
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAIThread() as fake, sync_playwright() as playwright:
        roots = [checkout_of(baseline, Path(tmp) / "baseline"), ROOT]
        flags = ["--base-url", f"http://127.0.0.1:{fake.port}/v1", "--api-key", "sk-bench", *NO_LIMITS]
        for name in ("a", "b"):
            (Path(tmp) / name).mkdir()  # each app's database and log
        apps = [AppProcess(Path(tmp) / name, flags, root=root) for name, root in zip(("a", "b"), roots, strict=True)]
        browser = chromium.launch(playwright)
        try:
            for app in apps:
                app.start()
            fake.default = Reply(count=5)  # no delay: the page's and the app's own time
            for _ in range(args.repeat):
                for app, runs in zip(apps, results.values(), strict=True):
                    measure(browser, app, 3, runs)
        finally:
            browser.close()
            for app in apps:
                app.stop()
    report(results, args.repeat)


def report(results: dict[str, Runs], repeat: int) -> None:
    print(f"{repeat} cold loads and {repeat * 3} messages each, the fake at no delay; medians\n")
    for name, runs in results.items():
        paint = statistics.median(runs.first_paint)
        token = statistics.median(runs.first_token)
        print(f"{name:>22}: first paint {paint:5.0f} ms | Enter to first token {token:5.1f} ms "
              f"(p90 {statistics.quantiles(runs.first_token, n=10)[-1]:5.1f})")  # fmt: skip
        for load in ("cold", "later"):
            w = getattr(runs, load)
            print(f"{'':>24}{load:>6}: {w['requests']:3d} requests ({w['fetched']:2d} to the server), "
                  f"{w['transferred'] / 1000:6.1f} kB on the wire; scripts and styles: {w['files']} files, "
                  f"{w['filesTransferred'] / 1000:6.1f} kB on the wire, "
                  f"{w['filesDecoded'] / 1000:6.1f} kB decoded")  # fmt: skip
    before, now = results.values()
    paint = statistics.median(now.first_paint) / statistics.median(before.first_paint)
    token = statistics.median(now.first_token) / statistics.median(before.first_token)
    print(f"\nratio now / before: first paint x{paint:.2f}, Enter to first token x{token:.2f}")


if __name__ == "__main__":
    main()

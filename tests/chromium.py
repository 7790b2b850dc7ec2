"""Debian's Chromium under playwright, launched the one way that works on this machine and in CI."""

from playwright.sync_api import Browser, Playwright

EXECUTABLE = "/usr/bin/chromium"
# Playwright's own browser download fails offline; Chromium's background calls home are refused here.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]  # fmt: skip


def launch(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(executable_path=EXECUTABLE, args=ARGS)

"""Sign-in in the page, in real headless Chromium: the sign-in page, the link, signing out (here and
in another tab), a sign-out forged by a page of another origin, limits shown with their wait, and
the user's name behind a proxy."""

import html
import http.server
import threading
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import AppProcess
from tests.fake_openai import FakeOpenAI
from tests.test_page import replies, send, wait_done

pytestmark = pytest.mark.browser
TOKEN = "a-token-for-the-page-0123456789"


@pytest.fixture
def token_app(start_app) -> AppProcess:
    return start_app("--auth", "token", "--token", TOKEN)


def sign_in(page: Page, app: AppProcess, token: str = TOKEN) -> None:
    page.goto(app.url + "/")
    expect(page).to_have_url(app.url + "/login")  # no session: the sign-in page
    page.get_by_label("Access token").fill(token)
    page.get_by_role("button", name="Sign in").click()


def test_signing_in_and_out_in_the_page(browser: Browser, token_app: AppProcess, fake: FakeOpenAI):
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, token_app, "not-the-right-token-0000")
    expect(page.get_by_role("alert")).to_have_text("That token is not right.")
    page.get_by_label("Access token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(token_app.url + "/")
    expect(page.locator("#send")).to_be_enabled()  # the socket got `ready`
    send(page, "signed in")
    wait_done(page)
    cookie = next(c for c in context.cookies() if c["name"] == "pocketchat_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    other_tab = context.new_page()
    other_tab.goto(token_app.url + "/")
    expect(other_tab.locator("#send")).to_be_enabled()
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(token_app.url + "/login")
    # The other tab's socket is closed with 4401: it shows the sign-in page too.
    expect(other_tab).to_have_url(token_app.url + "/login", timeout=15_000)
    context.close()
    assert errors == []


def test_a_sign_in_link_signs_in_and_leaves_a_clean_url(browser: Browser, token_app: AppProcess):
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{token_app.url}/login?token={TOKEN}")
    expect(page).to_have_url(token_app.url + "/")
    expect(page.locator("#send")).to_be_enabled()
    assert TOKEN not in page.evaluate("location.href + document.referrer + history.length")
    context.close()


class OtherSite:
    """A page on another origin (another port of the same host: the same site, so the session cookie
    goes along; only the Origin check stands in the way), serving `html`."""

    def __init__(self, html: str) -> None:
        form = html.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(form)

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def posting_a_form_to(target: str) -> str:
    """A page that posts a form to `target` on load."""
    return (
        f'<form id="f" method="post" action="{target}"><input name="token" value="x"></form>'
        "<script>document.getElementById('f').submit()</script>"
    )


def a_sandboxed_frame_opening(ws_url: str) -> str:
    """A page whose sandboxed iframe (an opaque origin: its socket says `Origin: null`) opens the app's
    socket, says hello and sends a message; the frame reports each event to the page's `events`."""
    frame = (
        f"<script>const ws = new WebSocket('{ws_url}'); const tell = (what) => parent.postMessage(what, '*');"
        "ws.onopen = () => { tell('open'); ws.send(JSON.stringify({type: 'hello'}));"
        " ws.send(JSON.stringify({type: 'message', content: 'sent by another site'})); };"
        "ws.onmessage = (event) => tell(JSON.parse(event.data).type);"
        "ws.onclose = (event) => tell('close ' + event.code);</script>"
    )
    return (
        "<script>window.events = []; addEventListener('message', (event) => window.events.push(event.data));</script>"
        f'<iframe sandbox="allow-scripts" srcdoc="{html.escape(frame)}"></iframe>'
    )


@pytest.fixture
def other_site(token_app: AppProcess) -> Iterator[OtherSite]:
    site = OtherSite(posting_a_form_to(token_app.url + "/logout"))
    yield site
    site.close()


def test_a_sign_out_posted_by_a_page_of_another_origin_is_refused(
    browser: Browser, token_app: AppProcess, other_site: OtherSite
):
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, token_app)
    expect(page.locator("#send")).to_be_enabled()
    attacker = context.new_page()
    with attacker.expect_response(token_app.url + "/logout") as answer:
        attacker.goto(other_site.url)
    assert answer.value.status == 403
    assert answer.value.request.headers["origin"] == other_site.url.rstrip("/")
    page.reload()  # still signed in
    expect(page).to_have_url(token_app.url + "/")
    expect(page.locator("#send")).to_be_enabled()
    context.close()


@pytest.mark.parametrize("allowed", [False, True])
def test_a_sandboxed_frame_on_another_site_cannot_open_the_socket(
    browser: Browser, start_app, fake: FakeOpenAI, allowed: bool
):
    """With no sign-in (loopback), the socket's Origin check is all that keeps another site's page from
    chatting on the operator's key. A sandboxed frame's `Origin: null` is refused, unless the operator
    lists `null` (which shows the frame would get through otherwise)."""
    app = start_app(*(["--allowed-origins", "null"] if allowed else []))
    site = OtherSite(a_sandboxed_frame_opening(app.ws_url))
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(site.url)
        settled = "window.events.some((event) => event === 'ready' || event.startsWith('close'))"
        page.wait_for_function(settled, timeout=15_000)
        events = page.evaluate("window.events")
    finally:
        context.close()
        site.close()
    if allowed:
        assert "ready" in events
        return
    assert "ready" not in events and "open" not in events, events
    assert app.get("/api/conversations") == {"conversations": []}
    assert fake.chat_requests == []  # no turn ran on the operator's key


def test_over_a_limit_the_page_says_how_long_to_wait_and_keeps_the_message(browser: Browser, start_app):
    app = start_app("--limit-messages-per-minute", "1")
    context = browser.new_context()
    page = context.new_page()
    page.goto(app.url + "/")
    expect(page.locator("#send")).to_be_enabled()
    send(page, "the one message this minute")
    wait_done(page)
    send(page, "one too many")
    notice = page.locator(".message.notice-only .notice")
    expect(notice).to_contain_text("messages in the last minute")
    # As drawn, not only in the DOM: a message is drawn once the frame after it came finds it on screen.
    expect(notice).to_contain_text("Try again in", use_inner_text=True)
    expect(notice).to_contain_text(" s.")
    expect(page.locator("#input")).to_have_value("one too many")
    expect(replies(page)).to_have_count(1)
    context.close()


def test_behind_a_proxy_the_page_names_the_user_and_offers_no_sign_in(browser: Browser, start_app):
    app = start_app("--auth", "header")
    context = browser.new_context(extra_http_headers={"X-Forwarded-User": "ada@example.org"})
    page = context.new_page()
    page.goto(app.url + "/")
    expect(page.locator("#user-name")).to_have_text("ada@example.org")
    expect(page.get_by_role("button", name="Sign out")).to_have_count(0)
    expect(page.locator("#send")).to_be_enabled()
    page.goto(app.url + "/login")
    expect(page).to_have_url(app.url + "/")  # the proxy signs people in, not this page
    context.close()

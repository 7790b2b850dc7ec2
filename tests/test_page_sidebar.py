"""The sidebar, in real Chromium against the app, on a desktop (1280x800) and a phone (390x844): its
conversations grouped by date, each row's actions in a ⋯ menu (by mouse, keyboard and touch), Import at
the top with its result in view, the phone's drawer closed by a tap beside it or a swipe, and what it says
when there is nothing to list."""

import copy
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import AppProcess
from tests.test_import import CHATGPT, imported, trips
from tests.test_page import PageUnderTest, send, wait_done
from tests.test_page_composer import SCREENS
from tests.test_page_import import pick

pytestmark = pytest.mark.browser
ZONE = ZoneInfo("Europe/Paris")
NOW = datetime(2026, 6, 15, 12, 0, tzinfo=ZONE)  # the browser's clock, in its time zone
# When each conversation last changed, and the group it is listed in.
DATED = [
    ("Fix the flaky test", NOW - timedelta(hours=3), "Today"),
    ("Plan a weekend in Lisbon with the kids", NOW.replace(hour=0, minute=5), "Today"),
    ("Late-night question", NOW.replace(hour=0) - timedelta(minutes=30), "Yesterday"),
    ("Sourdough starter", NOW - timedelta(days=5), "Last 7 days"),
    ("Tax return", NOW - timedelta(days=26), "Last 30 days"),
    ("Bike repair", datetime(2026, 4, 3, 18, 0, tzinfo=ZONE), "April 2026"),
    ("Christmas menu", datetime(2025, 12, 24, 10, 0, tzinfo=ZONE), "December 2025"),
]


def chatgpt_file(titled: list[tuple[str, datetime]]) -> bytes:
    """A ChatGPT export of one short conversation per (title, last changed)."""
    lisbon = json.loads(CHATGPT.read_text())[0]
    return json.dumps([
        copy.deepcopy(lisbon) | {"title": title, "create_time": when.timestamp() - 60, "update_time": when.timestamp()}
        for title, when in titled
    ]).encode()  # fmt: skip


def open_page(browser: Browser, app: AppProcess, screen: str, **context: object) -> tuple[PageUnderTest, Page]:
    under_test = PageUnderTest(browser, app, **SCREENS[screen], **context)
    return under_test, under_test.open()


@pytest.fixture(params=list(SCREENS))
def screen(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def opened(browser: Browser, app: AppProcess, screen: str) -> Iterator[Page]:
    under_test, page = open_page(browser, app, screen)
    yield page
    under_test.context.close()
    assert under_test.errors == []


def show_sidebar(page: Page) -> None:
    if page.locator("#toggle-sidebar").is_visible():
        page.locator("#toggle-sidebar").click()
    expect(page.locator("#sidebar")).to_be_in_viewport(ratio=0.9)


def test_conversations_are_grouped_by_the_day_they_last_changed(browser: Browser, app: AppProcess, screen: str):
    imported(app, chatgpt_file([(title, when) for title, when, _ in DATED]))
    under_test = PageUnderTest(browser, app, **SCREENS[screen], timezone_id="Europe/Paris")
    under_test.context.clock.set_fixed_time(NOW)
    page = under_test.open()
    show_sidebar(page)
    groups = {group for _, _, group in DATED}
    headings = page.locator("#conversation-list .group-heading")
    expect(headings).to_have_text(list(dict.fromkeys(group for _, _, group in DATED)))
    for group in groups:
        rows = page.get_by_role("list", name=group).locator(".open")
        expect(rows).to_have_text([title for title, _, in_group in DATED if in_group == group])
    under_test.context.close()
    assert under_test.errors == []


def test_a_rows_actions_are_in_a_menu_the_keyboard_reaches(opened: Page, screen: str):
    page = opened
    send(page, "Plan a weekend in Lisbon with the kids")
    wait_done(page)
    page.keyboard.press("Control+Shift+O")  # a new chat
    expect(page.locator(".message")).to_have_count(0)
    send(page, "Delete me")
    wait_done(page)
    show_sidebar(page)
    row = page.locator("#conversation-list li", has_text="Plan a weekend")
    title = row.locator(".open")
    more = row.get_by_role("button", name="Actions for “Plan a weekend in Lisbon with the kids”")
    if screen == "desktop":  # the title has the whole row; the ⋯ shows when the row is pointed at
        page.mouse.move(1000, 400)
        assert title.bounding_box()["width"] >= row.bounding_box()["width"] - 2
        expect(more).to_have_css("opacity", "0")
        row.hover()
        expect(more).to_have_css("opacity", "1")
    title.focus()
    page.keyboard.press("Tab")
    expect(more).to_be_focused()
    expect(more).to_have_css("opacity", "1")  # seen when focused
    page.keyboard.press("Enter")
    menu = page.get_by_role("menu", name="Actions for “Plan a weekend in Lisbon with the kids”")
    expect(menu).to_be_visible()
    expect(more).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_role("menuitem", name="Rename")).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(page.get_by_role("menuitem", name="Delete")).to_be_focused()
    page.keyboard.press("Escape")
    expect(menu).to_be_hidden()
    expect(more).to_be_focused()
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")  # Rename
    page.get_by_label("New title").fill("Lisbon weekend")
    page.get_by_label("New title").press("Enter")
    expect(page.locator("#conversation-list .open", has_text="Lisbon weekend")).to_have_count(1)
    page.get_by_role("button", name="Actions for “Delete me”").click()
    page.get_by_role("menuitem", name="Delete").click()
    page.locator("#delete-dialog").get_by_role("button", name="Delete").click()
    expect(page.locator("#conversation-list li")).to_have_count(1)


def test_on_a_touch_screen_each_rows_menu_shows_and_opens_with_a_tap(browser: Browser, app: AppProcess):
    under_test, page = open_page(browser, app, "phone")
    send(page, "a question from the phone")
    wait_done(page)
    page.locator("#toggle-sidebar").click()
    more = page.get_by_role("button", name="Actions for “a question from the phone”")
    expect(more).to_have_css("opacity", "1")  # no hover on a touch screen: always shown
    more.tap()
    page.get_by_role("menuitem", name="Delete").tap()
    expect(page.locator("#delete-dialog")).to_be_visible()
    page.locator("#delete-dialog").get_by_role("button", name="Cancel").tap()
    under_test.context.close()
    assert under_test.errors == []


def test_import_is_at_the_top_and_its_result_shows_there_with_forty_conversations(opened: Page):
    page = opened
    show_sidebar(page)
    expect(page.locator("#import")).to_be_in_viewport(ratio=1)
    pick(page, "conversations.json", trips(40))
    status = page.locator("#import-status")
    expect(status).to_contain_text("Imported 40 conversations.", timeout=60_000)
    expect(page.locator("#conversation-list li")).to_have_count(40)
    expect(status).to_be_in_viewport(ratio=1)
    expect(page.locator("#import")).to_be_in_viewport(ratio=1)
    page.locator("#conversation-list li").last.scroll_into_view_if_needed()  # the list scrolls on its own
    expect(page.locator("#import")).to_be_in_viewport(ratio=1)
    pick(page, "notes.json", b"{not json")
    expect(status).to_contain_text("could not be imported")
    expect(status).to_be_in_viewport(ratio=1)


def swipe_left(page: Page, y: float) -> None:
    """A finger moved left across the drawer, through the browser's touch input."""
    cdp = page.context.new_cdp_session(page)
    for kind, x in (("touchStart", 280), ("touchMove", 220), ("touchMove", 140), ("touchMove", 60)):
        cdp.send("Input.dispatchTouchEvent", {"type": kind, "touchPoints": [{"x": x, "y": y}]})
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})


def test_on_a_phone_a_tap_beside_the_drawer_or_a_swipe_closes_it(browser: Browser, app: AppProcess):
    under_test, page = open_page(browser, app, "phone")
    sidebar, toggle = page.locator("#sidebar"), page.locator("#toggle-sidebar")
    backdrop = page.locator("#sidebar-backdrop")
    expect(backdrop).to_be_hidden()
    toggle.click()
    expect(sidebar).to_be_in_viewport(ratio=0.9)
    expect(backdrop).to_be_visible()
    assert page.evaluate("document.querySelector('.main').inert")  # the chat behind it is out of reach
    page.touchscreen.tap(370, 400)  # the dimmed chat beside it
    expect(toggle).to_have_attribute("aria-expanded", "false")
    expect(sidebar).not_to_be_in_viewport()
    expect(backdrop).to_be_hidden()
    toggle.click()
    expect(sidebar).to_be_in_viewport(ratio=0.9)
    swipe_left(page, 500)
    expect(sidebar).not_to_be_in_viewport()
    toggle.click()
    expect(sidebar).to_be_in_viewport(ratio=0.9)
    page.keyboard.press("Escape")
    expect(sidebar).not_to_be_in_viewport()
    expect(toggle).to_be_focused()
    assert not page.evaluate("document.querySelector('.main').inert")
    under_test.context.close()
    assert under_test.errors == []


def test_a_new_users_sidebar_and_a_search_without_hits_say_so(opened: Page):
    page = opened
    show_sidebar(page)
    empty = page.locator("#no-conversations")
    expect(empty).to_be_visible()
    expect(empty).to_contain_text("No conversations yet")
    page.locator("#search-box").fill("zebra")
    status = page.locator("#search-status")
    expect(status).to_have_text("No conversations match “zebra”.")
    expect(status).to_be_in_viewport(ratio=1)
    page.keyboard.press("Escape")
    expect(empty).to_be_visible()
    expect(status).to_have_text("")


def test_one_passage_and_one_conversation_are_said_in_the_singular(opened: Page):
    page = opened
    page.locator("#file-picker").set_input_files(
        [{"name": "note.md", "mimeType": "text/markdown", "buffer": b"A short note about herons."}]
    )
    expect(page.locator("#documents .document")).to_contain_text("ready · 1 passage", timeout=60_000)
    expect(page.locator("#documents .document")).not_to_contain_text("passages")
    show_sidebar(page)
    pick(page, "conversations.json", trips(1))
    expect(page.locator("#import-status")).to_contain_text("Imported 1 conversation.", timeout=60_000)

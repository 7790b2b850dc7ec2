"""One user's hostile input never holds up another (issue 30): the work it sets the cost of runs in the job
workers (pocketchat/jobs), within budgets, while the event loop and the other users go on. Each test replays
a row of the issue's table (tests/hostile_files.py) as Mallory, while Bob uses the app."""

import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from tests import hostile_files
from tests.conftest import AppProcess
from tests.test_documents import new_conversation, upload
from tests.test_images import PNG
from tests.test_images import upload as upload_image
from tests.test_tools import steps

MALLORY, BOB = {"X-Forwarded-User": "mallory"}, {"X-Forwarded-User": "bob"}
# Short budgets: what used to hold the server for a minute is stopped in seconds.
BUDGETS = ("--auth", "header", "--job-seconds", "3")
PROMPT = 10.0  # seconds Bob may wait, at most, for what took him under one before (it took him 20-55 s)


class Livez:
    """/livez asked every 100 ms in the background: the slowest answer while the block ran."""

    def __init__(self, app: AppProcess) -> None:
        self.url = app.url + "/livez"
        self.slowest = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._ask, daemon=True)

    def _ask(self) -> None:
        while not self._done.wait(0.1):
            started = time.monotonic()
            try:
                urllib.request.urlopen(self.url, timeout=60).close()
            finally:
                self.slowest = max(self.slowest, time.monotonic() - started)

    def __enter__(self) -> "Livez":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join(60)


def while_mallory(mallory: Callable[[], Any], bob: Callable[[], Any]) -> tuple[Any, Any, float]:
    """Mallory's request, and once it is under way Bob's: (Mallory's answer, Bob's, Bob's seconds)."""
    answer: list[Any] = []
    sender = threading.Thread(target=lambda: answer.append(mallory()), daemon=True)
    sender.start()
    time.sleep(0.5)  # Mallory's job is running
    started = time.monotonic()
    bobs = bob()
    waited = time.monotonic() - started
    sender.join(60)
    assert answer, "Mallory's request never ended"
    return answer[0], bobs, waited


def upload_while_bob_uploads(app: AppProcess, name: str, data: bytes) -> tuple[tuple[int, Any], float]:
    """Mallory uploads `data` as `name`; meanwhile Bob uploads a small text file. (Mallory's answer, the
    seconds Bob waited for his); /livez answered all along."""
    _, mallorys = new_conversation(app, **MALLORY)
    _, bobs = new_conversation(app, **BOB)
    with Livez(app) as livez:
        answer, bobs_answer, waited = while_mallory(
            lambda: upload(app, mallorys, name, data, **MALLORY),
            lambda: upload(app, bobs, "bob.txt", b"Bob's twenty bytes.", **BOB),
        )
    assert bobs_answer[0] == 201
    assert livez.slowest < PROMPT
    return answer, waited


def test_a_pdf_that_takes_minutes_to_read_is_stopped_and_holds_no_one_up(start_app):
    """Row 4: 20 pages sharing one 1 MB content stream held the one document reader 56 s."""
    app = start_app(*BUDGETS)
    (status, answer), waited = upload_while_bob_uploads(app, "report.pdf", hostile_files.shared_stream_pdf())
    assert status == 422 and "took longer than the 3 s" in answer["detail"]
    assert waited < PROMPT


def test_an_html_file_of_close_tags_holds_no_one_up(start_app):
    """Row 5: `"</" * 200000` held the reader 41 s in html.parser."""
    app = start_app(*BUDGETS)
    (status, answer), waited = upload_while_bob_uploads(app, "page.html", hostile_files.close_tags_html())
    assert status in (201, 422), answer  # read (a parser that stays linear) or stopped at its budget
    assert waited < PROMPT


def test_a_text_of_one_run_of_spaces_holds_no_one_up(start_app):
    """Row 3: a 100 KB run of spaces took 24 s in one regex, holding the GIL."""
    app = start_app(*BUDGETS)
    (status, answer), waited = upload_while_bob_uploads(app, "notes.txt", hostile_files.spaces_text())
    assert status in (201, 422), answer
    assert waited < PROMPT


def test_an_image_of_thousands_of_scans_is_stopped_and_holds_no_one_up(start_app):
    """Row 6: a progressive JPEG of 2,080 scans decoded for 23 s on the one image thread."""
    app = start_app(*BUDGETS)
    _, mallorys = new_conversation(app, **MALLORY)
    _, bobs = new_conversation(app, **BOB)
    with Livez(app) as livez:
        (status, answer), bobs_answer, waited = while_mallory(
            lambda: upload_image(app, mallorys, "photo.jpg", hostile_files.many_scans_jpeg(), **MALLORY),
            lambda: upload_image(app, bobs, "dot.png", PNG, **BOB),
        )
    assert status == 422 and "took longer than the 3 s" in answer["detail"]
    assert bobs_answer[0] == 201 and waited < PROMPT
    assert livez.slowest < PROMPT


def test_a_calculation_without_end_is_stopped_and_the_server_answers_meanwhile(start_app, fake):
    """Row 1: the model's `round(1,-10**9)` held the event loop for minutes; SIGTERM went unheard."""
    app = start_app("--auth", "header")
    fake.queue(hostile_files.calculator_replies()[0])  # Mallory's model calls the calculator
    mallory, _ = new_conversation(app, **MALLORY)
    bob, _ = new_conversation(app, **BOB)
    with Livez(app) as livez:
        frames, bobs_frames, waited = while_mallory(
            lambda: mallory.turn("Round one to a billion digits.", timeout=60), lambda: bob.turn("Hello?")
        )
    (result,) = steps(frames, "tool_result")
    assert result["data"]["error"], result  # an error the model reads: refused, or stopped at its budget
    assert frames[-1]["status"] == "complete"
    assert bobs_frames[-1]["status"] == "complete" and waited < PROMPT
    assert livez.slowest < PROMPT

"""A step's button comes back to the flow that showed it (a `press` frame, pocketchat/presses.py), checked
like any frame: an unknown, stale, replayed or foreign press is a `bad_frame` that changes nothing. Run on
a copy of this checkout with the guide's ReplyStats node (docs/add-a-node.md, part 2) in its flow."""

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import API_KEY, MODES, NO_LIMITS, AppProcess, ChatClient
from tests.fake_openai import Reply
from tests.test_add_a_node import SECOND_BLOCKS, apply, copy_of_checkout

pytestmark = pytest.mark.parametrize("mode", MODES, indirect=True)
ALICE, BOB = {"X-Forwarded-User": "alice"}, {"X-Forwarded-User": "bob"}


@pytest.fixture
def with_buttons(tmp_path: Path, fake, mode_args):
    """Apps (replicas of one deployment, in replicas mode) of a copy whose flow shows ReplyStats' button."""
    copy = copy_of_checkout(tmp_path / "copy")
    for path, how, code in SECOND_BLOCKS:
        apply(copy, path, how, code)
    flow = (copy / "flow.py").read_text()
    (copy / "flow.py").write_text(flow.replace("    BuildPrompt,", "    BuildPrompt,\n    ReplyStats,", 1))
    started: list[AppProcess] = []

    def start() -> AppProcess:
        flags = ["--base-url", f"http://127.0.0.1:{fake.port}/v1", "--auth", "header", *NO_LIMITS, *mode_args]
        started.append(AppProcess(tmp_path, flags, {"POCKETCHAT_API_KEY": API_KEY}, root=copy))
        return started[-1].start()

    yield start
    for app in started:
        app.kill()


def answered(client: ChatClient, fake) -> str:
    """A turn answered whole: the reply's id."""
    fake.queue(Reply(tokens=["Rome ", "is ", "old."]))
    return client.turn("Tell me about Rome")[-1]["message_id"]


def answer(client: ChatClient, seconds: float = 20) -> dict[str, Any]:
    """The next `pressed` or `error` frame (what a press gets)."""
    while (frame := client.recv(seconds))["type"] not in ("pressed", "error"):
        pass
    return frame


def frames_of(client: ChatClient, seconds: float = 3.0) -> list[dict[str, Any]]:
    """The `pressed` and `error` frames a client gets until none came for `seconds`."""
    frames = []
    while True:
        try:
            frames.append(answer(client, seconds))
        except TimeoutError:
            return frames


def press(client: ChatClient, message_id: str, step: str = "stats", button: str = "helped") -> dict[str, Any]:
    client.send("press", message_id=message_id, step=step, button=button)
    return answer(client)


def test_a_press_is_told_to_every_tab_once_and_kept(with_buttons, fake):
    app = with_buttons()
    tab = app.client(**ALICE)
    conversation_id = tab.hello()["conversation_id"]
    other = app.client(**ALICE)
    other.hello(conversation_id)
    reply = answered(tab, fake)
    told = press(tab, reply)
    assert told == {
        "type": "pressed",
        "conversation_id": conversation_id,
        "message_id": reply,
        "step": "stats",
        "button": "helped",
    }
    assert other.until("pressed")[-1] == told
    # Kept with the reply, in every page's history; a second press, replayed, changes nothing.
    assert app.client(**ALICE).hello(conversation_id)["history"][-1]["meta"]["presses"] == {"stats": "helped"}
    refused = press(other, reply)
    assert refused["code"] == "bad_frame" and "pressed already" in refused["message"]


@pytest.mark.parametrize(
    ("step", "button", "says"),
    [
        ("stats", "nope", "No such button"),  # stale: the page drew a button the step no longer has
        ("gone", "helped", "No such button"),
        ("stats", "../x", "'button'"),  # not a name a step gives
    ],
)
def test_an_unknown_or_stale_press_is_refused_and_changes_nothing(with_buttons, fake, step, button, says):
    app = with_buttons()
    client = app.client(**ALICE)
    conversation_id = client.hello()["conversation_id"]
    reply = answered(client, fake)
    refused = press(client, reply, step, button)
    assert refused["code"] == "bad_frame" and says in refused["message"]
    assert "presses" not in app.client(**ALICE).hello(conversation_id)["history"][-1]["meta"]


def test_another_users_reply_cannot_be_pressed(with_buttons, fake):
    app = with_buttons()
    alice = app.client(**ALICE)
    alices = alice.hello()["conversation_id"]
    reply = answered(alice, fake)
    bob = app.client(**BOB)
    bob.hello()
    refused = press(bob, reply)  # from his own conversation: her reply is not in it
    assert refused["code"] == "bad_frame" and "No such reply" in refused["message"]
    assert "presses" not in app.client(**ALICE).hello(alices)["history"][-1]["meta"]


def test_two_presses_at_once_on_two_replicas_keep_one(with_buttons, fake, mode):
    if mode != "replicas":
        pytest.skip("replicas only")
    a, b = with_buttons(), with_buttons()
    on_a = a.client(**ALICE)
    conversation_id = on_a.hello()["conversation_id"]
    reply = answered(on_a, fake)
    on_b = b.client(**ALICE)
    on_b.hello(conversation_id)
    on_a.send("press", message_id=reply, step="stats", button="helped")
    on_b.send("press", message_id=reply, step="stats", button="helped")
    # One was recorded, the other refused (by the database's compare-and-set, or by a copy that had heard of
    # the first): each page sees one `pressed`, and one of the two pressers an error.
    seen = [frames_of(client) for client in (on_a, on_b)]
    assert sorted(sorted(frame["type"] for frame in frames) for frames in seen) == [["error", "pressed"], ["pressed"]]
    assert a.client(**ALICE).hello(conversation_id)["history"][-1]["meta"]["presses"] == {"stats": "helped"}

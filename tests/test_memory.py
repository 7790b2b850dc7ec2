"""The memory flow (flow.py's `create_memory_flow`, memory_nodes.py, docs/memory.md): facts about the user kept
after a reply, recalled by meaning into a later prompt of another conversation, the owner's only; seen, edited,
forgotten and exported over HTTP; none read or kept while memory is off. In both storage modes."""

from typing import Any

import pytest

from tests.conftest import MODES, AppProcess, ChatClient, of_node
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_auth import Answer, call
from utils.memory import ASK, MOST_PROPOSED, facts_of

both = pytest.mark.parametrize("mode", MODES, indirect=True)
METRIC = "I always want metric units. I work on Zephyr, a weather app."
FACTS = Reply(tokens=["- Prefers metric units\n", "- Works on project Zephyr, a weather app"])
UNITS = "Which units should you use when you tell me distances?"


@pytest.fixture
def users_app(start_app: Any) -> AppProcess:
    return start_app("--auth", "header")  # users named by a trusted proxy: alice and bob


def as_user(user: str) -> dict[str, str]:
    return {"X-Forwarded-User": user}


def asks(app: AppProcess, method: str, path: str, body: dict[str, Any] | None = None, user: str = "alice") -> Answer:
    return call(app, method, path, body, **as_user(user))


def memory_chat(app: AppProcess, user: str = "alice") -> ChatClient:
    """A socket on a new conversation of `user`'s that runs the memory flow."""
    client = app.client(**as_user(user))
    conversation_id = client.hello()["conversation_id"]
    assert asks(app, "PATCH", f"/api/conversations/{conversation_id}", {"flow": "memory"}, user).status == 200
    return client


def reply_requests(fake: FakeOpenAI) -> list[dict[str, Any]]:
    """The requests of replies, not of the facts a message holds (RememberFacts's)."""
    return [r for r in fake.chat_requests if r["json"]["messages"][0]["content"] != ASK.format(most=MOST_PROPOSED)]


def steps_of(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [frame for frame in frames if frame["type"] == "step"]


def facts_of_user(app: AppProcess, user: str = "alice") -> list[str]:
    return [fact["text"] for fact in asks(app, "GET", "/api/memory", user=user).json()["facts"]]


def test_the_facts_of_a_models_answer_are_its_bulleted_short_lines():
    answer = 'Sure! Here:\n- **Prefers** metric units\n2. Works on "Zephyr"\n* prefers METRIC units\n- "Has a dog"'
    assert facts_of(answer) == ["Prefers metric units", 'Works on "Zephyr"', "Has a dog"]
    assert facts_of("- a b\n- c d\n- e f\n- g h") == ["a b", "c d", "e f"]
    # A small model that answers poorly adds nothing: no bullet, NONE, a question, a line longer than a fact.
    assert facts_of("tok1 tok2 tok3") == facts_of("- NONE") == facts_of("- Does the user like tea?") == []
    assert facts_of("- " + "word " * 80) == facts_of("- ...") == facts_of("- Miles\n- Kilometers") == []


@both
def test_facts_are_kept_after_a_reply_and_recalled_by_meaning_in_another_conversation(users_app, fake):
    fake.queue(Reply(tokens=["Noted."]), FACTS)
    frames = memory_chat(users_app).turn(METRIC)
    assert frames[-1]["status"] == "complete"
    kept = of_node(steps_of(frames), "RememberFacts", "remembered")
    assert [step["data"] for step in kept] == [f"Remembered: {fact}" for fact in facts_of("".join(FACTS.tokens))]
    assert all(step["display"] == "below" and step["buttons"] == [{"id": "forget", "label": "Forget"}] for step in kept)
    assert facts_of_user(users_app) == ["Prefers metric units", "Works on project Zephyr, a weather app"]

    fake.queue(Reply(tokens=["Kilometres."]), Reply(tokens=["- Prefers metric units"]))  # known: not kept again
    frames = memory_chat(users_app).turn(UNITS)
    system = reply_requests(fake)[-1]["json"]["messages"][0]["content"]
    assert "Prefers metric units" in system and "Zephyr" not in system  # by meaning: only the fact that bears on it
    (used,) = of_node(steps_of(frames), "RecallFacts", "recalled")
    assert "Prefers metric units" in used["data"] and "Zephyr" not in used["data"]
    assert not of_node(steps_of(frames), "RememberFacts") and len(facts_of_user(users_app)) == 2


@both
def test_facts_are_never_read_across_users(users_app, fake):
    fake.queue(Reply(tokens=["Noted."]), FACTS)
    memory_chat(users_app, "alice").turn(METRIC)
    (fact_id, _) = [fact["id"] for fact in asks(users_app, "GET", "/api/memory").json()["facts"]]
    fake.queue(Reply(tokens=["Kilometres."]), Reply(tokens=["NONE"]))
    frames = memory_chat(users_app, "bob").turn(UNITS)
    assert "metric" not in reply_requests(fake)[-1]["json"]["messages"][0]["content"]
    assert not of_node(steps_of(frames), "RecallFacts") and facts_of_user(users_app, "bob") == []
    # Bob gets for Alice's fact exactly what he gets for one that does not exist, and changes nothing.
    for method, body in [("PATCH", {"text": "bob was here"}), ("DELETE", None)]:
        theirs = asks(users_app, method, f"/api/memory/{fact_id}", body, "bob")
        missing = asks(users_app, method, "/api/memory/no-such-fact", body, "bob")
        assert theirs.status == missing.status == 404 and theirs.body == missing.body
    assert asks(users_app, "DELETE", "/api/memory", user="bob").json() == {"forgotten": 0}
    assert asks(users_app, "GET", "/api/memory/export", user="bob").json()["facts"] == []
    assert len(facts_of_user(users_app, "alice")) == 2


@both
def test_a_fact_is_edited_recalled_by_its_new_meaning_forgotten_and_exported(users_app, fake):
    fake.queue(Reply(tokens=["Noted."]), FACTS)
    memory_chat(users_app).turn(METRIC)
    metric, zephyr = asks(users_app, "GET", "/api/memory").json()["facts"]
    edited = asks(users_app, "PATCH", f"/api/memory/{metric['id']}", {"text": "  Has a dog\n named   Rex "})
    assert edited.status == 200 and edited.json()["text"] == "Has a dog named Rex"
    for bad in ({"text": "   "}, {"text": "x" * 301}, {"text": 7}, {}):
        assert asks(users_app, "PATCH", f"/api/memory/{metric['id']}", bad).status == 422
    fake.queue(Reply(tokens=["Rex will love it."]), Reply(tokens=["NONE"]))
    frames = memory_chat(users_app).turn("What should I name a new puppy so it gets along with my dog?")
    (used,) = of_node(steps_of(frames), "RecallFacts", "recalled")
    assert "Has a dog named Rex" in used["data"]  # embedded again: recalled by what it says now
    exported = asks(users_app, "GET", "/api/memory/export")
    assert "attachment" in exported.headers["Content-Disposition"]
    body = exported.json()
    assert body["format"] == "pocketchat.memory" and body["on"] is True
    assert [fact["text"] for fact in body["facts"]] == ["Has a dog named Rex", zephyr["text"]]
    assert asks(users_app, "DELETE", f"/api/memory/{zephyr['id']}").status == 204
    assert asks(users_app, "DELETE", f"/api/memory/{zephyr['id']}").status == 404
    assert facts_of_user(users_app) == ["Has a dog named Rex"]
    assert asks(users_app, "DELETE", "/api/memory").json() == {"forgotten": 1} and facts_of_user(users_app) == []


@both
def test_memory_turned_off_is_neither_read_nor_written(users_app, fake):
    fake.queue(Reply(tokens=["Noted."]), FACTS)
    memory_chat(users_app).turn(METRIC)
    assert asks(users_app, "PATCH", "/api/memory", {"on": False}).json() == {"on": False}
    asked = len(fake.chat_requests)
    fake.queue(Reply(tokens=["Kilometres."]))
    frames = memory_chat(users_app).turn(UNITS + " I also have a dog named Rex.")
    assert frames[-1]["status"] == "complete" and len(fake.chat_requests) == asked + 1  # the reply alone
    assert "metric" not in reply_requests(fake)[-1]["json"]["messages"][0]["content"]
    assert not of_node(steps_of(frames), "RecallFacts") and not of_node(steps_of(frames), "RememberFacts")
    listed = asks(users_app, "GET", "/api/memory").json()
    assert listed["on"] is False and len(listed["facts"]) == 2  # kept, to see, export, or turn on again
    asks(users_app, "PATCH", "/api/memory", {"on": True})
    fake.queue(Reply(tokens=["Kilometres."]), Reply(tokens=["NONE"]))
    memory_chat(users_app).turn(UNITS)
    assert "Prefers metric units" in reply_requests(fake)[-1]["json"]["messages"][0]["content"]


@both
def test_the_forget_button_deletes_the_fact_and_a_failed_proposal_leaves_the_reply_whole(users_app, fake):
    fake.queue(Reply(tokens=["Noted."]), FACTS)
    client = memory_chat(users_app)
    frames = client.turn(METRIC)
    step = of_node(steps_of(frames), "RememberFacts", "remembered")[0]
    end = frames[-1]
    client.send("press", message_id=end["message_id"], step=step["id"], button="forget")
    assert client.until("pressed")[-1]["step"] == step["id"]
    # Told once the node's on_press is done: the fact is gone by then.
    assert facts_of_user(users_app) == ["Works on project Zephyr, a weather app"]
    fake.queue(Reply(tokens=["Fine."]), Reply(status=500))  # the facts' request fails: the reply does not
    frames = client.turn("I moved to Lisbon last year.")
    assert frames[-1]["status"] == "complete" and not [s for s in steps_of(frames) if s["kind"] == "failed"]


@pytest.mark.model
@pytest.mark.timeout(540)
def test_with_the_embedded_model_the_memory_flow_completes_whatever_it_remembers(start_app):
    # A model of 135M parameters may propose nothing, or odd facts: the replies complete, and nothing fails.
    app = start_app("--provider", "local", "--max-tokens", "40", "--temperature", "0")
    client = app.client()
    conversation_id = client.hello()["conversation_id"]
    assert asks(app, "PATCH", f"/api/conversations/{conversation_id}", {"flow": "memory"}).status == 200
    for message in (METRIC, UNITS):
        frames = client.turn(message, timeout=240)  # the model loads first: seconds on a busy machine
        assert frames[-1]["status"] == "complete"
        assert not [step for step in steps_of(frames) if step["kind"] in ("failed", "status")]
    facts = facts_of_user(app)
    assert len(facts) <= 2 * MOST_PROPOSED and all(0 < len(fact) <= 300 for fact in facts)

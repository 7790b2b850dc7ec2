"""The research flow (flow.py's `create_research_flow`, research_nodes.py): picked per conversation, it plans,
looks each question up, and answers from what it found, citing it; a stop ends it at any step."""

import json
import urllib.request
from typing import Any

import pytest

from tests.conftest import MODES, AppProcess, of_node
from tests.fake_openai import Reply
from utils.research import questions_of

both = pytest.mark.parametrize("mode", MODES, indirect=True)
PLAN = Reply(tokens=["1. Where is Zanzibar?\n", "2. What grows there?\n", "3. Who lives there?"])


def patch(app: AppProcess, conversation_id: str, **changes: Any) -> tuple[int, Any]:
    request = urllib.request.Request(
        app.url + f"/api/conversations/{conversation_id}",
        data=json.dumps(changes).encode(),
        method="PATCH",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, json.loads(refused.read())


def steps_of(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [frame for frame in frames if frame["type"] == "step"]


def test_a_plan_of_a_models_lines_is_a_few_questions():
    # A model's "Sure!" first is no question when others ask; bullets, numbers and bold go.
    assert questions_of("Sure!\n1. **Where** is it?\n- What grows there?\n\n#") == ["Where is it?", "What grows there?"]
    assert questions_of("Look up the climate\nand the crops") == ["Look up the climate", "and the crops"]
    assert questions_of("1. a\n2. b\n3. c\n4. d\n5. e") == ["a", "b", "c", "d"]
    assert questions_of("...\n--\n") == []


@both
def test_a_conversation_picks_research_and_its_answer_cites_what_the_plan_found(app, fake):
    assert app.get("/api/flows")["flows"][1]["name"] == "research"
    earlier = app.client()
    earlier.hello()
    earlier.turn("My zanzibar notes: cloves grow there.")
    client = app.client()
    conversation_id = client.hello()["conversation_id"]
    assert patch(app, conversation_id, flow="research")[0] == 200
    fake.queue(PLAN, Reply(tokens=["Cloves [1]."]))
    frames = client.turn("Tell me about zanzibar")
    assert frames[-1]["status"] == "complete"
    (plan,) = of_node(steps_of(frames), "PlanResearch", "plan")
    assert plan["shape"] == "markdown" and "2. What grows there?" in plan["data"]
    progress = of_node(steps_of(frames), "ResearchStep", "progress")
    assert [step["data"]["value"] for step in progress] == [1 / 3, 2 / 3, 1.0]  # one bar, moving
    kept = client.hello(conversation_id)["history"][-1]["meta"]["steps"]
    assert [step["data"]["value"] for step in of_node(kept, "ResearchStep", "progress")] == [1.0]
    (sources,) = of_node(kept, "ResearchStep", "sources")
    assert sources["data"][0]["text"].startswith("My zanzibar notes")
    answer = fake.chat_requests[-1]["json"]["messages"][0]["content"]
    assert "[1]" in answer and "My zanzibar notes" in answer  # numbered, for the answer to cite


@both
def test_a_stop_during_the_research_ends_the_turn_there(app, fake):
    client = app.client()
    conversation_id = client.hello()["conversation_id"]
    patch(app, conversation_id, flow="research")
    fake.queue(PLAN)
    client.send("message", content="Tell me about zanzibar")
    start = client.until("turn_start")[-1]
    client.send("stop", turn_id=start["turn_id"])
    end = client.until("turn_end")[-1]
    assert end["status"] == "stopped"
    assert len(fake.chat_requests) <= 1  # the plan at most: no answer was asked for


@both
def test_the_flow_is_kept_with_the_conversation_and_refused_when_not_offered(app, fake):
    client = app.client()
    conversation_id = client.hello()["conversation_id"]
    status, refused = patch(app, conversation_id, flow="nope")
    assert status == 422 and "research" in refused["detail"]
    assert patch(app, conversation_id, flow="research")[1]["flow"] == "research"
    assert client.until("conversation")[-1]["flow"] == "research"  # every tab is told
    fake.queue(PLAN, Reply(tokens=["Done."]))
    client.turn("Tell me about zanzibar")
    exported = app.get(f"/api/conversations/{conversation_id}/export.json")
    assert exported["conversation"]["flow"] == "research"
    assert app.client().hello(conversation_id)["flow"] == "research"

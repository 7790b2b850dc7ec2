"""What a model, a provider or a client can make the tool loop do is bounded (issues 30 and 31): the calls
of one step and of one reply, the steps a reply keeps, the ids of a step's calls, the names a client
declares. Against the app under uvicorn, the fake provider and real WebSocket clients."""

import json

from tests.conftest import AppProcess, reply_text
from tests.fake_openai import Call, FakeOpenAI, Reply
from tests.test_tools import LOOKUP, declaring_client, steps, tool_messages


def test_a_provider_that_repeats_a_call_id_in_one_step_gets_each_answer_under_its_own_call(app, fake):
    words = ["pocket", "bag"]
    fake.queue(
        Reply(calls=[Call("client__lookup", {"word": word}, id="call_1") for word in words]),
        Reply(tokens=["Both."]),
    )
    client, _ = declaring_client(app)
    client.send("message", content="look both up")
    calls = [client.until("tool_call")[-1] for _ in words]
    assert len({call["call_id"] for call in calls}) == 2
    for call in calls:  # each answered with its own word: the model must read each under its own call
        client.send("tool_result", call_id=call["call_id"], result=f"meaning of {call['arguments']['word']}")
    frames = client.until("turn_end")
    assert frames[-1]["status"] == "complete" and reply_text(frames) == "Both."
    asked = fake.chat_requests[1]["json"]["messages"][-3]["tool_calls"]
    word_of = {call["id"]: json.loads(call["function"]["arguments"])["word"] for call in asked}
    assert sorted(word_of.values()) == sorted(words)
    answers = {message["tool_call_id"]: message["content"] for message in tool_messages(fake.chat_requests[1])}
    assert answers == {call_id: f"meaning of {word}" for call_id, word in word_of.items()}
    results = steps(frames, "tool_result")
    assert sorted(step["data"]["id"] for step in results) == sorted(word_of)


def test_a_client_declaring_a_tool_name_twice_is_refused_and_keeps_what_it_had(app: AppProcess, fake: FakeOpenAI):
    client, conversation = declaring_client(app)
    other = {**LOOKUP, "description": "Another lookup."}
    client.send("hello", conversation_id=conversation, tools=[LOOKUP, {"name": "define"}, other])
    refused = client.until("error")[-1]
    assert refused["code"] == "bad_frame"
    assert refused["message"] == "'tools': the name 'lookup' is declared twice; each tool needs a name of its own."
    client.turn("hello")
    offered = [tool["function"]["name"] for tool in fake.chat_requests[-1]["json"]["tools"]]
    assert offered.count("client__lookup") == 1 and "client__define" not in offered


def test_ids_a_provider_numbers_afresh_in_each_step_stay_unique_in_the_turn(app, fake):
    fake.queue(
        Reply(calls=[Call("calculator", {"expression": "1+1"}, id="call_0")]),
        Reply(calls=[Call("calculator", {"expression": "2+2"}, id="call_0")]),
        Reply(tokens=["2 and 4."]),
    )
    client = app.client()
    client.hello()
    frames = client.turn("two sums, one after the other")
    ids = [step["data"]["id"] for step in steps(frames, "tool_call")]
    assert len(set(ids)) == 2
    results = {step["data"]["id"]: step["data"]["result"] for step in steps(frames, "tool_result")}
    assert [results[call_id] for call_id in ids] == ["2", "4"]
    last = fake.chat_requests[-1]["json"]["messages"]
    asked = [call["id"] for message in last if message["role"] == "assistant" for call in message["tool_calls"]]
    assert asked == ids == [message["tool_call_id"] for message in last if message["role"] == "tool"]


def test_a_model_asking_for_16000_calls_at_once_runs_32_reads_one_error_and_the_reply_keeps_little(app, fake):
    fake.queue(Reply(calls=[Call("current_time") for _ in range(16_000)]), Reply(tokens=["It is late."]))
    client = app.client()
    conversation = client.hello()["conversation_id"]
    frames = client.turn("the time, 16,000 times", timeout=60)
    assert frames[-1]["status"] == "complete" and reply_text(frames) == "It is late."
    assert len(steps(frames, "tool_call")) == 32 == len(steps(frames, "tool_result"))
    error = (
        "Not run: one step runs 32 tool calls at most, and this one asked for over 128. "
        "This call and all those after it were left out."
    )
    # The stream was read no further than 129 calls (the 16,000 would hold the event loop, issue 30 row 13).
    assert [step["data"] for step in steps(frames, "tool_calls_left_out")] == [
        {"asked": 129, "ran": 32, "error": error}
    ]
    # The model reads back the 32 calls that ran and the first left out, each answered.
    (asked,) = [m for m in fake.chat_requests[1]["json"]["messages"] if m["role"] == "assistant"]
    answers = tool_messages(fake.chat_requests[1])
    assert len(asked["tool_calls"]) == 33 == len(answers)
    assert answers[-1] == {"role": "tool", "tool_call_id": asked["tool_calls"][-1]["id"], "content": f"Error: {error}"}
    kept = app.client().hello(conversation)["history"][-1]["meta"]["steps"]
    assert len(kept) == 65 and len(json.dumps(kept)) < 30_000


def test_a_reply_makes_128_calls_at_most_then_the_model_answers_without_tools(start_app, fake):
    app = start_app("--max-tool-steps", "20", "--limit-tool-calls-per-minute", "0")
    fake.default = Reply(tokens=["Done."], calls=[Call("current_time") for _ in range(30)])
    try:
        client = app.client()
        client.hello()
        frames = client.turn("the time, again and again", timeout=60)
    finally:
        fake.default = Reply()
    assert frames[-1]["status"] == "complete"
    assert len(steps(frames, "tool_call")) == 128
    (left_out,) = steps(frames, "tool_calls_left_out")
    assert left_out["data"]["ran"] == 8 and "one reply makes 128 tool calls at most" in left_out["data"]["error"]
    assert [r["json"]["tool_choice"] for r in fake.chat_requests] == ["auto"] * 5 + ["none"]


def long_lookup(app: AppProcess, fake: FakeOpenAI, error: str) -> list[dict]:
    """A turn whose model calls the client's lookup with 50,000 characters, answered with `error`."""
    fake.queue(Reply(calls=[Call("client__lookup", {"word": "w" * 50_000}, piece=5000)]), Reply(tokens=["ok"]))
    client, _ = declaring_client(app)
    client.send("message", content="look a long word up")
    frames = client.until("tool_call")
    assert frames[-1]["arguments"] == {"word": "w" * 50_000}  # the client's own call: whole
    client.send("tool_result", call_id=frames[-1]["call_id"], error=error)
    return frames + client.until("turn_end")


def test_long_arguments_and_errors_are_cut_in_the_steps(app, fake):
    frames = long_lookup(app, fake, "e" * 4000)
    (shown,) = steps(frames, "tool_call")
    assert shown["data"]["arguments"].startswith('{"word": "www') and len(shown["data"]["arguments"]) < 2100
    (result,) = steps(frames, "tool_result")
    assert result["data"]["error"].startswith("eee") and len(result["data"]["error"]) < 2100
    assert tool_messages(fake.chat_requests[1])[0]["content"] == "Error: " + "e" * 4000  # the model reads it all


def test_a_long_error_is_cut_for_the_model_as_a_result_is(start_app, fake):
    long_lookup(start_app("--tool-result-chars", "1000"), fake, "e" * 4000)
    (read,) = tool_messages(fake.chat_requests[1])
    assert read["content"].startswith("Error: eee") and len(read["content"]) < 1100

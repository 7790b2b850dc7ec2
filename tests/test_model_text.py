"""What a model, a provider or a tool writes is cleaned in one place (utils/clean.py), and nothing stored can
make a conversation unreadable (issue 31, item 3): lone surrogates, NULs, megabyte names and deep JSON fed
through every field a model or a tool fills, and bad values written straight into the database, read
back over the socket, the API, both exports and a share link, in both storage modes."""

import asyncio
import json
import sqlite3
import sys
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.conftest import MODES, ROOT, AppProcess, ChatClient, stream_of
from tests.fake_openai import Call, FakeOpenAI, Reply
from tests.test_protocol import wait_for
from utils.clean import NAME_CHARACTERS

pytestmark = pytest.mark.parametrize("mode", MODES, indirect=True)

LONE = "\ud800"  # half of a character: no UTF-8 socket, page or database takes it
GARBLED_SERVER = str(ROOT / "tests" / "garbled_mcp_server.py")
# What a client declares: a schema holding the escape of a lone surrogate and of a NUL (the frame's checks
# read only the tool's name and description).
DECLARING_HELLO = (
    '{"type":"hello","tools":[{"name":"lookup","description":"Look a word up.",'
    '"parameters":{"type":"object","properties":{"q":{"type":"string","description":"\\ud800\\u0000"}}}}]}'
)


def texts(value: Any) -> list[str]:
    """Every text inside a JSON value, keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value.keys(), *(text for item in value.values() for text in texts(item))]
    return [text for item in value for text in texts(item)] if isinstance(value, list) else []


def assert_safe(value: Any) -> None:
    """`value` can be sent and stored: its texts valid Unicode (UTF-8 encodes them), without NUL."""
    for text in texts(value):
        text.encode()  # raises on a lone surrogate
        assert "\x00" not in text


def fetch(app: AppProcess, path: str, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(app.url + path, method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read().decode()


def read_back(app: AppProcess, conversation: str) -> dict[str, Any]:
    """The conversation through every surface that shows it; each answered, and safe."""
    ready = app.client().hello(conversation)
    assert ready["conversation_id"] == conversation
    surfaces: dict[str, Any] = {"ready": ready}
    for name in ("", "/export.json", "/export.md"):
        status, text = fetch(app, f"/api/conversations/{conversation}{name}")
        assert status == 200, name
        surfaces[name.lstrip("/") or "GET"] = text if name.endswith(".md") else json.loads(text)
    status, text = fetch(app, f"/api/conversations/{conversation}/shares", "POST")
    assert status == 201
    token = json.loads(text)["url"].removeprefix("/s/")
    surfaces["shared"] = json.loads(fetch(app, f"/api/shared/{token}")[1])
    for value in surfaces.values():
        assert_safe(value)
    return surfaces


def tool_steps(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [f["data"] for f in frames if f["type"] == "step" and f["kind"] == kind]


def test_what_a_model_and_its_tools_write_leaves_the_conversation_readable(mode, start_app, fake, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"garbled": {"command": sys.executable, "args": [GARBLED_SERVER]}}}))
    app = start_app("--mcp-config", str(config))
    wait_for(lambda: any(s["name"] == "garbled" and s["tools"] for s in app.get("/api/tools")["sources"]), 20)
    fake.queue(
        Reply(
            reasoning=[f"think {LONE}", "\x00 on"],
            tokens=[f"Hello {LONE}", "\x00 world. "],
            calls=[
                Call("calculator", '{"expression":"\\ud800"}'),  # issue 31's: the escape of a lone surrogate
                Call("calculator", f'{{"expression":"1+1\x00{LONE}"}}'),
                Call("n" * 1_000_000 + LONE),  # a megabyte name
                Call("calculator", '{"deep":' + "[" * 500 + "]" * 500 + "}", piece=100_000),
                Call("calculator", "[" * 40_000 + "]" * 40_000, piece=100_000),  # past the parser's stack
                Call("calculator", '{"expression":"' + "1" * 150_000 + '"}', piece=100_000),
                Call("client__lookup", {"q": LONE}),
                Call("garbled__echo", {"x": "hi"}),
            ],
            usage_values={"prompt_tokens": LONE, "completion_tokens": 1e300, "total_tokens": -1},
        ),
        Reply(tokens=[f"Done {LONE}."], usage_values={"prompt_tokens": float("nan"), "completion_tokens": 10**30}),
    )
    client = app.client()
    client.send_raw(DECLARING_HELLO)
    conversation = client.until("ready")[-1]["conversation_id"]
    client.send("message", content="Use every tool.")
    call = client.until("tool_call")[-1]
    assert_safe(call)
    assert call["arguments"] == {"q": "\ufffd"}
    result = '{"text":"\\ud800\\u0000","deep":' + "[" * 60 + "]" * 60 + "}"
    client.send_raw(f'{{"type":"tool_result","call_id":"{call["call_id"]}","result":{result}}}')
    frames = client.until("turn_end", 60)
    for frame in client.frames:
        assert_safe(frame)
    _, _, text, reasoning = stream_of(client.frames)
    assert (text, reasoning) == ("Hello \ufffd world. Done \ufffd.", "think \ufffd on")
    assert frames[-1]["status"] == "complete"
    assert frames[-1]["usage"]["source"] == "estimated"  # neither usage was a count of tokens
    calls = tool_steps(client.frames, "tool_call")
    assert calls[0]["arguments"] == {"expression": "\ufffd"}
    assert calls[1]["arguments"] == {"expression": "1+1\ufffd"}
    assert len(calls[2]["name"]) <= NAME_CHARACTERS + 1
    assert "levels: left out" in json.dumps(calls[3]["arguments"])
    results = {step["id"]: step for step in tool_steps(client.frames, "tool_result")}
    results = [results[step["id"]] for step in calls]  # in the order asked (they end in any order)
    assert results[4]["error"] == "The arguments are not a JSON object."
    assert results[5]["error"] == "The arguments are over 100,000 characters."
    assert "\ufffd" in results[6]["result"]
    assert results[7]["result"].startswith("result \U0001f600 rrr")
    # The provider was offered the tools safe, and small: the MCP server's description cut.
    offered = fake.chat_requests[0]["json"]["tools"]
    assert_safe(offered)
    assert max(len(json.dumps(tool)) for tool in offered) < 10_000
    # The MCP result went back to the model cut to --tool-result-chars, without its NUL.
    assert_safe(fake.chat_requests[1]["json"]["messages"])

    surfaces = read_back(app, conversation)
    kinds = [step["kind"] for step in surfaces["ready"]["history"][-1]["meta"]["steps"]]
    assert kinds.count("tool_call") == kinds.count("tool_result") == 8
    app.stop()  # and across a restart: read from the database alone
    app.start()
    again = read_back(app, conversation)
    assert again["ready"]["history"] == surfaces["ready"]["history"]
    assert again["shared"]["messages"][-1]["content"] == "Hello \ufffd world. Done \ufffd."


def test_a_providers_error_message_of_any_text_is_shown_kept_and_read_back(mode, app: AppProcess, fake: FakeOpenAI):
    long = f"{LONE}\x00" + "e" * 1_000_000
    fake.queue(
        Reply(raw=[json.dumps({"error": {"message": long}})]),  # a stream's error event
        Reply(status=400, message=long),  # an HTTP error's body
    )
    client = app.client()
    conversation = client.hello()["conversation_id"]
    shown = []
    for _ in range(2):
        frames = client.turn("fail, please")
        (error,) = [frame for frame in frames if frame["type"] == "error"]
        assert_safe(error)
        assert "\ufffd" in error["message"] and len(error["message"]) < 3_000
        assert frames[-1]["status"] == "error"
        shown.append(error["message"])
    kept = [message.get("error") for message in read_back(app, conversation)["ready"]["history"][1::2]]
    assert kept == shown


# Meta a reply may hold in a database written by an older version (or by a path that missed cleaning):
# each makes that version's reads fail (a 1011 on every socket, a 500 from GET and export.json).
BAD_META = [
    '{"steps":[{"node":"RunTools","kind":"tool_call","data":{"arguments":{"expression":"\\ud800"}}}]}',
    '{"model":"fake\\u0000","usage":{"prompt_tokens":NaN,"completion_tokens":123456789012345678901234567890}}',
    "[" * 100_000 + "]" * 100_000,  # nested past the parser's stack
    '{"deep":' + "[" * 500 + "]" * 500 + "}",
    "not JSON",
    "[1, 2]",
    '{"steps":"x"}',
    '{"steps":[1,{"kind":"sources","data":"x"},{"kind":"sources","data":[1,{"source":"\\udfff"}]}]}',
]
BAD_CONVERSATION = {"tools_off": '["\\ud800", 1]', "sampling": '{"temperature":"hot","top_p":NaN}'}
BAD_SNAPSHOT = '{"title":"\\ud800","messages":[{"role":"user","content":"\\u0000\\udfff","status":"complete"}]}'


def write_bad_values(request: pytest.FixtureRequest, mode: str, db_path: Path, conversation: str) -> None:
    """BAD_META into the conversation's messages (in order), BAD_CONVERSATION and BAD_SNAPSHOT, in its
    database, as a row written by something else than this version's code."""
    sets = ", ".join(f"{name} = '{value}'" for name, value in BAD_CONVERSATION.items())
    if mode == "single":
        with sqlite3.connect(db_path) as db:
            ids = [
                row[0]
                for row in db.execute("SELECT id FROM messages WHERE conversation_id = ? ORDER BY seq", (conversation,))
            ]
            db.executemany("UPDATE messages SET meta = ? WHERE id = ?", zip(BAD_META, ids, strict=True))
            db.execute(f"UPDATE conversations SET {sets} WHERE id = ?", (conversation,))
            db.execute("UPDATE shares SET snapshot = ?", (BAD_SNAPSHOT,))
        return

    async def write() -> None:
        db = await asyncpg.connect(request.getfixturevalue("fresh_postgres_url"))
        try:
            query = "SELECT id FROM messages WHERE conversation_id = $1 ORDER BY seq"
            ids = [row["id"] for row in await db.fetch(query, conversation)]
            await db.executemany("UPDATE messages SET meta = $1 WHERE id = $2", list(zip(BAD_META, ids, strict=True)))
            await db.execute(f"UPDATE conversations SET {sets} WHERE id = $1", conversation)
            await db.execute("UPDATE shares SET snapshot = $1", BAD_SNAPSHOT)
        finally:
            await db.close()

    asyncio.run(write())


def test_a_bad_value_stored_by_anything_else_never_makes_a_conversation_unreadable(
    request, mode, app: AppProcess, fake: FakeOpenAI
):
    client: ChatClient = app.client()
    conversation = client.hello()["conversation_id"]
    for number in range(len(BAD_META) // 2):
        assert client.turn(f"message {number}")[-1]["status"] == "complete"
    token = json.loads(fetch(app, f"/api/conversations/{conversation}/shares", "POST")[1])["url"].removeprefix("/s/")
    app.stop()
    write_bad_values(request, mode, app.db_path, conversation)
    app.start()
    surfaces = read_back(app, conversation)
    history = surfaces["ready"]["history"]
    assert [message["content"] for message in history[::2]] == [f"message {n}" for n in range(len(BAD_META) // 2)]
    assert history[0]["meta"]["steps"][0]["data"]["arguments"] == {"expression": "\ufffd"}
    assert (surfaces["ready"]["tools_off"], surfaces["ready"]["sampling"]) == (["\ufffd"], {})
    assert len(surfaces["export.json"]["messages"]) == len(BAD_META)
    shared = json.loads(fetch(app, f"/api/shared/{token}")[1])
    assert_safe(shared)
    assert shared["messages"][0]["content"] == "\ufffd"
    # Still a conversation that works: it takes the next turn, and is stored again.
    client = app.client()
    client.hello(conversation)
    assert client.turn("and on")[-1]["status"] == "complete"

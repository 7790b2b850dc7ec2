"""The operator's MCP servers cannot make every user's chat slow (issue 30 rows 11 and 12): a server that
writes a line without end, lines that are not JSON-RPC, a huge result, a long stderr line, or thousands
of tools. A real server (tests/mcp_server.py, misbehaving on request) under the app under uvicorn, the
fake provider, real WebSocket clients."""

import statistics
import time

from tests.conftest import AppProcess
from tests.fake_openai import Call, FakeOpenAI, Reply
from tests.test_protocol import wait_for
from tests.test_tools import mcp_config, offered, source, steps


def chat_turns(app: AppProcess, count: int, pause: float = 0.0) -> list[float]:
    """The seconds each of `count` short turns of a new conversation took, `pause` seconds apart."""
    client = app.client()
    client.hello()
    took = []
    for n in range(count):
        time.sleep(pause if n else 0)
        started = time.monotonic()
        assert client.turn(f"hello {n}")[-1]["status"] == "complete"
        took.append(time.monotonic() - started)
    return took


def lines_naming(app: AppProcess, server: str) -> list[str]:
    return [line for line in app.logs().splitlines() if f"MCP server {server}" in line]


def test_a_server_writing_100_mb_without_a_newline_is_started_again_saying_why_and_chats_go_on(start_app, tmp_path):
    app = start_app("--mcp-config", mcp_config(tmp_path, {"flood": ["--flood", "100000000"]}))
    took = chat_turns(app, 8, pause=0.6)  # while it floods, is stopped, started again and floods again
    assert statistics.median(took) < 0.5 and max(took) < 3, f"turns took {took}"  # with the SDK's reader: 1-2 s
    why = "it wrote a line over 4 MB, the most one message may take"
    wait_for(lambda: len(lines_naming(app, "flood")) >= 2, 20)
    assert all(f"MCP server flood failed: {why}; starting it again in" in line for line in lines_naming(app, "flood"))
    assert source(app, "flood")["error"] == why
    assert "Traceback" not in app.logs()


def test_a_30_mb_result_fails_the_call_saying_why_and_the_server_is_started_again(start_app, fake, tmp_path):
    app = start_app("--mcp-config", mcp_config(tmp_path, {"test": []}))
    fake.queue(Reply(calls=[Call("test__shout", {"text": "abc", "times": 10_000_000})]), Reply(tokens=["Too big."]))
    client = app.client()
    client.hello()
    started = time.monotonic()
    frames = client.turn("shout a lot")
    assert time.monotonic() - started < 10
    (result,) = steps(frames, "tool_result")
    why = "it wrote a line over 4 MB, the most one message may take"
    assert result["data"]["error"] == f"The MCP server test failed: {why}"
    assert frames[-1]["status"] == "complete"
    wait_for(lambda: f"MCP server test failed: {why}; starting it again in 1 s" in app.logs(), 10)
    wait_for(lambda: source(app, "test")["status"] == "ok", 15)
    fake.queue(Reply(calls=[Call("test__add", {"a": 2, "b": 3})]), Reply(tokens=["5"]))
    assert steps(client.turn("add"), "tool_result")[0]["data"]["result"] == "5"
    assert "Traceback" not in app.logs()


def test_lines_that_are_not_json_rpc_are_ignored_and_counted_not_logged_each(start_app, fake, tmp_path):
    app = start_app("--mcp-config", mcp_config(tmp_path, {"chatty": ["--junk", "5000"]}))
    wait_for(lambda: source(app, "chatty")["status"] == "ok", 20)
    fake.queue(Reply(calls=[Call("chatty__add", {"a": 1, "b": 2})]), Reply(tokens=["3"]))
    client = app.client()
    client.hello()
    assert steps(client.turn("add"), "tool_result")[0]["data"]["result"] == "3"
    said = [line for line in lines_naming(app, "chatty") if "not JSON-RPC" in line]
    assert said == [said[0]] and "wrote a line that is not JSON-RPC, ignored: 'not JSON-RPC, line 0'" in said[0]
    assert "Traceback" not in app.logs() and len(app.logs()) < 50_000


def test_a_long_stderr_line_is_not_logged_and_the_server_keeps_working(start_app, fake, tmp_path):
    app = start_app("--mcp-config", mcp_config(tmp_path, {"loud": ["--stderr-flood", "1000000"]}))
    wait_for(lambda: "MCP server loud says: after the flood" in app.logs(), 20)
    assert source(app, "loud")["status"] == "ok"
    assert lines_naming(app, "loud")[0].endswith("MCP server loud says a line over 64 KiB (not logged)")
    assert "Traceback" not in app.logs() and "xxxx" not in app.logs()


def test_a_server_listing_10000_tools_offers_the_first_and_says_so(start_app, fake: FakeOpenAI, tmp_path):
    app = start_app("--mcp-config", mcp_config(tmp_path, {"many": ["--many-tools", "10000"]}))
    wait_for(lambda: source(app, "many")["status"] == "ok", 20)
    listed = app.get("/api/tools")
    assert listed["max_tools"] == 128
    many = source(app, "many")
    assert many["listed"] == 10_007 and len(many["tools"]) == 128 and many["tools"][0]["name"] == "many.add"
    chat_turns(app, 2)
    for request in fake.chat_requests:  # the built-in tools, then the server's first 124
        names = offered(request)
        assert len(names) == 128 and names[:5] == [
            "calculator",
            "current_time",
            "search_conversations",
            "read_document",
            "many__add",
        ]
    logs = app.logs()
    assert logs.count("MCP server many offers 10,007 tools; the first 128 are used (--max-tools)") == 1
    assert logs.count("MCP server many: 2 tools are not offered (their names are too long or taken)") == 1
    assert logs.count("a turn has 132 tools; the first 128 are offered, the last 4 left out (--max-tools)") == 1

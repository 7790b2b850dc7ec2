"""The rows of issue 30 for bench/hostile.py: for each, what the hostile user ("mallory") does with its input
(tests/hostile_files.py), and the small request of the same kind a second user ("bob") keeps making
meanwhile (his probe: a 20-byte .txt, an 8x8 PNG, a 267-byte import, his conversation list), since a
pool of readers held by mallory stalls those, not his chat.

Mallory's `act` returns what she got (`Got`); what she has seen so far is kept in `Context.seen`, so a row
cut off by its timeout still says how far she came.
"""

import asyncio
import contextlib
import io
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import websockets
from PIL import Image

from tests import hostile_files as files
from tests.fake_openai import Reply

HOSTILE_MARK = "hostile row"  # in mallory's message: the fake answers it with the row's script
USER_HEADER = "X-Forwarded-User"
POLL_SECONDS = 0.2


@dataclass
class Context:
    """One run against one app: where it is, the HTTP session, the sizes (quick or full) and what mallory saw."""

    url: str
    ws_url: str
    session: aiohttp.ClientSession
    quick: bool
    seen: list[str] = field(default_factory=list)
    sockets: list[Any] = field(default_factory=list)
    draining: list[asyncio.Task[None]] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def note(self, what: str) -> None:
        self.seen.append(f"{what} at {time.perf_counter() - self.started:.1f} s")

    async def open(self, user: str, drain: bool = True) -> tuple[Any, str]:
        """A socket of `user` on a new conversation, and the conversation's id. `drain`: its frames are read
        and dropped in the background (the app closes a socket that lets 256 frames queue up)."""
        # No pings: the client would close a socket to a stalled app, which must be measured to the end.
        headers = {USER_HEADER: user}
        ws = await websockets.connect(self.ws_url, max_size=None, ping_interval=None, additional_headers=headers)
        await ws.send('{"type":"hello"}')
        while (frame := json.loads(await ws.recv()))["type"] != "ready":
            pass
        self.sockets.append(ws)
        if drain:
            self.draining.append(asyncio.create_task(_drain(ws)))
        return ws, frame["conversation_id"]

    async def call(self, user: str, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        """An HTTP request as `user`: its status and its JSON body (or text)."""
        headers = {USER_HEADER: user}
        async with self.session.request(method, self.url + path, headers=headers, **kwargs) as response:
            body = await response.read()
        try:
            return response.status, json.loads(body) if body else None
        except ValueError:
            return response.status, body[:300].decode(errors="replace")

    async def upload(self, user: str, path: str, name: str, data: bytes) -> tuple[int, Any]:
        form = aiohttp.FormData()
        form.add_field("file", data, filename=name, content_type="application/octet-stream")
        return await self.call(user, "POST", path, data=form)

    async def close(self) -> None:
        for task in self.draining:
            task.cancel()
        await asyncio.gather(*self.draining, *(ws.close() for ws in self.sockets), return_exceptions=True)


async def _drain(ws: Any) -> None:
    with contextlib.suppress(websockets.ConnectionClosed):
        async for _ in ws:
            pass


@dataclass
class Got:
    """What mallory got: the answer (status, error text), and how long it took."""

    answer: str
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def said(status: int, body: Any) -> str:
    """An HTTP answer in a few words: its status and its error text, if any."""
    detail = body.get("detail") if isinstance(body, dict) else body
    return f"{status}" + (f": {str(detail)[:160]}" if detail else "")


# ---- mallory -------------------------------------------------------------------------------------


async def turn(ctx: Context, row: int) -> Got:
    """Rows 1 and 13: one message whose reply (the fake's script) is the hostile tool call(s)."""
    ws, conversation = await ctx.open("mallory", drain=False)
    start = time.perf_counter()
    await ws.send(json.dumps({"type": "message", "content": f"{HOSTILE_MARK} {row}"}))
    calls = results = failed = 0
    last_error = ""
    while (frame := json.loads(await ws.recv()))["type"] != "turn_end":
        if frame["type"] == "step" and frame["kind"] == "tool_call":
            calls += 1
            if calls == 1:
                ctx.note("first tool call shown")
        elif frame["type"] == "step" and frame["kind"] == "tool_result":
            results += 1
            if "error" in frame["data"]:  # refused (the per-minute limit), failed or timed out
                failed += 1
                last_error = str(frame["data"]["error"])[:120]
            if results == 1:
                ctx.note(f"first tool result: {frame['data'].get('result') or last_error!r:.80}")
        elif frame["type"] == "error" and "turn_id" not in frame:
            return Got(f"refused: {frame['code']}", time.perf_counter() - start)
    took = time.perf_counter() - start
    _, stored = await ctx.call("mallory", "GET", f"/api/conversations/{conversation}")
    reply = (stored or {}).get("messages", [{}])[-1]
    steps_bytes = len(json.dumps(reply.get("meta", {}).get("steps", [])))
    answer = f"turn_end {frame['status']}, {results} results ({failed} errors" + (
        f", the last: {last_error!r})" if last_error else ")"
    )
    return Got(answer, took, {"tool_calls": calls, "stored_steps_mb": round(steps_bytes / 1e6, 2)})


async def document(
    ctx: Context, user: str, name: str, data: bytes, conversation: str | None = None, follow: bool = True
) -> Got:
    """An upload to a conversation's documents, then (`follow`) its indexing followed to its end."""
    if conversation is None:
        _, conversation = await ctx.open(user)
    start = time.perf_counter()
    status, body = await ctx.upload(user, f"/api/conversations/{conversation}/documents", name, data)
    ctx.note(f"{user}'s upload answered {status}")
    if status != 201 or not follow:
        return Got(said(status, body), time.perf_counter() - start)
    while True:
        _, listed = await ctx.call(user, "GET", f"/api/conversations/{conversation}/documents")
        state = next((d for d in listed["documents"] if d["id"] == body["id"]), {"status": "gone"})
        if state["status"] != "indexing":
            error = f" ({state.get('error')})" if state.get("error") else ""
            return Got(f"201, then {state['status']}{error}", time.perf_counter() - start)
        await asyncio.sleep(POLL_SECONDS)


async def image(ctx: Context, data: bytes) -> Got:
    _, conversation = await ctx.open("mallory")
    start = time.perf_counter()
    status, body = await ctx.upload("mallory", f"/api/conversations/{conversation}/images", "scans.jpg", data)
    return Got(said(status, body), time.perf_counter() - start)


async def imported(ctx: Context, user: str, data: bytes, noted: bool = True) -> Got:
    """An import, followed to its end: the POST answers once the file is checked, then it is written.
    `noted`: its answer goes in what mallory saw."""
    start = time.perf_counter()
    status, body = await ctx.upload(user, "/api/imports", "conversations.json", data)
    if noted:
        ctx.note(f"{user}'s import answered {status}")
    if status != 202:
        return Got(said(status, body), time.perf_counter() - start)
    while body.get("status") == "importing":
        await asyncio.sleep(POLL_SECONDS)
        status, body = await ctx.call(user, "GET", f"/api/imports/{body['id']}")
    error = f" ({body.get('error')})" if body.get("error") else ""
    return Got(f"202, then {body.get('status')}{error}", time.perf_counter() - start)


async def burst(ctx: Context, upload: files.UploadBurst) -> Got:
    """Row 9: `upload.count` documents at once, over two conversations (20 documents is one's most), until
    every one is answered: what they cost in flight (the indexing of those taken is a user's due, within
    the quota)."""
    conversations = [(await ctx.open("mallory"))[1] for _ in range(2)]
    data = upload.document()
    start = time.perf_counter()
    got = await asyncio.gather(
        *(document(ctx, "mallory", f"part{n}.txt", data, conversations[n % 2], False) for n in range(upload.count))
    )
    answers: dict[str, int] = {}
    for one in got:
        key = one.answer[:90]
        answers[key] = answers.get(key, 0) + 1
    return Got("; ".join(f"{count}x {answer}" for answer, count in answers.items()), time.perf_counter() - start)


async def searches(ctx: Context, count: int = 4) -> Got:
    """Row 10: `count` searches at once for the word of mallory's huge message (imported in `setup`)."""
    start = time.perf_counter()

    async def one() -> str:
        status, body = await ctx.call("mallory", "GET", "/api/search", params={"q": files.BIG_MESSAGE_QUERY})
        ctx.note(f"a search answered {status}")
        return str(status) if status != 200 else f"200 ({len(body['results'])} hits)"

    answers = await asyncio.gather(*(one() for _ in range(count)))
    return Got(", ".join(answers), time.perf_counter() - start)


async def mcp_window(ctx: Context, seconds: float) -> Got:
    """Rows 11-12: the hostile part is the operator's server the app was started with; mallory only waits
    while bob chats, then reads what the app says of the server."""
    await asyncio.sleep(seconds)
    _, tools = await ctx.call("bob", "GET", "/api/tools")
    source = next((s for s in tools.get("sources", []) if s["name"] == "hostile"), {})
    status = source.get("status", "?")
    error = f" ({str(source.get('error'))[:100]})" if source.get("error") else ""
    return Got(f"server {status}{error}, {len(source.get('tools', []))} tools listed", seconds)


# ---- bob's probes ------------------------------------------------------------------------------------

BOB_TEXT = b"a note of 20 bytes.\n"


def _bob_png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def _bob_import() -> bytes:
    message = {"id": "m1", "parent_id": None, "role": "user", "content": "hello", "created_at": 1.0}
    conversation = {"id": "bob-small", "title": "small", "created_at": 1.0, "updated_at": 1.0}
    data = {"format": "pocketchat.conversation", "version": 1, "conversation": conversation, "messages": [message]}
    return json.dumps(data).encode()


Probe = Callable[[Context, str], Awaitable[None]]  # one request of bob's, on his conversation for probes


async def probe_document(ctx: Context, conversation: str) -> None:
    """Bob attaches a 20-byte .txt (timed to its answer), then removes it (a conversation holds 20 at most)."""
    path = f"/api/conversations/{conversation}/documents"
    status, body = await ctx.upload("bob", path, "note.txt", BOB_TEXT)
    if status == 201:
        await ctx.call("bob", "DELETE", f"{path}/{body['id']}")


async def probe_image(ctx: Context, conversation: str) -> None:
    path = f"/api/conversations/{conversation}/images"
    status, body = await ctx.upload("bob", path, "dot.png", _bob_png())
    if status == 201:
        await ctx.call("bob", "DELETE", f"{path}/{body['id']}")


async def probe_import(ctx: Context, conversation: str) -> None:
    await imported(ctx, "bob", _bob_import(), noted=False)


async def probe_list(ctx: Context, conversation: str) -> None:
    await ctx.call("bob", "GET", "/api/conversations")


# ---- the rows --------------------------------------------------------------------------------------


@dataclass
class Row:
    number: int
    what: str  # what mallory sends
    act: Callable[[Context], Awaitable[Got]]
    probe: Probe | None = None
    probe_what: str = ""
    setup: Callable[[Context], Awaitable[Got]] | None = None  # in the hostile run, before it is timed (row 10)
    hostile_app: Callable[[bool], dict[str, Any]] | None = None  # an MCP server for the hostile run's app
    script: Callable[[bool], list[Reply]] | None = None  # the fake's replies to mallory's message


def sized(quick: bool, full: Any, small: Any) -> Any:
    return small if quick else full


def _rows() -> list[Row]:
    text = "20-byte .txt"
    return [
        Row(1, "calculator `round(1,-10**9)` (quick: 10**7)", lambda c: turn(c, 1),
            script=lambda q: files.calculator_replies(sized(q, 9, 7))),
        Row(2, "20 MB .txt on one line (quick: 5 MB)", lambda c: document(
            c, "mallory", "line.txt", files.one_line_text(sized(c.quick, 20, 5))), probe_document, text),
        Row(3, "100 KB .txt of spaces (quick: 50 KB)", lambda c: document(
            c, "mallory", "spaces.txt", files.spaces_text(sized(c.quick, 100, 50))), probe_document, text),
        Row(4, "6.5 KB PDF, 20 pages share a 1 MB stream (quick: 5 pages)", lambda c: document(
            c, "mallory", "shared.pdf", files.shared_stream_pdf(sized(c.quick, 20, 5))), probe_document, text),
        Row(5, "HTML `'</'*200000` (quick: 100000)", lambda c: document(
            c, "mallory", "tags.html", files.close_tags_html(sized(c.quick, 200_000, 100_000))), probe_document, text),
        Row(6, "6000x6000 JPEG of 2,080 scans (quick: 757)", lambda c: image(
            c, files.many_scans_jpeg(refinements=sized(c.quick, 10, 3))), probe_image, "8x8 PNG"),
        Row(7, "2 ChatGPT exports, 2.1 MB chain of empty nodes (quick: 1/4)", _two_chain_imports,
            probe_import, "267-byte import"),
        Row(8, "100 MB import of `[[],[],...]` (quick: 25 MB)", lambda c: imported(
            c, "mallory", files.empty_lists_import(sized(c.quick, 100, 25))), probe_import, "267-byte import"),
        Row(9, "25 uploads of 19 MB at once (quick: 12)", lambda c: burst(
            c, files.UploadBurst(count=sized(c.quick, 25, 12))), probe_document, text),
        Row(10, "4 searches at once over an imported 7 MB message (quick: 2 MB)", searches, probe_list,
            "GET /api/conversations", setup=lambda c: imported(
                c, "mallory", files.big_message_import(sized(c.quick, 7, 2)))),
        Row(11, "MCP server writing 100 MB without a newline (quick: 30 MB)", lambda c: mcp_window(
            c, sized(c.quick, 30, 15)), hostile_app=lambda q: files.flooding_mcp_server(sized(q, 100, 30))),
        Row(12, "MCP server listing 10,000 tools", lambda c: mcp_window(c, 0),
            hostile_app=lambda q: files.many_tools_mcp_server()),
        Row(13, "16,000 tool calls in one reply (quick: 4,000)", lambda c: turn(c, 13),
            script=lambda q: files.many_calls_replies(sized(q, 16_000, 4_000))),
    ]  # fmt: skip


async def _two_chain_imports(ctx: Context) -> Got:
    """Row 7: two users import at once (one user may run one import): both import readers held."""
    data = files.chatgpt_chain_export(*sized(ctx.quick, (11_000, 8_500), (5_500, 4_250)))
    got = await asyncio.gather(imported(ctx, "mallory", data), imported(ctx, "mallory2", data))
    return Got(" / ".join(one.answer for one in got), max(one.seconds for one in got))


ROWS = {row.number: row for row in _rows()}

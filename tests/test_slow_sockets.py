"""A socket that stops reading (a stalled tab, a phone gone into a tunnel) holds up nobody else, and is
closed with 1013 once it has fallen behind; its client comes back and resumes."""

import asyncio
import contextlib
import json
import socket

import psutil
from websockets.asyncio.client import connect as connect_async
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from tests.conftest import AppProcess, reply_text
from tests.fake_openai import Reply
from tests.test_api import request
from tests.test_protocol import wait_for

BIG_TOKEN = "x" * 2000  # big chunks fill a socket's buffers quickly


class StalledSocket:
    """A real WebSocket over a TCP socket with a tiny receive buffer, that reads nothing until told."""

    def __init__(self, app: AppProcess) -> None:
        self.protocol = ClientProtocol(parse_uri(app.ws_url))
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", app.port))
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        while not any(isinstance(event, Response) for event in self._read_events()):
            pass

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            self.sock.sendall(data)

    def _read_events(self) -> list[object]:
        data = self.sock.recv(65536)
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()
        return self.protocol.events_received()

    def send(self, frame: dict) -> None:
        self.protocol.send_text(json.dumps(frame).encode())
        self._flush()

    def read_until_closed(self, timeout: float = 30) -> tuple[list[dict], int | None]:
        """Start reading at last: the frames that were waiting, and the close code the server sent."""
        self.sock.settimeout(timeout)
        frames, code = [], None
        while code is None:
            events = self._read_events()
            for event in events:
                if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                    frames.append(json.loads(event.data))
                elif isinstance(event, Frame) and event.opcode is Opcode.CLOSE:
                    code = int.from_bytes(event.data[:2], "big")
            if not events and self.protocol.state.name == "CLOSED":
                break
        return frames, code

    def close(self) -> None:
        self.sock.close()


async def follow_turn(url: str, session: str) -> list[dict]:
    async with connect_async(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "hello", "conversation_id": session}))
        frames, renamed = [], False
        while not (frames and frames[-1]["type"] == "turn_end" and renamed):
            frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
            # The rename made while the turn streams reaches every socket that reads.
            if frame["type"] == "conversation" and frame["title"] == "renamed":
                renamed = True
            elif frame["type"] in ("turn_start", "chunk", "turn_end"):
                frames.append(frame)
        return frames


def test_a_socket_that_reads_nothing_holds_up_neither_100_others_nor_a_rename_nor_a_delete(start_app, fake):
    app = start_app("--send-timeout", "60")  # the stalled socket stays attached all along
    fake.queue(Reply(tokens=[BIG_TOKEN] * 1500, pace=0.001))
    starter = app.client()
    session = starter.hello()["conversation_id"]
    stalled = StalledSocket(app)
    stalled.send({"type": "hello", "conversation_id": session})

    async def scenario() -> list[list[dict]]:
        followers = [asyncio.create_task(follow_turn(app.ws_url, session)) for _ in range(100)]
        await asyncio.sleep(1)  # every follower attached
        starter.send("message", content="a long answer for everyone")
        await asyncio.to_thread(starter.until, "chunk")
        # The stalled socket's buffers are full long before the reply ends; a rename still answers.
        rename = (app, "PATCH", f"/api/conversations/{session}", {"title": "renamed"})
        assert (await asyncio.to_thread(request, *rename))[0] == 200
        return await asyncio.wait_for(asyncio.gather(*followers), 90)

    transcripts = asyncio.run(scenario())
    assert reply_text(transcripts[0]) == BIG_TOKEN * 1500
    assert all(t == transcripts[0] for t in transcripts)
    # Deleting does not wait for the stalled socket either, and the conversation is gone for good.
    assert request(app, "DELETE", f"/api/conversations/{session}")[0] == 204
    assert request(app, "GET", f"/api/conversations/{session}")[0] == 404
    stalled.close()
    app.stop()  # restart: it is not in the database either
    app.start()
    assert request(app, "GET", f"/api/conversations/{session}")[0] == 404


def test_a_socket_that_falls_behind_is_closed_with_1013_and_its_client_resumes(start_app, fake):
    app = start_app("--send-timeout", "1")
    fake.queue(Reply(tokens=[BIG_TOKEN] * 2000, pace=0.002))
    opener = app.client()
    session = opener.hello()["conversation_id"]
    opener.close()  # the new conversation is kept for the stalled socket to say hello to
    stalled = StalledSocket(app)
    stalled.send({"type": "hello", "conversation_id": session})
    stalled.send({"type": "message", "content": "a long answer, which I will not read"})
    wait_for(lambda: "closing a WebSocket that fell behind" in app.logs(), timeout=30)
    frames, code = stalled.read_until_closed()
    assert code == 1013
    assert [f["type"] for f in frames[:2]] == ["ready", "turn_start"]
    seen = reply_text(frames)
    # The client comes back and resumes where it was: nothing lost, nothing twice.
    returning = app.client()
    ready = returning.hello(session)
    if "running" in ready:
        assert ready["running"]["content"].startswith(seen)
        text = ready["running"]["content"] + reply_text(returning.until("turn_end", timeout=60))
    else:
        text = ready["history"][-1]["content"]
    assert text == BIG_TOKEN * 2000
    stalled.close()


def test_a_client_that_floods_frames_and_reads_nothing_is_closed_and_the_server_carries_on(start_app):
    app = start_app("--send-timeout", "2")
    stalled = StalledSocket(app)
    try:
        for _ in range(50_000):  # each is answered by an error frame nobody reads
            stalled.send({"type": "shout"})
    except OSError:
        pass  # the server stopped reading once it closed this socket
    wait_for(lambda: "closing a WebSocket that fell behind" in app.logs(), timeout=30)
    assert "fell behind (over 256 frames waiting)" in app.logs()  # closed for what it queued, at once
    _, code = stalled.read_until_closed()
    assert code == 1013
    assert app.client().hello()["type"] == "ready"
    assert app.get("/healthz")["status"] == "ok"
    stalled.close()


def test_hellos_a_client_never_reads_do_not_make_the_server_hold_hundreds_of_megabytes(start_app):
    app = start_app()  # the default --send-timeout: 10 s
    client = app.client()
    session = client.hello()["conversation_id"]
    for i in range(4):  # about 1 MB of history: each `ready` carries all of it
        assert client.turn(f"{i} " + "x" * 250_000)[-1]["status"] == "complete"
    client.close()
    server = psutil.Process(app.process.pid)
    before = server.memory_info().rss
    stalled = StalledSocket(app)
    with contextlib.suppress(OSError):
        for _ in range(255):  # about 15 KB sent in all
            stalled.send({"type": "hello", "conversation_id": session})
    wait_for(lambda: "closing a WebSocket that fell behind (over 8 MiB waiting)" in app.logs())
    grown = (server.memory_info().rss - before) / 2**20
    assert grown < 64, f"the server grew by {grown:.0f} MiB"
    stalled.close()

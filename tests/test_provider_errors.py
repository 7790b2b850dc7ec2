"""Each way a provider request can time out or fail, for real, and what the turn's error then says."""

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator

import openai
import pytest

from pocketchat.errors import ProviderError
from pocketchat.providers import openai_compatible
from pocketchat.providers.openai_compatible import OpenAIProvider
from pocketchat.providers.openai_stream import read_chunks
from tests.fake_openai import Reply

MESSAGES = [{"role": "user", "content": "hi"}]


async def reply_or_error(provider: OpenAIProvider) -> tuple[list[object], ProviderError | None, float]:
    """The chunks of one streamed reply, the ProviderError that ended it if one did, and the seconds it took."""
    chunks: list[object] = []
    started = time.monotonic()
    try:
        async with provider.open_stream(MESSAGES, "fake-model", None) as stream:
            async for chunk in stream:
                chunks.append(chunk)
    except ProviderError as error:
        return chunks, error, time.monotonic() - started
    finally:
        await provider.aclose()
    return chunks, None, time.monotonic() - started


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """The port of a listener that never accepts and whose accept queue is full: a connect there hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    # Linux queues backlog + 1 connections; a few more make sure the next SYN is dropped.
    fillers = [socket.socket() for _ in range(3)]
    for filler in fillers:
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
    yield port
    for sock in [*fillers, listener]:
        sock.close()


def test_a_connect_timeout_says_it_could_not_connect(full_backlog):
    url = f"http://127.0.0.1:{full_backlog}/v1"
    provider = OpenAIProvider(url, "sk-test", "fake-model", idle_limit=30, connect_timeout=0.3)
    _, error, seconds = asyncio.run(reply_or_error(provider))
    assert error is not None and error.retryable
    assert error.message == f"Could not connect to the provider at {url}/ within 0.3 s."
    assert seconds < 5


def test_a_pool_timeout_says_no_connection_came_free(fake, monkeypatch):
    # One pooled connection, held by a reply that stalls: the second request can only wait for it.
    monkeypatch.setattr(openai_compatible, "MAX_CONNECTIONS", 1)
    fake.queue(Reply(count=5, stall_after=1))
    url = f"http://127.0.0.1:{fake.port}/v1"
    provider = OpenAIProvider(url, "sk-test", "fake-model", idle_limit=30, connect_timeout=0.3)

    async def second_while_first_streams() -> ProviderError | None:
        async with provider.open_stream(MESSAGES, "fake-model", None):
            return (await reply_or_error(provider))[1]

    error = asyncio.run(second_while_first_streams())
    assert error is not None and error.retryable
    assert error.message.startswith(f"No connection to the provider at {url}/ came free within 0.3 s")
    assert len(fake.chat_requests) == 1


def test_a_provider_that_accepts_and_never_answers_sent_nothing():
    async def run() -> tuple[ProviderError | None, float]:
        hung_up = asyncio.Event()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # until the client hangs up
            writer.close()
            hung_up.set()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        provider = OpenAIProvider(url, "sk-test", "fake-model", idle_limit=0.3, connect_timeout=5)
        _, error, seconds = await reply_or_error(provider)
        await asyncio.wait_for(hung_up.wait(), 5)
        server.close()
        return error, seconds

    error, seconds = asyncio.run(run())
    assert error is not None and error.retryable
    assert error.message.startswith("The provider at http://127.0.0.1:")
    assert error.message.endswith("/v1/ sent nothing for 0.3 s.")
    assert seconds < 5


def test_a_stream_that_stalls_midway_sent_nothing(fake):
    # Paced: the chunks before the stall come while the reader reads (its idle watch then bounds the stall).
    fake.queue(Reply(count=8, pace=0.05, stall_after=4))
    url = f"http://127.0.0.1:{fake.port}/v1"
    provider = OpenAIProvider(url, "sk-test", "fake-model", idle_limit=0.3)
    chunks, error, _ = asyncio.run(reply_or_error(provider))
    assert len(chunks) >= 4
    assert error is not None and error.message == f"The provider at {url}/ sent nothing for 0.3 s."


def test_a_stream_whose_every_pause_is_under_the_idle_limit_is_read_whole(fake):
    # The idle watch rings once per limit, not at each read: when it rings, bytes that came since count.
    fake.queue(Reply(count=8, pace=0.2))
    provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=0.3)
    chunks, error, seconds = asyncio.run(reply_or_error(provider))
    assert error is None and seconds > 1.4  # five times the limit, in pauses under it
    assert (
        sum(1 for c in chunks if isinstance(c, dict) and c["choices"] and c["choices"][0]["delta"].get("content")) == 8
    )


def test_a_refused_connection_says_why():
    # The SDK's aiohttp transport reports this as a timeout too; it must not read like one.
    provider = OpenAIProvider("http://127.0.0.1:9/v1", "sk-test", "fake-model", idle_limit=30, connect_timeout=5)
    _, error, seconds = asyncio.run(reply_or_error(provider))
    assert error is not None and error.retryable
    assert error.message.startswith(
        "Could not reach the provider at http://127.0.0.1:9/v1/: [Errno 111] Connect call failed"
    )
    assert seconds < 5


class Arriving:
    """A response whose body arrives in the pieces given, as aiohttp's reads hand it over."""

    url = "http://provider/v1/chat/completions"

    connection = None  # the whole body is here already: nothing left to read from a connection

    def __init__(self, pieces: tuple[bytes, ...]) -> None:
        self.content = self
        self._pieces = iter(pieces)

    def close(self) -> None:
        """What the idle watch calls (it never does here: every piece is here at once)."""

    async def iter_any(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece


def read_events(*pieces: bytes) -> list[object]:
    """The chunks the provider's SSE reader gets from a response body that arrives in `pieces`."""

    async def read() -> list[object]:
        return [chunk async for chunk in read_chunks(Arriving(pieces), lambda error: error, 5.0)]  # type: ignore[arg-type]

    return asyncio.run(read())


def test_the_sse_reader_reads_events_however_the_network_cuts_them():
    # An event split across reads, CRLF line ends, a comment, an `event` line, data on two lines,
    # and what follows [DONE] read (for a moment) but not yielded.
    assert read_events(
        b'data: {"a"',
        b': 1}\n\n: keep-alive\r\n\r\nevent: x\r\ndata: {"b":\r\ndata: 2}\r\n\r\n',
        b'data:{"c": "\\ud83d"}\n\ndata: [DONE]\n\ndata: {"d": 4}\n\n',
    ) == [{"a": 1}, {"b": 2}, {"c": "\ud83d"}]


def test_an_error_event_in_the_stream_is_the_providers_error():
    with pytest.raises(openai.APIError, match="overloaded"):
        read_events(b'data: {"choices": []}\n\ndata: {"error": {"message": "overloaded"}}\n\n')


def test_a_stream_kept_open_after_done_is_a_complete_reply_at_once(fake):
    # A server (or a proxy) that keeps the response open after [DONE]: the SDK reads on for a moment
    # only, and so must the reader; the reply is whole, not an error when the read times out.
    fake.queue(Reply(tokens=["all ", "here"], linger=True))
    provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=5)
    chunks, error, seconds = asyncio.run(reply_or_error(provider))
    assert error is None
    text = [c["choices"][0]["delta"].get("content") or "" for c in chunks if isinstance(c, dict) and c["choices"]]
    assert "".join(text) == "all here"
    assert seconds < 2


async def two_replies(provider: OpenAIProvider, pause: float) -> list[str]:
    """The text of two replies read `pause` seconds apart, as a person reads one and writes the next message."""
    texts = []
    try:
        for wait in (0, pause):
            await asyncio.sleep(wait)
            async with provider.open_stream(MESSAGES, "fake-model", None) as stream:
                pieces = [c["choices"][0]["delta"].get("content") or "" async for c in stream if c["choices"]]
                texts.append("".join(pieces))
    finally:
        await provider.aclose()
    return texts


def test_a_pooled_connection_outlives_a_pause_between_messages(fake):
    # A person reads a reply before writing the next message: that turn reuses the connection rather
    # than opening a new one (a TCP and TLS handshake to a remote provider, before its first chunk).
    provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=5)
    assert asyncio.run(two_replies(provider, pause=6)) == ["tok1 tok2 tok3 tok4 tok5 "] * 2
    assert fake.connections == 1


def test_a_connection_the_provider_closed_while_idle_is_not_reused(fake):
    # A provider that closes idle connections sooner than the pool keeps them (uvicorn's 5 s, say): the
    # next reply comes on a new connection, with no error.
    fake.idle_close = 0.2
    provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=5)
    assert asyncio.run(two_replies(provider, pause=1.0)) == ["tok1 tok2 tok3 tok4 tok5 "] * 2
    assert fake.connections == 2


def test_a_close_that_crosses_the_request_sends_it_again_at_once(fake):
    # The provider's keep-alive runs out as the next request goes out on the pooled connection: it
    # closes it unanswered. The request goes again at once on a new connection: no error, no retry wait.
    fake.queue(Reply(), Reply(hang_up=True))
    provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=5)
    assert asyncio.run(two_replies(provider, pause=0)) == ["tok1 tok2 tok3 tok4 tok5 "] * 2
    assert len(fake.chat_requests) == 3 and fake.connections == 2

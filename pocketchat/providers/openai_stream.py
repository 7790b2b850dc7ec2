"""Reading an OpenAI-compatible chat completion's stream: its server-sent events, each `data` parsed as
JSON, a silence of the idle limit ending it; and the request the SDK's exceptions name."""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import httpx2
import openai
import orjson

from utils.llm_stream import Chunk

# How long what follows a stream's `[DONE]` is read (the SDK's own wait), so the connection can be used again.
DRAIN_SECONDS = 0.1


class IdleWatch:
    """Closes a response whose provider sent nothing for `limit` seconds. aiohttp's `sock_read` does that
    by cancelling a timer and making a new one at every network read, about 3% of the app's CPU per
    chunk in a burst of streams (docs/benchmarks.md); this timer rings once per `limit` at most, and
    then looks at when bytes last came (`last`, which the reader sets): it rings again for the rest, or
    closes."""

    def __init__(self, response: aiohttp.ClientResponse, limit: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.response, self.limit = response, limit
        self.last = self.loop.time()
        self.rang = False
        self._timer = self.loop.call_at(self.last + limit, self._ring)

    def _ring(self) -> None:
        if (due := self.last + self.limit) > self.loop.time():
            self._timer = self.loop.call_at(due, self._ring)
            return
        self.rang = True
        self.response.close()

    def cancel(self) -> None:
        self._timer.cancel()


async def read_chunks(
    response: aiohttp.ClientResponse, translate: Callable[[openai.OpenAIError], Exception], idle_limit: float
) -> AsyncIterator[Chunk]:
    """The chunks of a chat completion's server-sent events, each `data` parsed as JSON, as the SDK's
    AsyncStream reads them (an `error` in one is an APIError; `[DONE]` ends them), but with one split
    per network read rather than work per line, and orjson (docs/benchmarks.md). What goes wrong raises
    the SDK's exception for it as `translate` makes it (here, not in a generator around this one: each
    layer costs every chunk). A silence of `idle_limit` seconds ends them as aiohttp's read timeout,
    which bounded the wait for the response's head, did: it is switched off for the body."""
    if response.connection is not None:  # None: the whole body came with the head
        # As aiohttp does for a WebSocket; it sets the timeout again for the connection's next request.
        response.connection.protocol.read_timeout = None
    idle = IdleWatch(response, idle_limit)
    rest = b""  # the start of a line not ended yet
    data: list[bytes] = []  # the `data` lines of the event being read
    try:
        async for received in response.content.iter_any():
            idle.last = idle.loop.time()
            lines = (rest + received).split(b"\n")
            rest = lines.pop()
            for line in lines:
                line = line.removesuffix(b"\r")
                if line:
                    if line.startswith(b"data:"):
                        data.append(line[6:] if line.startswith(b"data: ") else line[5:])
                    continue  # comments, `event`, `id` and `retry` tell a chat completion nothing
                if not data:
                    continue
                event = data[0] if len(data) == 1 else b"\n".join(data)
                data.clear()
                if event.startswith(b"[DONE]"):
                    await _drain(response)
                    return
                chunk = _json(event)
                if isinstance(chunk, dict) and chunk.get("error"):
                    request = named_request(str(response.url))
                    error = chunk["error"]
                    raise translate(openai.APIError(_stream_error_message(error), request, body=error))
                yield chunk
        if idle.rang:  # the body ended where the watch closed it
            raise TimeoutError
    except (aiohttp.ClientError, OSError) as error:  # a TimeoutError is an OSError
        if isinstance(error, TimeoutError) or idle.rang:  # aiohttp's read timeout, or the watch's
            timed_out = openai.APITimeoutError(request=named_request(str(response.url)))
            cause = error if isinstance(error, TimeoutError) else TimeoutError()
            raise translate(_caused_by(timed_out, cause)) from None
        cut = openai.APIConnectionError(request=named_request(str(response.url)))
        raise translate(_caused_by(cut, error)) from None
    finally:
        idle.cancel()


def _caused_by(error: openai.OpenAIError, cause: BaseException) -> openai.OpenAIError:
    """`error`, raised from `cause`: `translate` reads what went wrong from its cause."""
    error.__cause__ = cause
    return error


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read what follows `[DONE]` for a moment, as the SDK does, so that the connection can be used again;
    the reply is complete, so a server that keeps the response open, or fails now, changes nothing."""
    with contextlib.suppress(TimeoutError, aiohttp.ClientError, OSError):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in response.content.iter_any():
                pass


def named_request(url: str) -> httpx2.Request:
    """The request the SDK's exceptions name (only its method and URL are read); made only for one,
    since httpx2 parses the URL (a third of the request's CPU when it was made for every request)."""
    return httpx2.Request("POST", url)


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # What orjson refuses and the json module reads: the escape of a lone surrogate (half of a
        # character split across two chunks, which UnicodeRepair joins again), NaN. Invalid JSON
        # raises here as it did in the SDK.
        return json.loads(data)


def _stream_error_message(error: object) -> str:
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else "An error occurred during streaming"

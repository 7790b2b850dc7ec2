"""Any OpenAI-compatible endpoint (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp server) as a chat provider."""

import asyncio
import contextlib
import functools
import json
import logging
import re
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp
import httpx2
import openai
import orjson
import yarl

from pocketchat.errors import ProviderError
from utils.llm_stream import Chunk, Sampling, ToolOffer

logger = logging.getLogger(__name__)
RETRYABLE_STATUSES = {408, 409, 425, 429, 500, 502, 503, 504}
# Keys look like sk-..., sk-or-v1-..., or-...; a provider may echo part of one back.
# How long what follows a stream's `[DONE]` is read (the SDK's own wait), so the connection can be used again.
DRAIN_SECONDS = 0.1
KEY_PATTERN = re.compile(r"\b(sk|or|key)-[A-Za-z0-9_\-*]{8,}")
# The streaming request's pool: at most this many connections open at once (as the SDK's), and a free
# one kept this many seconds. Longer than the SDK's 5 s: a person reads a reply before writing the next
# message, and that turn would otherwise open a new connection (TCP and TLS) before its first chunk.
# Under the 60 s idle timeout of common load balancers (AWS's). A server that closes an idle one
# sooner (uvicorn after 5 s) is seen closing it: it is not reused; one whose close crosses the request
# is sent the request again at once (`_post`).
MAX_CONNECTIONS = 1000
KEEPALIVE_SECONDS = 55.0


class OpenAIProvider:
    kind = "openai"

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        model: str | None,
        idle_limit: float,
        temperature: float | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        """`connect_timeout`: seconds to get a connection to the provider, a new one or a free one of the
        pool; `idle_limit`: seconds the provider may then stay silent."""
        # One client per process: it pools connections. The SDK's own retries are off because the
        # chat node retries, and only before the first chunk. Keyless servers (Ollama, vLLM,
        # llama.cpp) get no Authorization header at all rather than a made-up key: the SDK wants
        # that said on every request. A user and password in the base URL (a proxy in front of
        # Ollama, say) are sent as Basic auth instead of the key, as httpx would send them.
        base_url, basic_auth = _split_credentials(base_url)
        timeout = openai.Timeout(connect=connect_timeout, read=idle_limit, write=connect_timeout, pool=connect_timeout)
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=0,
            timeout=timeout,
            # The SDK's aiohttp transport, "for improved concurrency performance": it reads a stream
            # with less CPU per chunk than the default httpx one and closes stale pooled connections
            # in the background, where httpx closes them one event-loop turn each inside the first
            # request after a quiet spell, which held that request up to 3 s under a burst.
            http_client=openai.DefaultAioHttpClient(timeout=timeout),
            _enforce_credentials=False,
        )
        self._api_key = api_key
        authorization = basic_auth or (None if api_key else openai.Omit())
        self._headers: dict[str, Any] = {} if authorization is None else {"Authorization": authorization}
        # The streaming request is sent with aiohttp directly (README, Benchmarks): the SDK's headers
        # (its key or none, its user agent, organization and project) and URL, computed once.
        self._chat_url = f"{self.client.base_url}chat/completions"
        self._chat_headers = _sent_headers({**self.client.auth_headers, **self.client.default_headers, **self._headers})
        # The SDK's aiohttp transport's mapping: `connect` bounds the wait for a pooled connection too.
        self._chat_timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=idle_limit
        )
        self._session: aiohttp.ClientSession | None = None
        self._model = model
        self._without_tools: set[str] = set()  # models that refused a request with tools
        self.temperature = temperature
        self.idle_limit = idle_limit
        self.connect_timeout = connect_timeout
        self.base_url = _without_credentials(str(self.client.base_url))

    def describe(self) -> dict[str, Any]:
        """What the page shows about who answers."""
        return {"kind": self.kind, "base_url": self.base_url, "local": False}

    def usage_source(self, model: str) -> str:
        return "provider"

    def supports_tools(self, model: str) -> bool:
        """OpenAI tool calls, unless the model refused them once (see open_stream)."""
        return model not in self._without_tools

    async def warm_up(self) -> None:
        return None  # nothing to load; the model list is asked for on first use

    async def default_model(self) -> str:
        if self._model is None:
            models = await self.list_models()
            if not models:
                raise ProviderError(f"{self.base_url} lists no models; set POCKETCHAT_MODEL or --model.")
            self._model = models[0]
        return self._model

    async def list_models(self) -> list[str]:
        try:
            return [model.id async for model in self.client.models.list(extra_headers=self._headers)]
        except openai.OpenAIError as error:
            raise self.translate(error) from None

    async def embeddings(self, texts: list[str], model: str) -> list[list[float]]:
        """One vector per text from the provider's `/v1/embeddings` (`--embedding-model`), in order."""
        try:
            answer: Any = await self.client.post(
                "/embeddings",
                body={"model": model, "input": texts},
                cast_to=object,
                options={"headers": self._headers},
            )
            rows = sorted(answer["data"], key=lambda row: row["index"])
            return [row["embedding"] for row in rows]
        except openai.OpenAIError as error:
            raise self.translate(error) from None
        except (KeyError, TypeError) as error:
            raise ProviderError(f"The provider's embeddings cannot be read ({error!r:.100}).") from None

    @asynccontextmanager
    async def open_stream(
        self,
        messages: list[dict[str, str]],
        model: str,
        max_tokens: int | None,
        on_queued: Callable[[int], object] | None = None,
        tools: ToolOffer | None = None,
        sampling: Sampling | None = None,
    ) -> AsyncIterator[AsyncIterator[Chunk]]:
        """The provider's chunk stream; leaving the block closes the HTTP response (the provider sees it).
        `sampling` (a conversation's own) wins over --temperature; what neither sets is not sent.

        Remote providers queue requests their own way, so `on_queued` is never called here.
        """
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if max_tokens:
            body["max_tokens"] = max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(sampling or {})
        if tools is not None:
            body["tools"], body["tool_choice"] = tools.tools, tools.choice
        try:
            try:
                response = await self._post(body)
            except openai.APIStatusError as error:
                if tools is None or not _refuses_tools(error):
                    raise
                # A model without tool calls (Ollama's "does not support tools", vLLM without a tool
                # parser, a llama.cpp server without --jinja): asked again without them, and offered
                # none from now on. Nothing was streamed yet.
                logger.warning("model %s refused tools (%s); it is offered none from now on", model, error.status_code)
                self._without_tools.add(model)
                del body["tools"], body["tool_choice"]
                response = await self._post(body)
        except openai.OpenAIError as error:
            raise self.translate(error) from None
        try:
            yield _chunks(response, functools.partial(self.translate, streaming=True), self.idle_limit)
        finally:
            # A response not read to its end closes its connection here: the provider sees it.
            response.release()

    async def _post(self, body: dict[str, Any]) -> aiohttp.ClientResponse:
        """The streaming request, sent with aiohttp directly rather than through the SDK's request
        options, httpx2 and its aiohttp transport (the largest part of a turn's start in a profile);
        what goes wrong raises the SDK's exception for it, so `translate` says the same as before."""
        data = _json_body(body)

        def send() -> Awaitable[aiohttp.ClientResponse]:
            return self._pool().post(self._chat_url, data=data, headers=self._chat_headers, timeout=self._chat_timeout)

        try:
            try:
                response = await send()
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
                if isinstance(error, aiohttp.ClientConnectorError):
                    raise  # no connection was made: nothing crossed
                # The server closed (or reset) the connection as the request went out on it: a pooled
                # connection whose keep-alive ran out at that moment. Sent again at once on another, as
                # aiohttp does for idempotent requests (a POST it leaves to us).
                response = await send()
        except TimeoutError as error:  # aiohttp's timeouts are TimeoutErrors
            raise openai.APITimeoutError(request=_named_request(self._chat_url)) from error
        except (aiohttp.ClientError, OSError) as error:
            raise openai.APIConnectionError(request=_named_request(self._chat_url)) from error
        if response.status >= 400:
            raise await self._status_error(response, _named_request(self._chat_url))
        return response

    def _pool(self) -> aiohttp.ClientSession:
        """The streaming requests' session, opened on first use: it needs the running event loop."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_SECONDS, ssl=httpx2.create_ssl_context()
            )
            # The environment's proxy settings count, as they do for the SDK; looked up once here rather
            # than by aiohttp's trust_env on every request, where with ~/.netrc's read they took about
            # a third of the request's CPU in a profile.
            proxy, proxy_auth = _env_proxy(self._chat_url)
            self._session = aiohttp.ClientSession(connector=connector, proxy=proxy, proxy_auth=proxy_auth)
        return self._session

    async def _status_error(self, response: aiohttp.ClientResponse, request: httpx2.Request) -> openai.APIStatusError:
        """The SDK's own exception for an HTTP error status, built by the SDK from the body."""
        try:
            content = await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError):
            content = b""
        finally:
            response.release()
        read = httpx2.Response(response.status, headers=response.raw_headers, content=content, request=request)
        return self.client._make_status_error_from_response(read)

    def redact(self, text: str) -> str:
        if self._api_key:
            text = text.replace(self._api_key, "[redacted]")
        return KEY_PATTERN.sub("[redacted]", text)

    def translate(self, error: openai.OpenAIError, streaming: bool = False) -> ProviderError:
        """The SDK's exception as a ProviderError carrying the provider's own message and status;
        `streaming`: it came while the reply was streaming in."""
        if isinstance(error, openai.APIConnectionError):  # timeouts included
            if isinstance(error, openai.APITimeoutError) and (what_ran_out := self._timed_out(error)):
                return ProviderError(what_ran_out, retryable=True, kind="timeout")
            cause = _innermost_cause(error)
            # aiohttp's parser errors read "400, message: ..." though no HTTP 400 was sent.
            detail = " ".join(str(getattr(cause, "message", None) or cause or "").split())
            what = "The provider's stream broke off" if streaming else "Could not reach the provider"
            return ProviderError(
                self.redact(f"{what} at {self.base_url}" + (f": {detail}" if detail else "")),
                retryable=True,
                kind="stream_cut" if streaming else "connection",
            )
        if isinstance(error, openai.APIStatusError):
            return ProviderError(
                self.redact(f"The provider answered HTTP {error.status_code}: {_body_message(error)}"),
                status=error.status_code,
                retryable=error.status_code in RETRYABLE_STATUSES,
            )
        if isinstance(error, openai.APIError):
            return ProviderError(self.redact(f"The provider reported an error: {_body_message(error)}"))
        return ProviderError(self.redact(f"The provider client failed: {error}"))

    def _timed_out(self, error: openai.APITimeoutError) -> str | None:
        """Which wait ran out, said plainly; None when `error` is no timeout at all. The SDK's aiohttp
        transport (the model list, the embeddings) maps every aiohttp connection error, a refused
        connection included, to a timeout, so only the causes tell: a ConnectionTimeoutError ends the
        wait for a connection (new or pooled), a TimeoutError at the bottom (aiohttp's
        SocketTimeoutError) the wait for the provider's bytes."""
        causes = _causes(error)
        if any(isinstance(cause, aiohttp.ConnectionTimeoutError) for cause in causes):
            if _cut_off_waiting_for_the_pool(causes):
                return (
                    f"No connection to the provider at {self.base_url} came free within {self.connect_timeout:g} s:"
                    " PocketChat has too many requests open to it at once."
                )
            return f"Could not connect to the provider at {self.base_url} within {self.connect_timeout:g} s."
        if isinstance(_innermost_cause(error), TimeoutError | None):
            return f"The provider at {self.base_url} sent nothing for {self.idle_limit:g} s."
        return None

    async def aclose(self) -> None:
        await self.client.close()
        if self._session is not None:
            await self._session.close()


class IdleWatch:
    """Closes a response whose provider sent nothing for `limit` seconds. aiohttp's `sock_read` does that
    by cancelling a timer and making a new one at every network read, about 3% of the app's CPU per
    chunk in a burst of streams (README, Benchmarks); this timer rings once per `limit` at most, and
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


async def _chunks(
    response: aiohttp.ClientResponse, translate: Callable[[openai.OpenAIError], Exception], idle_limit: float
) -> AsyncIterator[Chunk]:
    """The chunks of a chat completion's server-sent events, each `data` parsed as JSON, as the SDK's
    AsyncStream reads them (an `error` in one is an APIError; `[DONE]` ends them), but with one split
    per network read rather than work per line, and orjson (README, Benchmarks). What goes wrong raises
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
                    request = _named_request(str(response.url))
                    error = chunk["error"]
                    raise translate(openai.APIError(_stream_error_message(error), request, body=error))
                yield chunk
        if idle.rang:  # the body ended where the watch closed it
            raise TimeoutError
    except (aiohttp.ClientError, OSError) as error:  # a TimeoutError is an OSError
        if isinstance(error, TimeoutError) or idle.rang:  # aiohttp's read timeout, or the watch's
            timed_out = openai.APITimeoutError(request=_named_request(str(response.url)))
            cause = error if isinstance(error, TimeoutError) else TimeoutError()
            raise translate(_caused_by(timed_out, cause)) from None
        cut = openai.APIConnectionError(request=_named_request(str(response.url)))
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


def _named_request(url: str) -> httpx2.Request:
    """The request the SDK's exceptions name (only its method and URL are read); made only for one,
    since httpx2 parses the URL (a third of the request's CPU when it was made for every request)."""
    return httpx2.Request("POST", url)


def _env_proxy(url: str) -> tuple[str | None, aiohttp.BasicAuth | None]:
    """The proxy the environment names for `url` (HTTP(S)_PROXY, NO_PROXY), and its credentials, as
    aiohttp's trust_env finds them; none when none is named."""
    try:
        proxy, auth = aiohttp.helpers.get_env_proxy_for_url(yarl.URL(url))
    except LookupError:
        return None, None
    return str(proxy), auth


def _json_body(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:
        # What orjson refuses to write and the json module writes (escaped): a lone surrogate, an
        # integer over 64 bits.
        return json.dumps(body).encode()


def _sent_headers(headers: dict[str, Any]) -> dict[str, str]:
    """The headers as sent: the SDK's Omit marks one that is not."""
    return {name: value for name, value in headers.items() if not isinstance(value, openai.Omit)}


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


def _without_credentials(url: str) -> str:
    """The URL as shown to people and logs: no user, password or query (a key may hide there)."""
    parts = urlsplit(url)
    netloc = f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname or ""
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _split_credentials(url: str | None) -> tuple[str | None, str | None]:
    """The URL without its user and password, and those as a Basic Authorization header value."""
    parts = urlsplit(url) if url else None
    if parts is None or parts.username is None:
        return url, None
    auth = aiohttp.BasicAuth(unquote(parts.username), unquote(parts.password or ""))
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])), auth.encode()


def _causes(error: BaseException) -> list[BaseException]:
    """`error`'s chain of causes, outermost first: httpx's, aiohttp's, then asyncio's or the OS's."""
    causes: list[BaseException] = []
    while (error := error.__cause__ or error.__context__) is not None and error not in causes:
        causes.append(error)
    return causes


def _innermost_cause(error: BaseException) -> BaseException | None:
    """The exception at the bottom of `error`'s chain of causes."""
    causes = _causes(error)
    return causes[-1] if causes else None


def _cut_off_waiting_for_the_pool(causes: list[BaseException]) -> bool:
    """Whether a connection timeout cut the request off while it queued for a free pooled connection.

    aiohttp raises the same ConnectionTimeoutError when the pool stays full as when the provider does
    not accept a new connection in time; only the frame where the wait was cancelled tells them apart.
    Tested against the installed aiohttp (tests/test_provider_errors.py): a rename there fails that test.
    """
    frames = (frame for cause in causes for frame, _ in traceback.walk_tb(cause.__traceback__))
    return any(frame.f_code.co_name == "_wait_for_available_connection" for frame in frames)


def _refuses_tools(error: openai.APIStatusError) -> bool:
    """Whether the provider refused the request for its tools (the model or the server has none)."""
    return error.status_code in (400, 422, 500, 501) and "tool" in _body_message(error).lower()


def _body_message(error: openai.APIError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(inner, str):
            return inner
    return error.message

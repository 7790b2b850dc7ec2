"""Any OpenAI-compatible endpoint (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp server) as a chat provider."""

import functools
import json
import logging
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
from pocketchat.providers.openai_errors import ErrorTranslator, refuses_tools
from pocketchat.providers.openai_stream import named_request, read_chunks
from utils.llm_stream import Chunk, Sampling, ToolOffer

logger = logging.getLogger(__name__)
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
        authorization = basic_auth or (None if api_key else openai.Omit())
        self._headers: dict[str, Any] = {} if authorization is None else {"Authorization": authorization}
        # The streaming request is sent with aiohttp directly (docs/benchmarks.md): the SDK's headers
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
        self.errors = ErrorTranslator(self.base_url, api_key, connect_timeout, idle_limit)

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
            raise self.errors.translate(error) from None

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
            raise self.errors.translate(error) from None
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
                if tools is None or not refuses_tools(error):
                    raise
                # A model without tool calls (Ollama's "does not support tools", vLLM without a tool
                # parser, a llama.cpp server without --jinja): asked again without them, and offered
                # none from now on. Nothing was streamed yet.
                logger.warning("model %s refused tools (%s); it is offered none from now on", model, error.status_code)
                self._without_tools.add(model)
                del body["tools"], body["tool_choice"]
                response = await self._post(body)
        except openai.OpenAIError as error:
            raise self.errors.translate(error) from None
        try:
            yield read_chunks(response, functools.partial(self.errors.translate, streaming=True), self.idle_limit)
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
            raise openai.APITimeoutError(request=named_request(self._chat_url)) from error
        except (aiohttp.ClientError, OSError) as error:
            raise openai.APIConnectionError(request=named_request(self._chat_url)) from error
        if response.status >= 400:
            raise await self._status_error(response, named_request(self._chat_url))
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

    async def aclose(self) -> None:
        await self.client.close()
        if self._session is not None:
            await self._session.close()


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

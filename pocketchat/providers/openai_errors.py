"""What goes wrong with an OpenAI-compatible provider, said plainly: the SDK's exceptions (and those
made as the SDK would make them) as ProviderErrors carrying the provider's own message and status, with
no key in them, and whether they may pass."""

import re
import traceback

import aiohttp
import openai

from pocketchat.errors import ProviderError

RETRYABLE_STATUSES = {408, 409, 425, 429, 500, 502, 503, 504}
# Keys look like sk-..., sk-or-v1-..., or-...; a provider may echo part of one back.
KEY_PATTERN = re.compile(r"\b(sk|or|key)-[A-Za-z0-9_\-*]{8,}")


class ErrorTranslator:
    """One provider's failures, as its people read them: its base URL named, its key never."""

    def __init__(self, base_url: str, api_key: str | None, connect_timeout: float, idle_limit: float) -> None:
        self.base_url = base_url
        self._api_key = api_key
        self.connect_timeout = connect_timeout
        self.idle_limit = idle_limit

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


def refuses_tools(error: openai.APIStatusError) -> bool:
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

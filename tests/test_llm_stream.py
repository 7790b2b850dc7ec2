"""`utils.llm_stream.stream_llm` against the fake provider over real HTTP: a stop ends the read and
closes the upstream; a cancellation from elsewhere (a shutdown, a takeover) is not taken for a stop."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from pocketchat.errors import ProviderError
from pocketchat.providers.openai_compatible import OpenAIProvider
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_protocol import wait_for
from utils.llm_stream import StopSignal, StreamRequest, StreamResult, stream_llm

MESSAGES = [{"role": "user", "content": "hi"}]


def stopping_after(count: int) -> tuple[StopSignal, list[str], Callable[[str, str | None], None]]:
    """A stop set at the `count`th chunk, the chunks' text as they come, and the `on_chunk` that does both."""
    stop, pieces = StopSignal(), []

    def on_chunk(content: str, reasoning: str | None) -> None:
        pieces.append(content)
        if len(pieces) == count:
            stop.set()

    return stop, pieces, on_chunk


async def read_until_stopped(fake: FakeOpenAI) -> tuple[StreamResult, list[str]]:
    """A paced reply, stopped after its third chunk."""
    provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=5)
    fake.queue(Reply(count=50, pace=0.05))
    stop, pieces, on_chunk = stopping_after(3)
    try:
        return await stream_llm(StreamRequest(provider, MESSAGES, "fake-model", None, on_chunk, stop)), pieces
    finally:
        await provider.aclose()


def test_a_stop_ends_the_read_at_once_and_the_provider_sees_its_connection_close(fake):
    result, pieces = asyncio.run(read_until_stopped(fake))
    assert result.stopped and result.finish_reason is None
    assert pieces == ["tok1 ", "tok2 ", "tok3 "]
    wait_for(lambda: fake.hangups == 1, timeout=2)
    assert fake.completed == 0


async def cancel_while_reading(fake: FakeOpenAI, also_stop: bool) -> BaseException | StreamResult:
    """Cancel the task that reads a paced reply; with `also_stop`, after a stop asked it to end, before
    it did (both cancellations pending at once)."""
    provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=5)
    fake.queue(Reply(count=50, pace=0.05))
    stop, started = StopSignal(), asyncio.Event()
    reading = asyncio.create_task(
        stream_llm(
            StreamRequest(provider, MESSAGES, "fake-model", None, lambda content, reasoning: started.set(), stop)
        )
    )
    await started.wait()
    if also_stop:
        stop.set()
        while not reading.cancelling():  # the stop's cancellation of the read is pending
            await asyncio.sleep(0)
    reading.cancel()
    try:
        return await reading
    except BaseException as error:
        return error
    finally:
        await provider.aclose()


@pytest.mark.parametrize("also_stop", [False, True], ids=["cancelled", "cancelled-and-stopped"])
def test_a_cancellation_from_elsewhere_is_not_taken_for_a_stop(fake, also_stop):
    outcome = asyncio.run(cancel_while_reading(fake, also_stop))
    assert isinstance(outcome, asyncio.CancelledError), outcome
    wait_for(lambda: fake.hangups == 1, timeout=2)


def test_a_stop_is_a_stop_even_after_an_earlier_cancellation_of_the_task_was_swallowed(fake):
    async def swallow_then_read() -> tuple[StreamResult, list[str]]:
        asyncio.current_task().cancel()  # someone else's cancellation, caught and never uncancelled
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)
        return await read_until_stopped(fake)

    result, pieces = asyncio.run(swallow_then_read())
    assert result.stopped and pieces == ["tok1 ", "tok2 ", "tok3 "]


async def next_await_cancelled() -> bool:
    """Whether the task's next await (a turn's save of its reply, after its read) is cancelled."""
    try:
        await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        return True
    return False


def test_a_stop_after_the_read_ended_does_not_cancel_what_the_task_does_next(fake):
    """A turn goes on after its read (the reply's save): a stop then must not cancel it."""

    async def read_then_stop() -> tuple[StreamResult, bool]:
        provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=5)
        fake.queue(Reply(count=3))
        stop = StopSignal()
        try:
            result = await stream_llm(
                StreamRequest(provider, MESSAGES, "fake-model", None, lambda content, reasoning: None, stop)
            )
        finally:
            await provider.aclose()
        stop.set()  # as a stop that comes while the turn saves its reply
        return result, await next_await_cancelled()

    result, cancelled = asyncio.run(read_then_stop())
    assert result.finish_reason == "stop" and not result.stopped
    assert not cancelled


class UnpausedProvider:
    """A provider whose chunks come without a pause (all in one network read)."""

    @contextlib.asynccontextmanager
    async def open_stream(self, messages, model, max_tokens, on_queued=None, **offer) -> AsyncIterator[Any]:
        async def chunks() -> AsyncIterator[dict[str, Any]]:
            yield {"choices": [{"delta": {"content": "a"}, "finish_reason": None}]}
            yield {"choices": [{"delta": {"content": "b"}, "finish_reason": "stop"}]}

        yield chunks()


def test_a_stop_set_from_within_the_read_at_its_last_chunk_does_not_cancel_what_the_task_does_next():
    async def read() -> tuple[StreamResult, bool]:
        stop, _, on_chunk = stopping_after(2)
        result = await stream_llm(StreamRequest(UnpausedProvider(), MESSAGES, "m", None, on_chunk, stop))
        return result, await next_await_cancelled()

    result, cancelled = asyncio.run(read())
    assert result.finish_reason == "stop" and not result.stopped  # the reply was whole when the stop came
    assert not cancelled


class CancelledQuietlyProvider:
    """A provider whose stream, cancelled, ends without raising, or raises `error` instead (some clients
    wrap their reads one way or the other)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    @contextlib.asynccontextmanager
    async def open_stream(self, messages, model, max_tokens, on_queued=None, **offer) -> AsyncIterator[Any]:
        async def chunks() -> AsyncIterator[dict[str, Any]]:
            try:
                for i in range(1, 51):
                    yield {"choices": [{"delta": {"content": f"tok{i} "}, "finish_reason": None}]}
                    await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                if self.error is not None:
                    raise self.error from None

        yield chunks()


def stopped_after_two_chunks(provider: CancelledQuietlyProvider) -> tuple[StreamResult | ProviderError, int]:
    """What stream_llm gave (its result, or the provider's error), and the cancellations then pending on
    the task, which goes on a moment after it as a turn would."""

    async def read() -> tuple[StreamResult | ProviderError, int]:
        stop, _, on_chunk = stopping_after(2)
        try:
            outcome: StreamResult | ProviderError = await stream_llm(
                StreamRequest(provider, MESSAGES, "m", None, on_chunk, stop)
            )
        except ProviderError as error:
            outcome = error
        await asyncio.sleep(0.05)  # no cancellation of the stop's is left to hit this
        return outcome, asyncio.current_task().cancelling()

    return asyncio.run(read())


def test_a_stop_whose_cancellation_the_provider_swallows_still_stops_and_leaves_no_cancellation_pending():
    result, cancelling = stopped_after_two_chunks(CancelledQuietlyProvider())
    assert isinstance(result, StreamResult) and result.stopped and cancelling == 0


def test_a_read_that_fails_as_the_stop_comes_keeps_its_error_and_leaves_no_cancellation_pending():
    failure, cancelling = stopped_after_two_chunks(CancelledQuietlyProvider(ProviderError("cut", kind="stream_cut")))
    assert isinstance(failure, ProviderError) and cancelling == 0

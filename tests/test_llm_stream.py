"""`utils.llm_stream.stream_llm` against the fake provider over real HTTP: a stop ends the read and
closes the upstream; a cancellation from elsewhere (a shutdown, a takeover) is not taken for a stop."""

import asyncio

import pytest

from pocketchat.providers.openai_compatible import OpenAIProvider
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_protocol import wait_for
from utils.llm_stream import StreamResult, stream_llm

MESSAGES = [{"role": "user", "content": "hi"}]


async def read_until_stopped(fake: FakeOpenAI) -> tuple[StreamResult, list[str]]:
    """A paced reply, stopped after its third chunk."""
    provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=5)
    fake.queue(Reply(count=50, pace=0.05))
    stop, pieces = asyncio.Event(), []

    def on_chunk(content: str, reasoning: str | None) -> None:
        pieces.append(content)
        if len(pieces) == 3:
            stop.set()

    try:
        return await stream_llm(provider, MESSAGES, "fake-model", None, on_chunk, stop), pieces
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
    stop, started = asyncio.Event(), asyncio.Event()
    reading = asyncio.create_task(
        stream_llm(provider, MESSAGES, "fake-model", None, lambda content, reasoning: started.set(), stop)
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

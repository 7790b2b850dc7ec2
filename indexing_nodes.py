"""The nodes of a document's indexing (`flow.create_indexing_flow`), PocketFlow's offline RAG: cut the
document into passages, embed them, store them. Each reads the shared store in `prep`, works in `exec`,
writes in `post`; the indexing's shared store is `pocketchat.documents.Library.new_shared`'s (the document,
its pages, the embedder, the jobs and a `report` of its progress). The chat turn's nodes are in nodes.py.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pocketflow import AsyncNode

from pocketchat.jobs import Jobs
from pocketchat.records import DocumentRecord
from pocketchat.store import NotIndexing, Store
from utils.chunking import Chunk, chunk_pages
from utils.embeddings import Embedder, to_bytes
from utils.read_document import Page


@dataclass
class ChunkRequest:
    jobs: Jobs
    owner: str
    pages: list[Page]


class ChunkDocument(AsyncNode):
    """Cut the document's pages into passages of a few sentences, each on one page: in a job worker, as
    the time it takes is the user's file's to set."""

    async def prep_async(self, shared: dict[str, Any]) -> ChunkRequest:
        return ChunkRequest(shared["jobs"], shared["document"].owner, shared["pages"])

    async def exec_async(self, request: ChunkRequest) -> list[Chunk]:
        return await request.jobs.run(request.owner, chunk_pages, request.pages)

    async def post_async(self, shared: dict[str, Any], request: ChunkRequest, chunks: list[Chunk]) -> None:
        shared["chunks"] = chunks
        shared["report"](0.01)


@dataclass
class EmbedRequest:
    embedder: Embedder
    texts: list[str]
    report: Callable[[float], None]


EMBED_BATCH = 16  # passages a call: the progress moves every few tenths of a second


class EmbedChunks(AsyncNode):
    """A vector for each passage, in batches, telling how far it went after each batch (a level: a
    retry that repeats a batch tells the same level again, and shows nothing twice)."""

    async def prep_async(self, shared: dict[str, Any]) -> EmbedRequest:
        return EmbedRequest(shared["embedder"], [chunk.text for chunk in shared["chunks"]], shared["report"])

    async def exec_async(self, request: EmbedRequest) -> np.ndarray:
        batches = []
        for start in range(0, len(request.texts), EMBED_BATCH):
            batches.append(await request.embedder.embed(request.texts[start : start + EMBED_BATCH]))
            request.report(0.01 + 0.95 * min(start + EMBED_BATCH, len(request.texts)) / len(request.texts))
        return np.concatenate(batches)

    async def post_async(self, shared: dict[str, Any], request: EmbedRequest, vectors: np.ndarray) -> None:
        shared["vectors"] = vectors


STORE_BATCH = 500  # passages a write: a big document does not hold the database's writer long


class StoreChunks(AsyncNode):
    """Store the passages with their vectors, then mark the document ready: until then retrieval does
    not see them, so a document cut short is never half-searched."""

    async def prep_async(self, shared: dict[str, Any]) -> tuple[list[Chunk], np.ndarray]:
        return shared["chunks"], shared["vectors"]

    async def exec_async(self, inputs: tuple[list[Chunk], np.ndarray]) -> list[tuple[int, int | None, str, bytes]]:
        chunks, vectors = inputs
        return [
            (seq, chunk.page, chunk.text, to_bytes(vector))
            for seq, (chunk, vector) in enumerate(zip(chunks, vectors, strict=True))
        ]

    async def post_async(
        self,
        shared: dict[str, Any],
        inputs: tuple[list[Chunk], np.ndarray],
        rows: list[tuple[int, int | None, str, bytes]],
    ) -> None:
        store: Store = shared["store"]
        document: DocumentRecord = shared["document"]
        # Each write lands only while the document is still indexing: one refused (removed meanwhile, or
        # marked failed by another replica, which deleted the passages written so far) stops here.
        for start in range(0, len(rows), STORE_BATCH):
            if not await store.add_chunks(document, rows[start : start + STORE_BATCH]):
                raise NotIndexing(document.id)
        document.status, document.progress, document.chunks = "ready", 1.0, len(rows)
        if not await store.finish_document(document):
            raise NotIndexing(document.id)

"""Finding the passages that answer a question: by meaning (exact cosine over the conversation's
passage vectors) and by words (the database's full-text index), fused by weighted reciprocal rank."""

import re
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Protocol, TypeVar

import numpy as np

from pocketchat.records import DocumentRecord, Passage
from utils.embeddings import Embedder, from_bytes

K = TypeVar("K", bound=Hashable)
RRF_K = 60  # reciprocal rank fusion's constant: how much the top ranks outweigh the rest
VECTOR_WEIGHT = 1.0  # meaning finds paraphrases, which words miss; so it weighs more
TEXT_WEIGHT = 0.6
CANDIDATES = 50  # passages each way considers before fusion
PASSAGE_TOKENS = 175  # a passage is at most about 700 characters (utils/chunking.py)
# Words that match nearly every passage: left out of the full-text query.
_STOPWORDS = (
    "a about above after again against all am an and any are as at be because been before being below between "
    "both but by can could did do does doing down during each few for from further had has have having he her "
    "here hers him his how i if in into is it its itself just me more most my no nor not now of off on once only "
    "or other our ours out over own same she should so some such than that the their theirs them then there "
    "these they this those through to too under until up very was we were what when where which while who whom "
    "why will with would you your yours tell explain describe please does say said"
)
STOPWORDS = frozenset(_STOPWORDS.split())
WORD = re.compile(r"[^\W_]+", re.UNICODE)


def search_terms(question: str, most: int = 32) -> list[str]:
    """The words of a question worth a full-text search (any of them may match), lower case, once each."""
    seen: dict[str, None] = {}
    for word in WORD.findall(question.lower()):
        if word not in STOPWORDS and (len(word) > 1 or word.isdigit()):
            seen.setdefault(word[:64], None)
    return list(seen)[:most]


def nearest(question: np.ndarray, vectors: np.ndarray, most: int = CANDIDATES) -> list[int]:
    """The rows of `vectors` nearest `question` by cosine (all are L2-normalised), best first."""
    if len(vectors) == 0 or vectors.shape[1] != question.shape[-1]:
        return []
    scores = vectors @ question.reshape(-1)
    if len(scores) > most:
        top = np.argpartition(-scores, most)[:most]
        return [int(i) for i in top[np.argsort(-scores[top])]]
    return [int(i) for i in np.argsort(-scores)]


def fuse(rankings: Sequence[tuple[Sequence[K], float]], k: int = RRF_K) -> list[K]:
    """Weighted reciprocal rank fusion: each ranking adds weight / (k + rank) to the items it ranks."""
    scores: dict[K, float] = {}
    for ranking, weight in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    return sorted(scores, key=lambda item: -scores[item])


class PassageStore(Protocol):
    """What retrieval reads of the database (both stores have it)."""

    async def document_vectors(self, document_id: str) -> tuple[list[int], list[bytes]]: ...

    async def search_passages(self, document_ids: list[str], terms: list[str], most: int) -> list[int]: ...

    async def passages(self, owner: str, ids: list[int]) -> list[Passage]: ...


class VectorCache:
    """The passage vectors of ready documents, kept in memory (they never change once a document is
    ready): a question reads no vector from the database after the first one. Bounded in bytes; the
    documents asked for least recently go first."""

    def __init__(self, store: PassageStore, max_bytes: int = 256 * 2**20) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, tuple[list[int], np.ndarray]] = OrderedDict()
        self._bytes = 0

    async def get(self, document_id: str) -> tuple[list[int], np.ndarray]:
        if (kept := self._kept.get(document_id)) is not None:
            self._kept.move_to_end(document_id)
            return kept
        ids, blobs = await self.store.document_vectors(document_id)
        kept = ids, from_bytes(blobs)
        if kept[1].nbytes <= self.max_bytes and document_id not in self._kept:
            self._kept[document_id] = kept
            self._bytes += kept[1].nbytes
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._kept.popitem(last=False)
                self._bytes -= dropped.nbytes
        return kept

    async def all_ids(self, document_ids: list[str]) -> list[int]:
        """Every passage of these documents, in document order."""
        return [passage for document_id in document_ids for passage in (await self.get(document_id))[0]]


async def retrieve(
    store: PassageStore,
    vectors: VectorCache,
    embedder: Embedder,
    documents: list[DocumentRecord],
    owner: str,
    question: str,
    most: int,
) -> list[Passage]:
    """The `most` passages of `documents` that best answer `question`: by meaning and by words, fused.
    Documents embedded by another model than `embedder` are searched by words only."""
    by_meaning: list[int] = []
    comparable = [document.id for document in documents if document.embedder == embedder.name]
    if comparable:
        query = (await embedder.embed([question], question=True))[0]
        kept = [await vectors.get(document_id) for document_id in comparable]
        ids = [passage for passage_ids, _ in kept for passage in passage_ids]
        matrix = np.concatenate([matrix for _, matrix in kept]) if kept else np.zeros((0, 0), np.float32)
        by_meaning = [ids[row] for row in nearest(query, matrix)]
    terms = search_terms(question)
    by_words = await store.search_passages([document.id for document in documents], terms, CANDIDATES)
    best = fuse([(by_meaning, VECTOR_WEIGHT), (by_words, TEXT_WEIGHT)])[:most]
    found = {passage.id: passage for passage in await store.passages(owner, best)}
    return [found[passage_id] for passage_id in best if passage_id in found]


async def passages_for(
    store: PassageStore,
    vectors: VectorCache,
    embedder: Embedder,
    documents: list[DocumentRecord],
    owner: str,
    question: str,
    budget: int,
    most: int,
) -> list[Passage]:
    """The passages of `documents` a reply gets: all of them, in order, when they fit `budget` tokens
    (nothing to embed or search); else the `most` that best answer `question`."""
    if sum(document.chunks for document in documents) * PASSAGE_TOKENS <= budget:
        whole = await vectors.all_ids([document.id for document in documents])
        found = {passage.id: passage for passage in await store.passages(owner, whole)}
        return [found[passage_id] for passage_id in whole if passage_id in found]
    return await retrieve(store, vectors, embedder, documents, owner, question, most)

"""Retrieval quality on the labelled set (tests/retrieval_set/): the real model, the real indexing flow,
SQLite's full-text index. The bench (bench/retrieval.py) reports all three figures; this holds the
hybrid one, the app's, to its target."""

import asyncio

from bench.retrieval import index_set, open_library, recall_at_5


def test_hybrid_retrieval_finds_the_answer_in_its_top_5_passages_for_nine_questions_in_ten(tmp_path):
    async def measure() -> dict[str, float]:
        store, library, record = await open_library(tmp_path / "set.db")
        try:
            return await recall_at_5(store, library, await index_set(store, library, record))
        finally:
            await library.aclose()
            await store.close()

    recall = asyncio.run(measure())
    assert recall["hybrid"] >= 0.9, recall
    assert recall["hybrid"] >= recall["text"], recall  # fusing with vectors loses nothing words found

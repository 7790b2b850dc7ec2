"""The turn log: positions are seqs, and following after a seq loses and repeats nothing."""

import asyncio
import json

from pocketchat.turn_log import InProcessTurnLog


def test_following_after_a_seq_gives_exactly_what_came_after_that_chunk():
    async def scenario():
        log = InProcessTurnLog("t1")
        log.append({"type": "turn_start"})
        assert [log.append_chunk(text) for text in ("a", "b")] == [1, 2]
        log.append({"type": "conversation"})  # a frame between chunk 2 and chunk 3
        log.append_chunk("c")
        log.append({"type": "turn_end"})
        log.close()
        return [
            [json.loads(t)["type"] + str(json.loads(t).get("seq", "")) async for t in log.follow(n)] for n in (0, 2, 3)
        ]

    everything, after_two, after_three = asyncio.run(scenario())
    assert everything == ["turn_start", "chunk1", "chunk2", "conversation", "chunk3", "turn_end"]
    assert after_two == ["conversation", "chunk3", "turn_end"]
    assert after_three == ["turn_end"]


def test_a_follower_waits_for_new_entries_until_the_log_closes():
    async def scenario():
        log = InProcessTurnLog("t2")
        seen = []

        async def follow():
            async for text in log.follow(0):
                seen.append(json.loads(text)["seq"])

        follower = asyncio.create_task(follow())
        for text in "xyz":
            await asyncio.sleep(0)
            log.append_chunk(text)
        log.close()
        await asyncio.wait_for(follower, 1)
        return seen, log.snapshot()

    seen, snapshot = asyncio.run(scenario())
    assert seen == [1, 2, 3]
    assert snapshot == {"turn_id": "t2", "seq": 3, "content": "xyz", "reasoning": "", "steps": []}


def test_steps_are_ordered_with_the_chunks_snapshotted_and_mirrored():
    async def scenario():
        log = InProcessTurnLog("t3")
        log.append_chunk("a")
        log.append_step("Search", "sources", [{"source": "notes.md"}])
        log.append_chunk("b")
        produced = [text async for text in _closed(log).follow(0)]
        mirror = InProcessTurnLog("t3")
        for key, text in zip(log._keys, log._entries, strict=True):
            mirror.add_entry(key, text)
        return produced, log.snapshot(), mirror.snapshot()

    produced, snapshot, mirrored = asyncio.run(scenario())
    kinds = [json.loads(text)["type"] for text in produced]
    assert kinds == ["chunk", "step", "chunk"]
    assert (
        snapshot["steps"]
        == mirrored["steps"]
        == [{"node": "Search", "kind": "sources", "data": [{"source": "notes.md"}]}]
    )


def _closed(log):
    log.close()
    return log

"""The turn log: positions are seqs, and following after a seq loses and repeats nothing."""

import asyncio
import json

from pocketchat import protocol
from pocketchat.turn_log import MAX_JOINED, InProcessTurnLog


def test_following_after_a_seq_gives_exactly_what_came_after_that_chunk():
    async def scenario():
        log = InProcessTurnLog("t1")
        log.append({"type": "turn_start"})
        assert [log.append_chunk(text) for text in ("a", "b")] == [1, 2]
        log.append({"type": "conversation"})  # a frame between chunk 2 and chunk 3
        log.append_chunk("c")
        log.append({"type": "turn_end"})
        log.close()
        return [[label(text) async for text in log.follow(n)] for n in (0, 1, 2, 3)]

    everything, after_one, after_two, after_three = asyncio.run(scenario())
    # Chunks 1 and 2, both waiting, go in one frame.
    assert everything == ["turn_start", "chunk1-2", "conversation", "chunk3", "turn_end"]
    assert after_one == ["chunk2", "conversation", "chunk3", "turn_end"]
    assert after_two == ["conversation", "chunk3", "turn_end"]
    assert after_three == ["turn_end"]


def label(text: str) -> str:
    """A frame's type and the seqs it carries: `chunk4`, or `chunk1-3` for a frame that carries several."""
    frame = json.loads(text)
    seqs = f"{frame['first_seq']}-{frame['seq']}" if "first_seq" in frame else str(frame.get("seq", ""))
    return frame["type"] + seqs


def test_a_follower_finding_chunks_waiting_gets_them_in_one_frame_up_to_a_bound_and_never_across_a_step():
    async def scenario():
        log = InProcessTurnLog("t3")
        for i in range(MAX_JOINED + 3):
            log.append_chunk(f"c{i} ", "why" if i == 1 else None)
        log.append_step("N", "status", "thinking")
        log.append_chunk("end")
        log.close()
        return [json.loads(text) async for text in log.follow(0)]

    frames = asyncio.run(scenario())
    last = MAX_JOINED + 3
    assert [label(protocol.encode(frame)) for frame in frames] == [
        f"chunk1-{MAX_JOINED}",
        f"chunk{MAX_JOINED + 1}-{last}",
        "step",
        f"chunk{last + 1}",
    ]
    assert "".join(f.get("content", "") for f in frames) == "".join(f"c{i} " for i in range(last)) + "end"
    assert frames[0]["reasoning"] == "why" and "reasoning" not in frames[1]


def test_a_mirror_sends_chunks_one_by_one_as_they_came():
    async def scenario():
        mirror = InProcessTurnLog("t4")
        for seq in (1, 2, 3):
            mirror.add_entry((seq, 0), protocol.encode(protocol.chunk("t4", seq, str(seq))))
        mirror.close()
        return [label(text) async for text in mirror.follow(0)]

    assert asyncio.run(scenario()) == ["chunk1", "chunk2", "chunk3"]


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


def test_a_cut_while_a_follower_sends_goes_on_from_the_cut_and_sends_the_new_end_once():
    # A produced log whose turn was taken over drops its entries after the copied ones and ends as the
    # taker ended it, while a follower is sending a frame: the follower goes on from the cut.
    async def scenario():
        log = InProcessTurnLog("t5")
        log.append({"type": "turn_start"})
        for text in "abcde":
            log.append_chunk(text)
        log.append_step("N", "status", "one")
        log.append_step("N", "status", "two")
        seen = []
        async for text in log.follow(0):
            seen.append(label(text))
            if seen[-1] == "chunk1-5":
                log._cut(3)  # turn_start, chunks 1 and 2 were copied; the rest is dropped
                log.append({"type": "error"})
                log.append({"type": "turn_end"})
                log.close()
        return seen

    async def past_the_cut():
        log = InProcessTurnLog("t6")
        log.append({"type": "turn_start"})
        seen = []
        async for text in log.follow(0):
            seen.append(label(text))
            if len(seen) < 4:
                log.append_chunk("x")  # one at a time: this follower sends chunks 1 to 3 alone
            elif len(seen) == 4:
                log._cut(3)  # chunk 3 was not copied: this follower is past the cut
                log.append({"type": "error"})
                log.append({"type": "turn_end"})
                log.close()
        return seen

    assert asyncio.run(scenario()) == ["turn_start", "chunk1-5", "error", "turn_end"]
    assert asyncio.run(past_the_cut()) == ["turn_start", "chunk1", "chunk2", "chunk3", "error", "turn_end"]


def test_a_follower_that_leaves_while_it_waits_is_not_kept():
    async def scenario():
        log = InProcessTurnLog("t7")

        async def follow():
            async for _ in log.follow(0):
                pass

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0)
        waiting = len(log._waiters)
        follower.cancel()  # its socket left the conversation
        await asyncio.gather(follower, return_exceptions=True)
        return waiting, len(log._waiters)

    assert asyncio.run(scenario()) == (1, 0)


def test_a_step_of_the_same_node_and_id_replaces_the_earlier_one_in_the_reply_here_and_in_a_mirror():
    """A progress bar that moves: every frame goes to the followers, the reply keeps the last."""
    from pocketchat.steps import Button

    log, mirror = InProcessTurnLog("t9"), InProcessTurnLog("t9")
    log.append_step("Index", "progress", {"value": 0.1}, shape="progress", step_id="bar")
    log.append_chunk("Hello ")
    log.append_step("Note", "aside", "by the way", shape="text", display="inline")
    log.append_step("Index", "progress", {"value": 0.9}, shape="progress", step_id="bar")
    log.append_step("Other", "progress", {"value": 0.5}, shape="progress", step_id="bar")  # another node's
    buttons = [Button("yes", "Yes"), Button("more", "Tell me more", send="Tell me more")]
    log.append_step("Ask", "question", "Go on?", shape="text", display="below", step_id="ask", buttons=buttons)
    for key, text in zip(log._keys, log._entries, strict=True):
        mirror.add_entry(key, text)
    for kept in (log.snapshot()["steps"], mirror.snapshot()["steps"]):
        assert [(step["node"], step["data"]) for step in kept] == [
            ("Index", {"value": 0.9}),
            ("Note", "by the way"),
            ("Other", {"value": 0.5}),
            ("Ask", "Go on?"),
        ]
        assert kept[1]["at"] == len("Hello ") and kept[1]["display"] == "inline"
        assert kept[3]["buttons"] == [
            {"id": "yes", "label": "Yes"},
            {"id": "more", "label": "Tell me more", "send": "Tell me more"},
        ]


def test_a_step_a_page_cannot_draw_is_a_bug_said_where_it_is_made():
    import pytest

    from pocketchat.steps import Button

    log = InProcessTurnLog("t10")
    with pytest.raises(ValueError, match="not a step shape"):
        log.append_step("N", "k", 1, shape="hologram")
    with pytest.raises(ValueError, match="not a step display"):
        log.append_step("N", "k", 1, display="sideways")
    with pytest.raises(ValueError, match="needs an id"):
        log.append_step("N", "k", 1, buttons=[Button("a", "A")])
    with pytest.raises(ValueError, match="an id of its own"):
        log.append_step("N", "k", 1, step_id="s", buttons=[Button("a", "A"), Button("a", "B")])
    assert log.snapshot()["steps"] == []

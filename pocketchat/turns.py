"""Running a turn: the flow around the nodes, from the turn's opening write to its `turn_end`."""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from flow import FLOWS
from pocketchat import protocol
from pocketchat.conversations import Conversation, Turn, TurnIds
from pocketchat.errors import ProtocolError
from pocketchat.state import AppState
from pocketchat.store import Store, save_reply

logger = logging.getLogger("pocketchat")
CHECKPOINT_SECONDS = 2.0


async def begin_turn(state: AppState, conversation: Conversation, begin: Callable[[TurnIds], Turn], user: str) -> None:
    """Claim a turn (the user's limits, and with replicas the conversation cluster-wide), begin it in
    the conversation, and run it."""
    ids = TurnIds()
    taken = await state.coordinator.claim(conversation, ids, user)
    try:
        turn = begin(ids)
    except Exception:
        await state.coordinator.release_claim(conversation, taken)
        raise
    lease = taken.lease.value if taken.lease is not None else ""
    turn.task = asyncio.create_task(run_turn(state, conversation, turn, lease))


def new_shared(state: AppState, conversation: Conversation, turn: Turn) -> dict[str, Any]:
    """The shared store a turn's flow runs on: what the nodes read, and where they write."""
    return {
        "settings": state.settings,  # Settings: the flow's options
        "conversation": conversation,  # Conversation: .record (title, model, system prompt), .history
        "turn": turn,  # Turn: .id, .user_message, .reply (the Message being written), .stop
        "log": turn.log,  # TurnLog: what the page sees (chunks, steps), followed by every socket
        "provider": state.provider,  # ChatProvider: the model
        "store": state.store,  # Store: the database
        "documents": state.documents,  # Library: the conversation's documents' embedding model and vectors
        "context": [],  # list[Snippet]: what earlier nodes found for the prompt, with their sources
        "prompt": None,  # list[dict]: the messages BuildPrompt made, which StreamChat sends
    }


async def run_turn(state: AppState, conversation: Conversation, turn: Turn, lease: str = "") -> None:
    """Run the flow for one turn, then close its log with `turn_end`, whatever happened."""
    shared = new_shared(state, conversation, turn)
    # The user message and an empty reply marked `streaming` are queued for the database first, so a
    # crash leaves a turn that start-up marks interrupted. Waiting for that write would delay the
    # first chunk under load; every later write of the turn is queued after it anyway, and the turn's
    # end waits (for a bounded time) for its last write only. The store logs a write that fails.
    state.hub.open_turn(conversation, turn)
    checkpoints = asyncio.create_task(checkpoint_reply(state.store, conversation.id, turn))
    try:
        await state.coordinator.started(conversation, turn, lease)
        await FLOWS[state.settings.flow](state.settings).run_async(shared)
        if turn.failure is not None:
            await fail_turn(state, conversation, turn, turn.failure)
    except Exception:
        logger.exception("turn %s failed", turn.id)
        await fail_turn(state, conversation, turn, "PocketChat failed while writing this reply; see the server log.")
    finally:
        checkpoints.cancel()
        reply = turn.reply
        stats = {k: reply.meta.get(k) for k in ("model", "usage", "ttft_ms", "tokens_per_second")}
        # Counted out before its end is seen: the user's next message must not find it still running.
        await state.limits.turn_ended(conversation.record.owner)
        state.metrics.turn_ended(turn)
        turn.log.append(protocol.turn_end(turn.id, reply.status, reply.id, stats))
        conversation.end(turn)  # over here at once: a hello now gets it as history, not as running
        await state.coordinator.finished(conversation, turn)  # and elsewhere once its end is copied
        state.hub.release(conversation)
        logger.info(
            "turn %s conversation %s… status=%s chunks=%d ttft_ms=%s duration_ms=%d usage=%s",
            turn.id,
            conversation.id[:6],
            reply.status,
            turn.log.seq,
            stats["ttft_ms"],
            (time.monotonic() - turn.started_at) * 1000,
            (stats["usage"] or {}).get("completion_tokens"),
        )


async def fail_turn(state: AppState, conversation: Conversation, turn: Turn, why: str) -> None:
    """Record a turn cut short (by a bug, or Redis lost), keeping what streamed, and tell the client."""
    if turn.fenced:
        # Another replica ended it and stored it; its log here already ends as it does there.
        if not any(message is turn.reply for message in conversation.history):
            conversation.history.append(turn.reply_taken_over())
        return
    turn.reply_so_far()
    turn.reply.status, turn.reply.error = "error", why
    if not any(message is turn.reply for message in conversation.history):
        conversation.history.append(turn.reply)
    turn.log.append(protocol.error(ProtocolError(turn.reply.error, turn.id)))
    try:
        # Bounded: turn_end does not wait on a database that does not answer; the write lands later.
        await save_reply(state.store, conversation.id, turn.reply)
    except TimeoutError:
        logger.warning("turn %s: its failed reply is not saved yet; it will be when the database answers", turn.id)
    except Exception:
        logger.exception("could not record failed turn %s", turn.id)


async def checkpoint_reply(store: Store, conversation_id: str, turn: Turn) -> None:
    """Save the reply so far every few seconds, so that a crash loses little of it."""
    saved_seq = 0
    while True:
        await asyncio.sleep(CHECKPOINT_SECONDS)
        if turn.log.seq != saved_seq and turn.reply.status == "streaming" and not turn.fenced:
            saved_seq = turn.log.seq
            store.checkpoint(conversation_id, turn.reply_so_far())

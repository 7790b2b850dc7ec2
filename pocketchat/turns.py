"""Running a turn: the flow around the nodes, from the turn's opening write to its `turn_end`."""

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pocketchat import protocol
from pocketchat.conversations import Conversation, Turn, TurnIds
from pocketchat.errors import ProtocolError, StorageError, Unavailable
from pocketchat.state import AppState
from pocketchat.store import SAVE_WAIT_SECONDS, Store, save_reply
from pocketchat.tools.client import ClientTools
from utils.usage import TurnUsage

logger = logging.getLogger("pocketchat")
CHECKPOINT_SECONDS = 2.0
# A turn's end waits this long at most for its count-out of the user's limits (in Redis, with
# replicas): a stalled Redis would hold turn_end back for its timeouts, 15 s; the count-out then
# finishes after the end.
COUNT_OUT_SECONDS = 1.0
_lingering: set[asyncio.Future[None]] = set()  # steps of turns' ends that outlasted their wait: kept referenced


async def begin_turn(
    state: AppState,
    conversation: Conversation,
    begin: Callable[[TurnIds], Turn],
    user: str,
    client_tools: ClientTools | None = None,
) -> None:
    """Claim a turn (the user's limits, and with replicas the conversation cluster-wide), begin it in
    the conversation, and run it; `client_tools` are those the socket that asked declared."""
    ids = TurnIds()
    taken = await state.coordinator.claim(conversation, ids, user)
    try:
        turn = begin(ids)
    except Exception:
        await state.coordinator.release_claim(conversation, taken)
        raise
    turn.client_tools = client_tools
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
        "library": state.documents,  # Library: the conversation's documents' embedding model and vectors
        "context": [],  # list[Snippet]: what earlier nodes found for the prompt, with their sources
        "images": {},  # dict[str, str]: the images ReadImages read for the prompt, data URLs by id
        "prompt": None,  # list[dict]: the messages BuildPrompt made, which StreamChat sends (and tools extend)
        # ToolBox: the tools the model may call (those the conversation has on, and its client's)
        "tools": state.tools.for_turn(conversation.record, turn.id, turn.client_tools),
        "tool_calls": [],  # list[ToolCall]: what the model asked to call (StreamChat writes, RunTools runs)
        "tool_steps": 0,  # rounds of tool calls so far: at --max-tool-steps the model answers without tools
        "usage": TurnUsage(),  # what the model's steps add up to: the reply's usage and timings
    }


async def run_turn(state: AppState, conversation: Conversation, turn: Turn, lease: str = "") -> None:
    """Run the flow for one turn, then close its log with `turn_end`, whatever happened."""
    shared = new_shared(state, conversation, turn)
    # The user message and an empty reply marked `streaming` are queued for the database first, so a
    # crash leaves a turn that start-up marks interrupted. Waiting for that write would delay the
    # first chunk under load; every later write of the turn is queued after it anyway, and the turn's
    # end waits (for a bounded time) for its last write only. The store logs a write that fails.
    opened = state.hub.open_turn(conversation, turn)
    if turn.image_copies:
        # An edited message's images are read for the model by their copies' ids: once the copies are
        # stored (a database that refuses or stalls costs the model the images, not the turn).
        with contextlib.suppress(StorageError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(opened), SAVE_WAIT_SECONDS)
    checkpoints = Checkpoints(state.store, conversation.id, turn)
    try:
        await state.coordinator.started(conversation, turn, lease)
        await state.flow_for(conversation.record).run_async(shared)
        if turn.failure is not None:
            # Redis lost, or the turn taken over: a service failed, not PocketChat.
            await fail_turn(state, conversation, turn, turn.failure, Unavailable)
    except Exception:
        logger.exception("turn %s failed", turn.id)
        await fail_turn(state, conversation, turn, "PocketChat failed while writing this reply; see the server log.")
    finally:
        checkpoints.cancel()
        reply = turn.reply
        stats = {k: reply.meta.get(k) for k in ("model", "usage", "ttft_ms", "tokens_per_second")}
        # Counted out before its end is seen: the user's next message must not find it still running.
        # Neither this nor telling the other replicas may keep turn_end from this replica's sockets.
        count_out = state.limits.turn_ended(conversation.record.owner)
        await _despite_failure(count_out, "count out turn", turn, wait=COUNT_OUT_SECONDS)
        state.metrics.turn_ended(turn)
        turn.log.append(protocol.turn_end(turn.id, reply.status, reply.id, stats))
        conversation.end(turn)  # over here at once: a hello now gets it as history, not as running
        await _despite_failure(state.coordinator.finished(conversation, turn), "copy the end of turn", turn)
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


async def _despite_failure(step: Awaitable[None], what: str, turn: Turn, wait: float | None = None) -> None:
    """A step of a turn's end that may fail (it asks Redis, with replicas) without stopping the rest;
    waited for `wait` seconds at most, if given: it goes on after that, and its failure is logged."""
    if wait is None:
        try:
            await step  # begun at once, in this task: what it does first happens before anything else
        except Exception:
            logger.exception("could not %s %s", what, turn.id)
        return
    task = asyncio.ensure_future(step)

    def failed(done: asyncio.Future[None]) -> None:
        if not done.cancelled() and (error := done.exception()) is not None:
            logger.error("could not %s %s", what, turn.id, exc_info=error)

    task.add_done_callback(failed)
    await asyncio.wait({task}, timeout=wait)  # a wait that ends does not cancel the step
    if not task.done():
        logger.warning("turn %s: could not %s in %g s; it ends meanwhile", turn.id, what, wait)
        _lingering.add(task)
        task.add_done_callback(_lingering.discard)


async def fail_turn(
    state: AppState, conversation: Conversation, turn: Turn, why: str, kind: type[ProtocolError] = ProtocolError
) -> None:
    """Record a turn cut short, keeping what streamed, and tell the client: `kind` says by what (by
    default a bug in PocketChat; `Unavailable` for Redis lost)."""
    if not await turn.log.confirm():
        # Another replica took it over and stored it; its log here already ends as it does there.
        if not any(message is turn.reply for message in conversation.history):
            conversation.add_reply(turn.reply_taken_over())
        return
    turn.sync_reply()
    turn.reply.status, turn.reply.error = "error", why
    conversation.add_reply(turn.reply)
    turn.log.append(protocol.error(kind(turn.reply.error, turn.id)))
    try:
        # Bounded: turn_end does not wait on a database that does not answer; the write lands later.
        await save_reply(state.store, conversation.id, turn.reply)
    except TimeoutError:
        logger.warning("turn %s: its failed reply is not saved yet; it will be when the database answers", turn.id)
    except Exception:
        logger.exception("could not record failed turn %s", turn.id)


class Checkpoints:
    """Save the reply so far every few seconds, so that a crash loses little of it. A timer rather
    than a task: most turns end before the first one, and a task per turn costs the turn's start."""

    def __init__(self, store: Store, conversation_id: str, turn: Turn) -> None:
        self.store, self.conversation_id, self.turn = store, conversation_id, turn
        self._saved_size = 0
        self._timer = asyncio.get_running_loop().call_later(CHECKPOINT_SECONDS, self._save)

    def _save(self) -> None:
        turn = self.turn
        # Whenever the log grew, not only by chunks: a tool call sends no chunk while it runs, and its
        # steps are the reply's too.
        if turn.log.size != self._saved_size and turn.reply.status == "streaming" and not turn.fenced:
            self._saved_size = turn.log.size
            self.store.checkpoint(self.conversation_id, turn.sync_reply())
        self._timer = asyncio.get_running_loop().call_later(CHECKPOINT_SECONDS, self._save)

    def cancel(self) -> None:
        self._timer.cancel()

"""The nodes of the memory flow (flow.py's `create_memory_flow`): the chat flow, with a memory of the user
across conversations. Before the model, RecallFacts puts the remembered facts that bear on the user's message
into the prompt; after a complete reply, RememberFacts asks the model which durable facts about the user their
message states, and keeps the new ones. Each shows a step when a fact is used or added. The facts are their
owner's alone (every statement names the owner), seen, edited, exported and forgotten in the page's Memory
dialog (pocketchat/web/memory.py); a user who turns memory off has none read or kept (docs/memory.md)."""

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from pocketflow import AsyncNode

from pocketchat.presses import Press
from pocketchat.steps import Button
from pocketchat.store import Store
from pocketchat.store.memory import MOST_FACTS, Fact
from utils.embeddings import Embedder, from_bytes, to_bytes
from utils.llm_stream import ChatProvider, StopSignal
from utils.memory import new_facts, propose_facts, recalled, with_facts

logger = logging.getLogger("pocketchat")
FACT_STEP = "fact-"  # a kept fact's step id is this and the fact's id: its Forget button names it
MEMORY_SECONDS = 20.0  # the turn ends when its last node does: a memory is not worth a longer wait
WRITE_SECONDS = 10.0  # for the facts' write, while the database answers slowly


async def vectors_of(facts: list[Fact], embedder: Embedder) -> np.ndarray:
    """The facts' vectors, one row each. If another embedding model made some (the server's changed since),
    theirs are not comparable: all are made again, here, from their texts (a user has a few hundred at most)."""
    if all(fact.embedder == embedder.name for fact in facts):
        return from_bytes([fact.vector for fact in facts])
    return await embedder.embed([fact.text for fact in facts], question=True)


@dataclass
class Recall:
    store: Store
    embedder: Embedder
    owner: str
    question: str


@dataclass
class Recalled:
    facts: list[str]
    failure: str | None = None  # why the memory could not be read


class RecallFacts(AsyncNode):
    """Before the model, after BuildPrompt: the user's facts most like their message (cosine over the facts'
    vectors, five at most, only those alike enough) join the prompt's system message, and a step says which."""

    async def prep_async(self, shared: dict[str, Any]) -> Recall:
        owner = shared["conversation"].record.owner
        return Recall(shared["store"], shared["library"].embedder, owner, shared["turn"].user_message.content)

    async def exec_async(self, recall: Recall) -> Recalled:
        memory = await recall.store.read_memory(recall.owner)
        if not memory.facts or not recall.question.strip():
            return Recalled([])  # off, or nothing remembered yet: no model is loaded
        question = (await recall.embedder.embed([recall.question], question=True))[0]
        rows = recalled(question, await vectors_of(memory.facts, recall.embedder))
        return Recalled([memory.facts[row].text for row in rows])

    async def exec_fallback_async(self, recall: Recall, exc: Exception) -> Recalled:
        # The reply goes on without its memory rather than failing; a step says so.
        logger.warning("the memory could not be read (%s): the reply goes on without it", type(exc).__name__)
        return Recalled([], f"Your memory could not be read ({exc}); this reply does not use it.")

    async def post_async(self, shared: dict[str, Any], recall: Recall, found: Recalled) -> None:
        if found.failure:
            shared["log"].append_step("RecallFacts", "status", found.failure, shape="text")
        if not found.facts:
            return
        system, *rest = shared["prompt"]
        shared["prompt"] = [{**system, "content": with_facts(system["content"], found.facts)}, *rest]
        used = "\n".join(f"• {fact}" for fact in found.facts)
        shared["log"].append_step("RecallFacts", "recalled", f"From memory:\n{used}", shape="text")


@dataclass
class Proposal:
    provider: ChatProvider
    model: str
    message: str  # the user's, which started the turn
    stop: StopSignal
    store: Store
    embedder: Embedder
    owner: str


class RememberFacts(AsyncNode):
    """After a complete reply: ask the model which durable facts about the user their message states (three
    at most), keep those not known yet, with their vectors, and show each as a step under the reply with a
    Forget button (`on_press` deletes it). A regenerated reply's message was read already: nothing is asked."""

    async def prep_async(self, shared: dict[str, Any]) -> Proposal | None:
        turn = shared["turn"]
        if turn.kind == "regenerate" or not turn.user_message.content.strip():
            return None
        record = shared["conversation"].record
        model = turn.reply.meta.get("model") or record.model
        embedder = shared["library"].embedder
        return Proposal(
            shared["provider"], model, turn.user_message.content, turn.stop, shared["store"], embedder, record.owner
        )

    async def exec_async(self, proposal: Proposal | None) -> list[Fact]:
        if proposal is None:
            return []
        memory = await proposal.store.read_memory(proposal.owner)
        if not memory.on:
            return []  # off: nothing is asked, nothing kept
        async with asyncio.timeout(MEMORY_SECONDS):
            texts = await propose_facts(proposal.provider, proposal.model, proposal.message, proposal.stop)
        if not texts:
            return []
        vectors = await proposal.embedder.embed(texts, question=True)  # never behind a document's indexing
        known = await vectors_of(memory.facts, proposal.embedder)
        fresh = new_facts(texts, vectors, [fact.text for fact in memory.facts], known)
        return [Fact(proposal.owner, texts[i], to_bytes(vectors[i]), proposal.embedder.name) for i in fresh]

    async def exec_fallback_async(self, proposal: Proposal | None, exc: Exception) -> list[Fact]:
        logger.info("no facts from the model (%s): nothing new is remembered", type(exc).__name__)
        return []  # a reply that is complete is no worse for a memory not kept

    async def post_async(self, shared: dict[str, Any], proposal: Proposal | None, facts: list[Fact]) -> None:
        if not facts or proposal is None:
            return
        writing = proposal.store.add_facts(proposal.owner, facts, MOST_FACTS)
        kept = set(await asyncio.wait_for(asyncio.shield(writing), WRITE_SECONDS))
        for fact in facts:
            if fact.id in kept:
                shared["log"].append_step(
                    "RememberFacts",
                    "remembered",
                    f"Remembered: {fact.text}",
                    shape="text",
                    display="below",
                    step_id=FACT_STEP + fact.id,
                    buttons=[Button("forget", "Forget")],
                )
        if len(kept) < len(facts):
            said = f"Not remembered: memory is off, or full ({MOST_FACTS} facts). The Memory dialog (⋯) forgets some."
            shared["log"].append_step("RememberFacts", "not_kept", said, shape="text", display="below")

    @staticmethod
    async def on_press(press: Press) -> None:
        """Forget, pressed: the fact that step kept is deleted (its owner's only; gone already, nothing)."""
        await press.store.delete_fact(press.owner, press.step["id"].removeprefix(FACT_STEP))

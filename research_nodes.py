"""The nodes of the research flow (flow.py's `create_research_flow`): the model plans a few questions, a loop
looks each one up in what the conversation has (its documents, the user's earlier conversations), and the
chat flow's nodes then answer from what was found, citing it. PocketFlow's agent shape: a node that acts,
then decides whether to go round again."""

from dataclasses import dataclass
from typing import Any

from pocketflow import AsyncNode

from pocketchat.conversations import Conversation, Turn
from pocketchat.store import Store
from utils.embeddings import Embedder
from utils.llm_stream import ChatProvider, StopSignal
from utils.prompt import Snippet
from utils.research import plan
from utils.retrieval import VectorCache, passages_for
from utils.search_conversations import search_conversations

PASSAGES_A_QUESTION = 3


@dataclass
class PlanRequest:
    provider: ChatProvider
    model: str
    question: str
    stop: StopSignal


class PlanResearch(AsyncNode):
    """Ask the model for a short plan: the questions to look into before answering (shown as a step)."""

    async def prep_async(self, shared: dict[str, Any]) -> PlanRequest:
        turn: Turn = shared["turn"]
        model = shared["conversation"].record.model or await shared["provider"].default_model()
        return PlanRequest(shared["provider"], model, turn.user_message.content, turn.stop)

    async def exec_async(self, request: PlanRequest) -> list[str]:
        return await plan(request.provider, request.model, request.question, request.stop)

    async def exec_fallback_async(self, request: PlanRequest, exc: Exception) -> list[str]:
        return [request.question]  # no plan: the question itself is looked into

    async def post_async(self, shared: dict[str, Any], request: PlanRequest, questions: list[str]) -> None:
        shared["plan"], shared["looked_into"] = questions, 0
        listed = "\n".join(f"{number}. {question}" for number, question in enumerate(questions, start=1))
        shared["log"].append_step("PlanResearch", "plan", f"**Plan**\n\n{listed}", shape="markdown", step_id="plan")


@dataclass
class LookUp:
    store: Store
    vectors: VectorCache
    embedder: Embedder
    conversation_id: str
    owner: str
    turn_id: str
    question: str
    budget: int


class ResearchStep(AsyncNode):
    """Look one question of the plan up, then go round again ("next") until the plan is done; a stop ends
    the turn at once ("stopped"). What it finds joins `shared["context"]`, numbered for the answer to cite."""

    async def prep_async(self, shared: dict[str, Any]) -> LookUp:
        conversation: Conversation = shared["conversation"]
        library = shared["library"]
        return LookUp(
            shared["store"],
            library.vectors,
            library.embedder,
            conversation.id,
            conversation.record.owner,
            shared["turn"].id,
            shared["plan"][shared["looked_into"]],
            shared["settings"].context_budget // 4,
        )

    async def exec_async(self, look: LookUp) -> list[Snippet]:
        documents = await look.store.list_documents(look.conversation_id, look.owner)
        ready = [document for document in documents if document.status == "ready"]
        found = [Snippet(passage.text, passage.source) for passage in await passages_for(
            look.store, look.vectors, look.embedder, ready, look.owner, look.question, look.budget, PASSAGES_A_QUESTION
        )] if ready else []  # fmt: skip
        hits = await search_conversations(look.store, look.owner, look.question, look.turn_id, PASSAGES_A_QUESTION)
        return found + [Snippet(hit["excerpt"], f"earlier conversation “{hit['conversation']}”") for hit in hits]

    async def exec_fallback_async(self, look: LookUp, exc: Exception) -> list[Snippet]:
        return []  # a question that could not be looked up is answered from what the others found

    async def post_async(self, shared: dict[str, Any], look: LookUp, found: list[Snippet]) -> str | None:
        known = {snippet.text for snippet in shared["context"]}
        shared["context"].extend(snippet for snippet in found if snippet.text not in known)
        shared["looked_into"] += 1
        done, planned = shared["looked_into"], len(shared["plan"])
        progress = {"value": done / planned, "label": f"Looked into {done} of {planned}: {look.question}"}
        shared["log"].append_step("ResearchStep", "progress", progress, shape="progress", step_id="progress")
        turn: Turn = shared["turn"]
        if turn.stop.is_set():
            turn.sync_reply().status = "stopped"
            return "stopped"
        if done < planned:
            return "next"
        if shared["context"]:  # what the answer may cite, numbered as the prompt numbers it
            cited = [{"source": snippet.source, "text": snippet.text} for snippet in shared["context"]]
            shared["log"].append_step("ResearchStep", "sources", cited)
        return None

"""The graphs PocketChat runs: the flows a turn can run, by name (`FLOWS`: `--flow NAME` picks one,
default `chat`), and the indexing of a document. main.py hands them to the app.

A flow gets its options from the settings. The app builds it once; each turn runs it on the turn's
shared store (see `turns.new_shared`), and PocketFlow runs a copy of each node, so turns at once share
no node's state.
"""

from collections.abc import Sequence

from pocketflow import AsyncFlow, AsyncNode

from indexing_nodes import ChunkDocument, EmbedChunks, StoreChunks
from memory_nodes import RecallFacts, RememberFacts
from nodes import (
    BuildPrompt,
    NameConversation,
    ReadImages,
    RetrieveDocuments,
    RunTools,
    SaveReply,
    StreamChat,
    TitleConversation,
)
from pocketchat.flows import ChatFlow, chain, may_fail
from pocketchat.settings import Settings
from research_nodes import PlanResearch, ResearchStep


def create_chat_flow(settings: Settings, prompt_nodes: Sequence[AsyncNode] = ()) -> AsyncFlow:
    """One chat turn: what runs before the model (name the conversation, find the passages of its
    documents, read the images a model that sees them gets, build the prompt, and `prompt_nodes`, which
    shape it further: a flow of one's own), then the model's answer (`answer`)."""
    before_the_model = [TitleConversation(), RetrieveDocuments(), ReadImages(), BuildPrompt(), *prompt_nodes]
    # Nodes for complete replies, in order; each may fail without failing the reply (a `failed` step says so).
    after_a_complete_reply: list[AsyncNode] = [NameConversation()]
    return AsyncFlow(start=chain(*before_the_model, answer(settings, after_a_complete_reply)))


def create_research_flow(settings: Settings) -> AsyncFlow:
    """A question researched before it is answered: the model plans a few questions (PlanResearch, shown),
    a loop looks each up in the conversation's documents and the user's earlier conversations
    (ResearchStep, a progress bar moving), then the model answers from what was found, citing it, with the
    turn's tools as in the chat flow."""
    look = ResearchStep()
    look - "next" >> look  # one question a run, until the plan (4 questions at most: the step cap) is done
    look - "stopped" >> SaveReply()
    chain(look, ReadImages(), BuildPrompt(), answer(settings, [NameConversation()]))
    return AsyncFlow(start=chain(TitleConversation(), PlanResearch(), look))


def answer(settings: Settings, after_a_complete_reply: list[AsyncNode]) -> StreamChat:
    """Where every chat flow ends: the model's reply streamed (with tool calls run in a loop, PocketFlow's
    agent: the model decides, the tools act, back to the model), the nodes for a complete reply, and the
    reply recorded whatever its end. Its first node, the model's."""
    chat = StreamChat(max_retries=settings.retries, wait=settings.retry_wait)
    run_tools = RunTools()
    save = SaveReply()
    # The model asked for tools: run them, and back to it with their results (--max-tool-steps rounds).
    chat - "tools" >> run_tools
    run_tools >> chat
    run_tools - "stopped" >> save
    # StreamChat says how the reply ended.
    chat - "complete" >> chain(*may_fail(after_a_complete_reply), save)
    chat - "stopped" >> save
    chat - "error" >> save
    return chat


def create_memory_flow(settings: Settings) -> AsyncFlow:
    """The chat flow with a memory of the user across conversations: the facts remembered about them that
    bear on their message join the prompt (RecallFacts, after BuildPrompt), and the durable facts their message
    states are kept after a complete reply (RememberFacts), each shown with a Forget button (memory_nodes.py)."""
    before_the_model = [TitleConversation(), RetrieveDocuments(), ReadImages(), BuildPrompt(), RecallFacts()]
    return AsyncFlow(start=chain(*before_the_model, answer(settings, [NameConversation(), RememberFacts()])))


def create_indexing_flow(settings: Settings) -> AsyncFlow:
    """One document, in the background after its upload (its text read already): cut it into passages,
    embed them in batches, store them and mark it ready."""
    # A remote embedding provider may fail for a moment: each attempt embeds every passage again.
    embed = EmbedChunks(max_retries=settings.retries, wait=settings.retry_wait)
    return AsyncFlow(start=chain(ChunkDocument(), embed, StoreChunks()))


FLOWS: dict[str, ChatFlow] = {
    "chat": ChatFlow("Chat", "Answers with your documents and tools.", create_chat_flow),
    "research": ChatFlow(
        "Research",
        "Plans a few questions, looks each up in your documents and earlier chats, then answers citing them.",
        create_research_flow,
    ),
    "memory": ChatFlow(
        "Memory",
        "Remembers lasting facts about you across conversations (you see, edit and forget them), and uses them.",
        create_memory_flow,
    ),
}

"""The flow and its nodes, run without any socket: a shared store in, frames in the channel out."""

import asyncio
import json
from pathlib import Path

from flow import FLOWS, create_indexing_flow
from pocketchat.conversations import Conversation, Hub, NoOtherReplicas
from pocketchat.providers import UnavailableProvider
from pocketchat.providers.openai_compatible import OpenAIProvider
from pocketchat.records import ConversationRecord, DocumentRecord, Message
from pocketchat.settings import Settings
from pocketchat.state import AppState
from pocketchat.store.sqlite import SqliteStore
from pocketchat.turns import new_shared, run_turn
from tests.conftest import chunk_seqs, reply_text
from tests.fake_openai import FakeOpenAI, Reply
from utils.prompt import build_prompt, estimate_tokens


async def run_one_turn(fake: FakeOpenAI, db: Path, content: str, history: list[Message] | None = None):
    store = SqliteStore(db)
    await store.open()
    provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=5)
    settings = Settings(retries=2, retry_wait=0, context_budget=1000)
    record = ConversationRecord(model="fake-model", system_prompt="Be brief.")
    await store.create_conversation(record)
    conversation = Conversation(record, history or [])  # stored just above
    turn = conversation.begin_message(content)
    await store.open_turn(record.id, None, [turn.user_message, turn.reply])  # as turns.run_turn does
    state = AppState(settings, store, provider, FLOWS, create_indexing_flow)
    await state.flow.run_async(new_shared(state, conversation, turn))
    conversation.end(turn)
    frames = [json.loads(text) async for text in turn.log.follow(0)]
    stored = await store.load(record.id)
    await provider.aclose()
    await store.close()
    return conversation, turn, frames, stored


def test_the_flow_streams_into_the_channel_and_records_the_turn(fake, tmp_path):
    fake.queue(Reply(tokens=["Hi", "!"]))
    conversation, turn, frames, stored = asyncio.run(run_one_turn(fake, tmp_path / "c.db", "hello"))
    assert frames[0]["type"] == "turn_start"
    assert chunk_seqs(frames) == [1, 2] and reply_text(frames) == "Hi!"
    assert turn.reply.content == "Hi!" and turn.reply.status == "complete"
    assert [m.content for m in conversation.history] == ["hello", "Hi!"]
    _, messages = stored
    assert [(m.role, m.content, m.status) for m in messages] == [
        ("user", "hello", "complete"),
        ("assistant", "Hi!", "complete"),
    ]


def test_a_new_conversation_is_named_by_its_first_message_then_by_its_model_in_a_few_words(fake, tmp_path):
    fake.titles.append(Reply(tokens=['Title: "Rome ', "trip ", 'plan."\nMore words']))
    _, _, frames, stored = asyncio.run(run_one_turn(fake, tmp_path / "c.db", "Plan a   trip\nto Rome"))
    named = [f for f in frames if f["type"] == "conversation"]
    assert named[0] == {
        "type": "conversation",
        "conversation_id": stored[0].id,
        "session_id": stored[0].id,
        "title": "Plan a trip to Rome",  # at once, while the reply streams
        "model": "fake-model",
        "system_prompt": "Be brief.",
        "tools_off": [],
        "sampling": {},
        "flow": "",
    }
    assert [f["title"] for f in named[1:]] == ["Rome trip plan"]  # after the first reply, by its model
    assert stored[0].title == "Rome trip plan"
    (asked,) = fake.title_requests
    assert "Plan a   trip\nto Rome" in asked["json"]["messages"][1]["content"]


def test_a_model_that_gives_no_title_leaves_the_first_messages_start(fake, tmp_path):
    fake.titles.append(Reply(status=500, message="no titles today"))
    _, turn, frames, stored = asyncio.run(run_one_turn(fake, tmp_path / "c.db", "Plan a trip to Rome"))
    assert [f["title"] for f in frames if f["type"] == "conversation"] == ["Plan a trip to Rome"]
    assert stored[0].title == "Plan a trip to Rome" and turn.reply.status == "complete"
    assert not [f for f in frames if f["type"] == "step" and f["kind"] == "failed"]


def test_a_failed_turn_is_recorded_as_failed_not_left_dangling(fake, tmp_path):
    fake.queue(Reply(status=400, message="bad request"))
    _, turn, frames, stored = asyncio.run(run_one_turn(fake, tmp_path / "c.db", "hello"))
    error = next(f for f in frames if f["type"] == "error")
    assert "bad request" in error["message"]
    assert [(m.role, m.status) for m in stored[1]] == [("user", "complete"), ("assistant", "error")]
    assert stored[1][1].error == turn.reply.error


def test_the_prompt_keeps_the_newest_messages_that_fit():
    history = [Message(role="user" if i % 2 == 0 else "assistant", content=f"message {i} " * 10) for i in range(10)]
    per_message = estimate_tokens(history[0].content) + 4
    prompt = build_prompt("sys", history, budget=estimate_tokens("sys") + 4 + 3 * per_message)
    assert prompt[0] == {"role": "system", "content": "sys"}
    # Three fit; the oldest of them is an assistant reply, which is dropped so the prompt opens with a user turn.
    assert [m["content"] for m in prompt[1:]] == [history[8].content, history[9].content]


def test_the_newest_message_is_kept_even_over_budget():
    prompt = build_prompt("sys", [Message(role="user", content="x" * 10_000)], budget=10)
    assert len(prompt) == 2


def test_the_context_budget_trims_what_the_provider_receives(start_app, fake):
    app = start_app("--context-budget", "60")
    client = app.client()
    client.hello()
    for word in ("first", "second", "third"):
        client.turn(f"{word} question " * 10)
    sent = fake.chat_requests[-1]["json"]["messages"]
    assert sent[0]["role"] == "system"
    assert sent[-1]["content"].startswith("third question")
    assert not any(m["content"].startswith("first") for m in sent)


class BrokenProvider(UnavailableProvider):
    """A provider with a bug: it fails with an exception that is not a provider error."""

    def __init__(self) -> None:
        super().__init__("broken")
        self.attempts = 0

    async def default_model(self) -> str:
        return "broken-model"

    def open_stream(self, messages, model, max_tokens, on_queued=None):
        self.attempts += 1
        raise ZeroDivisionError("a bug")


def test_a_bug_is_not_retried_and_the_turn_ends_as_an_internal_error(tmp_path, caplog):
    async def scenario():
        store = SqliteStore(tmp_path / "c.db")
        await store.open()
        provider = BrokenProvider()
        state = AppState(Settings(retries=3, retry_wait=0), store, provider, FLOWS, create_indexing_flow)
        conversation = state.hub.create("local", "broken-model", "")
        turn = conversation.begin_message("hello")
        await run_turn(state, conversation, turn)
        frames = [json.loads(text) async for text in turn.log.follow(0)]
        _, messages = await store.load(conversation.id)
        await store.close()
        return provider.attempts, frames, messages

    attempts, frames, messages = asyncio.run(scenario())
    assert attempts == 1
    assert [f["type"] for f in frames][-2:] == ["error", "turn_end"]
    assert frames[-2]["code"] == "internal" and frames[-1]["status"] == "error"
    assert [(m.role, m.status) for m in messages] == [("user", "complete"), ("assistant", "error")]
    assert "ZeroDivisionError: a bug" in caplog.text


class CountingStore(SqliteStore):
    """The SQLite store, counting its reads of a conversation's documents."""

    document_reads = 0

    async def list_documents(self, conversation_id: str, owner: str) -> list[DocumentRecord]:
        self.document_reads += 1
        return await super().list_documents(conversation_id, owner)


async def document_reads_per_turn(fake: FakeOpenAI, db: Path, stored: bool) -> list[int]:
    """The documents reads of three turns of one conversation without documents, the third told of
    a document change (an upload, say) just before it."""
    store = CountingStore(db)
    await store.open()
    provider = OpenAIProvider(f"http://127.0.0.1:{fake.port}/v1", "sk-test", "fake-model", idle_limit=5)
    state = AppState(Settings(), store, provider, FLOWS, create_indexing_flow)
    record = ConversationRecord(model="fake-model", system_prompt="Be brief.")
    await store.create_conversation(record)
    conversation = Conversation(record, [], stored=stored)
    reads = []
    for told in (False, False, True):
        if told:
            conversation.documents_changed()
        fake.queue(Reply(tokens=["ok"]))
        turn = conversation.begin_message("hello")
        await store.open_turn(record.id, None, [turn.user_message, turn.reply])
        await state.flow.run_async(new_shared(state, conversation, turn))
        conversation.end(turn)
        reads.append(store.document_reads)
    await provider.aclose()
    await store.close()
    return reads


def test_a_conversation_known_to_have_no_documents_skips_reading_them_until_told_of_one(fake, tmp_path):
    assert asyncio.run(document_reads_per_turn(fake, tmp_path / "stored.db", stored=True)) == [1, 1, 2]
    # A new conversation, not stored yet, has none: not even its first turn reads them.
    assert asyncio.run(document_reads_per_turn(fake, tmp_path / "new.db", stored=False)) == [0, 0, 1]


class FoundElsewhere(NoOtherReplicas):
    """A coordinator that finds every conversation as new on another replica, not stored yet."""

    def __init__(self, record: ConversationRecord) -> None:
        self.record = record

    async def find_new(self, conversation_id: str) -> ConversationRecord | None:
        return self.record if conversation_id == self.record.id else None


def test_a_new_conversation_found_on_another_replica_is_not_known_to_have_no_documents(tmp_path):
    # That replica may have taken an upload while this one loaded it, its frames not heard here.
    async def opened() -> tuple[bool, bool]:
        store = SqliteStore(tmp_path / "chat.db")
        await store.open()
        hub = Hub(store)
        made_here = hub.create("alice", "fake-model", "")
        record = ConversationRecord(model="fake-model", system_prompt="", owner="alice")
        hub.coordinator = FoundElsewhere(record)
        found = await hub.open(record.id, "alice")
        await store.close()
        return made_here.knows_no_documents(), found.knows_no_documents()

    assert asyncio.run(opened()) == (True, False)

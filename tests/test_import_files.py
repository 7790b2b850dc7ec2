"""Import files read into conversation trees: ChatGPT's `conversations.json` (tests/files/, shaped as its
export is: a system root, hidden custom instructions, regenerated replies, an edited first message, a
tool call, thoughts, an image part, an empty and an unfinished reply) and our own format; every way a
file can be wrong is refused whole, saying where."""

import copy
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from pocketchat.transfer import read
from pocketchat.transfer.native import FORMAT, from_file, to_file
from pocketchat.transfer.read import check, read_trees, values
from pocketchat.transfer.tree import BadFile, ConversationTree

CHATGPT = Path(__file__).parent / "files" / "chatgpt_conversations.json"


def chatgpt() -> list[dict[str, Any]]:
    return json.loads(CHATGPT.read_text())


def trees_of(data: Any) -> list[ConversationTree]:
    """The conversations the reader finds in a file of `data`."""
    return list(read_trees(io.BytesIO(json.dumps(data).encode())))


def path_to(tree: ConversationTree, leaf: str | None) -> list[str]:
    parents = {message.id: message.parent_id for message in tree.messages}
    path = []
    while leaf is not None:
        path.append(leaf)
        leaf = parents[leaf]
    return path[::-1]


def native(messages: list[dict[str, Any]], **conversation: Any) -> dict[str, Any]:
    base = {"title": "t", "model": "m", "system_prompt": "", "created_at": 1.0, "updated_at": 2.0, "leaf_id": None}
    return {"format": FORMAT, "version": 1, "conversation": base | conversation, "messages": messages}


def message(id: str, parent: str | None, role: str = "user", content: str = "hi", **more: Any) -> dict[str, Any]:
    return {"id": id, "parent_id": parent, "role": role, "content": content, "created_at": 1.0, **more}


def refused(data: Any) -> str:
    return refused_bytes(json.dumps(data).encode())


def refused_bytes(raw: bytes) -> str:
    with pytest.raises(BadFile) as bad:
        list(read_trees(io.BytesIO(raw)))
    return bad.value.message


def test_chatgpt_branches_become_our_tree_and_current_node_the_chosen_path():
    lisbon, arithmetic = trees_of(chatgpt())
    assert lisbon.title == "Weekend in Lisbon" and lisbon.created_at == 1718000000.0
    # Two versions of the first reply, each with its own continuation.
    assert [m.id for m in lisbon.messages if m.parent_id == "u1"] == ["a1", "a1b"]
    assert path_to(lisbon, lisbon.leaf_id) == ["u1", "a1b", "u2b", "a3pre"]
    # An edited first message: two first messages, the older path chosen.
    assert [m.id for m in arithmetic.messages if m.parent_id is None] == ["q1", "q1e"]
    assert path_to(arithmetic, arithmetic.leaf_id) == ["q1", "r1"]


def test_chatgpt_text_parts_are_kept_and_what_no_reader_saw_is_dropped_and_counted():
    lisbon, arithmetic = trees_of(chatgpt())
    by_id = {m.id: m for m in lisbon.messages}
    assert by_id["a1"].content == "Day 1: Alfama and the castle.\n\nDay 2: Belém."  # two parts
    assert by_id["u2b"].content == "What is this place?"  # its image left out
    assert by_id["a1b"].meta == {"model": "gpt-4o"} and "😀" in by_id["a1b"].content
    # The answer after a tool call is joined to the assistant message it continues.
    assert by_id["a3pre"].content == "Let me look that up.\n\nThat is the Belém Tower."
    assert {m.role for m in lisbon.messages} == {"user", "assistant"}
    # The model's thoughts become the reasoning of the reply they came before.
    assert (by_id["a2t"].content, by_id["a2t"].reasoning) == ("Take the train to Sintra.", "Sintra or Cascais")
    assert lisbon.dropped == {
        "system messages": 1, "hidden messages": 1, "thought summaries": 1, "images and files": 1, "tool calls": 1,
        "tool messages": 1, "replies joined to the one before": 2,
    }  # fmt: skip
    assert arithmetic.dropped == {"system messages": 1, "empty messages": 1}
    assert {m.id: m.status for m in arithmetic.messages}["r1e"] == "interrupted"  # ChatGPT's in_progress
    assert lisbon.model is None and lisbon.system_prompt is None  # the importing app's defaults


def test_our_format_round_trips_exactly():
    trees = trees_of(chatgpt())
    again = trees_of([to_file(tree) for tree in trees])
    assert [to_file(tree) for tree in again] == [to_file(tree) for tree in trees]


def test_new_ids_keep_the_tree():
    tree = trees_of(chatgpt())[0]
    fresh = tree.with_new_ids()
    assert fresh.id != tree.id and not {m.id for m in fresh.messages} & {m.id for m in tree.messages}
    assert len(path_to(fresh, fresh.leaf_id)) == len(path_to(tree, tree.leaf_id))
    assert [m.content for m in fresh.messages] == [m.content for m in tree.messages]


def test_messages_are_put_after_their_parents_whatever_the_files_order():
    tree = from_file(native([message("b", "a", "assistant"), message("a", None), message("c", "b")]), "it")
    assert [m.id for m in tree.messages] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ([], "no conversation"),
        ({"hello": 1}, "neither PocketChat's format"),
        (native([message("a", "nowhere")]), "its parent 'nowhere' is not in the file"),
        (native([message("a", "b"), message("b", "a")]), "cycle"),
        (native([message("a", None), message("a", None)]), "two messages have the id 'a'"),
        (native([message("a", None, content=5)]), "message 1: `content` must be text"),
        (native([message("a", None, role="system")]), "`role` must be one of user, assistant"),
        (native([message("a", None, status="odd")]), "`status` must be one of"),
        (native([message("a", None, meta=[])]), "`meta` must be an object"),
        (native([message("a", None)], created_at="yesterday"), "`created_at` must be a number"),
        (native([message("a", None)], leaf_id="zz"), "the chosen message 'zz' is not in the file"),
        (native([message("a", None, content="half \ud83d")]), "lone surrogate"),
        (native([message("a", None, content="nul \x00")]), "NUL"),
        (native([message("a", None, meta={"k": "\udc00"})]), "lone surrogate"),
        (native([message("a", None, meta={"k": json.loads("[" * 32 + "]" * 32)})]), "nested over 32 levels"),
        ({**native([]), "version": 2}, "version 2"),
        ({**native([]), "messages": {}}, "`messages` must be a list"),
    ],
)
def test_a_bad_file_is_refused_saying_where(data, says):
    assert says in refused(data)


def test_chatgpt_shapes_that_cannot_be_read_are_refused():
    data = chatgpt()
    broken = copy.deepcopy(data)
    broken[1]["mapping"]["r1"]["parent"] = "gone"
    assert "Conversation 2, message 'r1': its parent 'gone' is not in the file" in refused(broken)
    looped = copy.deepcopy(data)
    looped[0]["mapping"]["client-created-root"]["parent"] = "a3"
    assert "cycle" in refused(looped)
    mistyped = copy.deepcopy(data)
    mistyped[0]["mapping"]["u1"]["message"]["content"]["parts"] = "text"
    assert "`content.parts` must be a list" in refused(mistyped)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"\xff\xfe not utf-8", "not UTF-8"),
        (b"{not json", "not JSON"),
        (b'{"a": NaN}', "NaN"),
        (b"[" * 100_000, "nested too deeply"),
    ],
)
def test_bytes_that_are_not_json_are_refused(raw, says):
    assert says in refused_bytes(raw)


def test_the_reader_writes_a_line_a_conversation_and_its_verdict(tmp_path):
    out = tmp_path / "out.jsonl"
    verdict = check(str(CHATGPT), str(out))
    assert verdict["conversations"] == 2 and verdict["dropped"]["system messages"] == 2
    lines = out.read_text().splitlines()
    assert [from_file(json.loads(line), "it").title for line in lines] == ["Weekend in Lisbon", "Arithmetic"]
    (tmp_path / "bad.json").write_text("[1]")
    verdict = check(str(tmp_path / "bad.json"), str(out))
    assert "neither" in verdict["error"] and verdict["status"] == 422


def node(key: str, parent: str | None, role: str | None = None, text: str = "", at: float = 1.0) -> dict[str, Any]:
    """A node of a ChatGPT `mapping`: with no message unless it has a role."""
    message = {"author": {"role": role}, "content": {"content_type": "text", "parts": [text]}, "create_time": at}
    return {"id": key, "parent": parent, "children": [], "message": message if role else None}


def test_messages_under_a_long_chain_of_empty_nodes_are_read_at_once():
    # Row 7: 5,000 messages under a chain of 20,000 nodes with no message (2.5 MB). Each message's nearest
    # kept ancestor was looked for up the whole chain: 18 s on this machine.
    mapping = {f"e{n}": node(f"e{n}", f"e{n - 1}" if n else None) for n in range(20_000)}
    mapping |= {f"k{n}": node(f"k{n}", "e19999", "user", "hi", at=n) for n in range(5_000)}
    started = time.monotonic()
    [tree] = trees_of([{"mapping": mapping, "current_node": "k4999"}])
    assert time.monotonic() - started < 5
    assert len(tree.messages) == 5_000 and {m.parent_id for m in tree.messages} == {None}
    assert tree.leaf_id == "k4999"


def test_a_long_run_of_replies_joined_into_one_is_read_at_once():
    # A reply continued 5,000 times (after tool calls, say) is one message; joined one by one, its growing
    # text was copied at each join.
    mapping = {"q": node("q", None, "user", "go on")}
    mapping |= {f"a{n}": node(f"a{n}", f"a{n - 1}" if n else "q", "assistant", f"{n}" * 2_000) for n in range(5_000)}
    started = time.monotonic()
    [tree] = trees_of([{"mapping": mapping, "current_node": "a4999"}])
    assert time.monotonic() - started < 5
    assert [m.id for m in tree.messages] == ["q", "a0"] and tree.leaf_id == "a0"
    reply = tree.messages[1]
    assert reply.content == "\n\n".join(f"{n}" * 2_000 for n in range(5_000))


TRICKY = [
    {"text": 'é😀 "quoted" \\ back\nslash', "numbers": [0, -1.5e-3, 12345678901234567890, 1e300]},
    {"nested": [[[{"a": [True, False, None]}]]], "empty": [{}, [], ""], "long": "x" * 300},
    7,
    "a string",
    -0.25,
]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 4096])
def test_a_file_read_in_pieces_reads_as_whole_json(monkeypatch, chunk):
    monkeypatch.setattr(read, "CHUNK", chunk)
    for raw in (json.dumps(TRICKY, indent=1, ensure_ascii=False).encode(), json.dumps(TRICKY).encode()):
        assert [value for _, value in values(io.BytesIO(b"\xef\xbb\xbf" + raw))] == json.loads(raw)
    one = json.dumps(TRICKY[0], indent=1).encode()  # one object, not a list
    assert list(values(io.BytesIO(one))) == [("The conversation", TRICKY[0])]


def outcome(raw: bytes) -> Any:
    """What json makes of `raw` whole: its values, or the reader's message for its error."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        return f"The file is not JSON ({error.msg} at line {error.lineno}, column {error.colno})."


def test_a_file_cut_or_damaged_anywhere_is_refused_as_json_refuses_it_whole(monkeypatch):
    monkeypatch.setattr(read, "CHUNK", 3)
    raw = json.dumps(TRICKY, indent=1).encode()  # ASCII: a cut falls between characters
    for at in range(len(raw)):
        for damaged in (raw[:at], raw[:at] + b"#" + raw[at + 1 :]):
            try:
                got: Any = [value for _, value in values(io.BytesIO(damaged))]
                got = got if damaged.lstrip().startswith(b"[") else got[0]
            except BadFile as bad:
                got = bad.message
            assert got == outcome(damaged), damaged


def test_a_number_of_thousands_of_digits_is_refused_saying_so():
    # Issue 31 #12: json's limit on an integer's digits was a ValueError, and the import answered 500.
    raw = b'[{"mapping": {}, "create_time": ' + b"7" * 5_000 + b"}]"
    assert "a number of over 4,300 digits" in refused_bytes(raw)

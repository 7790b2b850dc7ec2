"""utils/clean.py, the one place where what a model, a provider or a tool wrote is made safe (issue 31,
item 3), on its own: every step a node shows, a tool call's arguments, a provider's usage, and JSON a
store kept. tests/test_model_text.py runs the same inputs through the app."""

import asyncio
import json

from pocketchat import steps
from pocketchat.turn_log import InProcessTurnLog
from utils.clean import (
    MAX_DEPTH,
    MAX_ITEMS,
    TOO_DEEP,
    clean_arguments,
    clean_json,
    clean_usage,
    stored_json,
)
from utils.llm_stream import USAGE_KEYS

LONE = "\ud800"


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def depth_of(value: object) -> int:
    depth = 0
    while isinstance(value, list) and value:
        value, depth = value[0], depth + 1
    return depth + 1 if isinstance(value, list) else depth


def test_any_step_a_node_shows_is_sent_and_kept_safe():
    """Not only the tools' steps: whatever a node puts in a step (here a lone surrogate, a NUL in a key,
    deep nesting, NaN, a 400-digit integer) reaches the sockets encoded and is kept as valid JSON."""

    async def scenario() -> tuple[list[str], dict]:
        log = InProcessTurnLog("t")
        data = {"text": f"a{LONE}b", f"k\x00{LONE}": [float("nan"), 10**400], "deep": nested(100)}
        log.append_step("SomeNode", "status", data)
        log.close()
        return [text async for text in log.follow(0)], log.snapshot()

    (sent,), snapshot = asyncio.run(scenario())
    sent.encode()  # a socket sends it as UTF-8
    frame = json.loads(sent)
    assert frame["data"]["text"] == "a\ufffdb"
    assert frame["data"]["k\ufffd"] == [None, None]
    assert depth_of(frame["data"]["deep"]) == MAX_DEPTH - 1 and TOO_DEEP in sent
    assert snapshot["steps"] == [steps.step_record(frame)]


def test_json_is_bounded_in_items_values_and_text():
    value = clean_json({"many": list(range(5_000)), "long": "x" * 1_000_000, LONE * 500: 1})
    assert len(value["many"]) == MAX_ITEMS + 1 and value["many"][-1] == "[4,000 more items left out]"
    assert len(json.dumps(value)) < 250_000
    wide = clean_json([[0] * 1_000] * 1_000)  # a million values
    assert sum(isinstance(value, int) for row in wide if isinstance(row, list) for value in row) <= 10_000


def test_a_tool_calls_arguments_keep_their_text_unless_it_needed_cleaning():
    assert clean_arguments('{"a":1}', 100) == '{"a":1}'  # the model's own spacing
    assert json.loads(clean_arguments('{"expression":"\\ud800"}', 100)) == {"expression": "\ufffd"}
    assert clean_arguments('{"a": "\\u0000x"}', 100) == '{"a": "x"}'
    deep = clean_arguments('{"a":' + "[" * 500 + "]" * 500 + "}", 100_000)
    assert TOO_DEEP in deep and len(deep) < 1_000
    past_the_stack = "[" * 100_000 + "]" * 100_000
    assert clean_arguments(past_the_stack, 1_000_000) == past_the_stack  # kept as text: not run
    assert len(clean_arguments("x" * 10_000, 100)) == 101
    assert clean_arguments(f"not JSON {LONE}\x00", 100) == "not JSON \ufffd"


def test_a_usage_that_is_no_count_of_tokens_is_left_out():
    assert clean_usage({"prompt_tokens": 3, "completion_tokens": "4"}, USAGE_KEYS) == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 0,
    }
    for bad in (LONE, -1, 1e300, float("nan"), 10**30, "9" * 5_000, "٣", True, [1]):
        assert clean_usage({"prompt_tokens": bad}, USAGE_KEYS) is None, bad
    assert clean_usage([1, 2], USAGE_KEYS) is None and clean_usage({}, USAGE_KEYS) is None


def test_stored_json_reads_back_safe_or_as_the_fallback():
    assert stored_json('{"a": [1, "x"]}', {}) == {"a": [1, "x"]}
    assert stored_json('{"a": "\\ud800\\u0000"}', {}) == {"a": "\ufffd"}
    assert stored_json('{"n": NaN, "big": 123456789012345678901234567890}', {}) == {
        "n": None,
        "big": 1.2345678901234568e29,
    }
    assert stored_json("[" * 100_000 + "]" * 100_000, {}) == {}  # past the parser's stack
    assert stored_json("1" * 5_000, {}) == {}  # past the integer digits the parser reads
    assert stored_json("not JSON", {}) == {} and stored_json("[1]", {}) == {} and stored_json(None, []) == []
    deep = stored_json('{"a":' + "[" * 500 + "]" * 500 + "}", {})
    assert TOO_DEEP in json.dumps(deep)

"""What a model, a provider or a tool produced, made safe before it enters a turn's log, a reply or the
database; and JSON a store kept, read back safe. The one place for both: the nodes and the tools call it
where such text comes in (StreamChat's tool calls, usage and errors; a tool's result; an MCP server's or a
client's declared tools; every step's data), the records where stored JSON is read.

Safe means: valid Unicode (a lone surrogate, which JSON can escape as `\\ud800`, becomes U+FFFD: no UTF-8
socket, page or database takes one), no NUL (PostgreSQL text cannot hold one), bounded sizes, and JSON
structures of bounded depth and size (what is too deep or too many becomes a plain text value saying so),
with finite numbers only. Whatever a prompt injection asks the model to write, a conversation stays
readable."""

import json
import math
from typing import Any

import orjson

MAX_DEPTH = 32  # lists and objects nested in one value a model or a tool made (the rest: TOO_DEEP)
READ_DEPTH = 200  # in JSON read back from a store that needed cleaning (orjson, which sends it, takes 255)
MAX_ITEMS = 1_000  # of one list or object (the rest: one value saying how many were left out)
MAX_VALUES = 10_000  # in one value, nested ones counted
MAX_CHARACTERS = 200_000  # of text in one value, keys counted
MAX_NUMBER = 2**63 - 1  # an integer past it (orjson's bound) is kept as a float, or null
NAME_CHARACTERS = 200  # of a tool's name as the model wrote it (a tool's real name is at most 64)
ID_CHARACTERS = 100  # of a tool call's id (a client answers with at most 128: room for the `_2` of a repeat)
MESSAGE_CHARACTERS = 2_000  # of a provider's error message, as the reply keeps it
DESCRIPTION_CHARACTERS = 2_000  # of a tool's description (a client's may be no longer)
MAX_TOKENS = 1_000_000_000  # a usage number past it is no count of tokens
TOO_DEEP = f"[nested deeper than {MAX_DEPTH} levels: left out]"


def valid_text(text: str) -> str:
    """`text` as valid Unicode without NUL: a surrogate pair made whole, a lone surrogate U+FFFD."""
    if text.isascii():  # most text, and every chunk of many replies: no surrogate to mend
        return text.replace("\x00", "")
    # UTF-16 with surrogatepass turns a proper pair into its character; "replace" marks the rest.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").replace("\x00", "")


def clean_text(text: str, limit: int | None = None) -> str:
    """`text` valid (see `valid_text`), and cut to `limit` characters with a `…` if it is longer."""
    if limit is not None and len(text) > limit:
        return valid_text(text[:limit]) + "…"
    return valid_text(text)


def clean_json(
    value: Any,
    depth: int = MAX_DEPTH,
    values: int | None = MAX_VALUES,
    characters: int | None = MAX_CHARACTERS,
) -> Any:
    """`value` as JSON that can be sent and stored: texts valid, finite numbers, at most `depth` levels of
    lists and objects, `values` values and `characters` of text in all (None: no bound). What is cut is
    said in place, as text; a tuple becomes a list, any other object its type's name."""
    return _Cleaner(values, characters).clean(value, depth)


class _Cleaner:
    def __init__(self, values: int | None, characters: int | None) -> None:
        self.values = math.inf if values is None else values
        self.characters = math.inf if characters is None else characters

    def clean(self, value: Any, depth: int) -> Any:
        self.values -= 1
        if isinstance(value, str):
            return self.text(value)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            return value if -MAX_NUMBER <= value <= MAX_NUMBER else _as_float(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict | list | tuple):
            if depth <= 0:
                return self.text(TOO_DEEP)
            return self.mapping(value, depth - 1) if isinstance(value, dict) else self.sequence(value, depth - 1)
        return self.text(f"[{type(value).__name__}]")

    def text(self, text: str) -> str:
        limit = None if self.characters == math.inf else max(int(self.characters), 0)
        text = clean_text(text, limit)
        self.characters -= len(text)
        return text

    def room(self, count: int) -> int:
        """How many items of a list or object of `count` are kept."""
        return min(count, MAX_ITEMS, max(int(min(self.values, MAX_ITEMS)), 0))

    def sequence(self, items: list[Any] | tuple[Any, ...], depth: int) -> list[Any]:
        kept = [self.clean(item, depth) for item in items[: self.room(len(items))]]
        if len(kept) < len(items):
            kept.append(self.text(f"[{len(items) - len(kept):,} more items left out]"))
        return kept

    def mapping(self, items: dict[Any, Any], depth: int) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        room = self.room(len(items))
        for key, item in items.items():
            if len(kept) >= room:
                break
            name = key if isinstance(key, str) else str(key)  # a node's dict may have numbers as keys
            kept[self.text(name[:NAME_CHARACTERS])] = self.clean(item, depth)
        if room < len(items):
            kept["…"] = self.text(f"[{len(items) - room:,} more keys left out]")
        return kept


def _as_float(number: int) -> float | None:
    try:
        return float(number)
    except OverflowError:
        return None


def clean_arguments(text: str, limit: int) -> str:
    """A tool call's arguments as the model wrote them (JSON text, perhaps not valid): JSON whose value
    needed cleaning is written again from its cleaned value (an escaped lone surrogate becomes U+FFFD, a
    deep structure is cut); other text is kept, valid, and cut to `limit` characters."""
    if len(text) > limit:
        return clean_text(text, limit)  # no longer JSON: the tool is not run
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return valid_text(text)
    cleaned = clean_json(value)
    # Compared, not rewritten always: a model's own spacing stays what it reads back.
    return valid_text(text) if cleaned == value else json.dumps(cleaned, ensure_ascii=False)


def clean_usage(usage: Any, keys: tuple[str, ...]) -> dict[str, int] | None:
    """A provider's usage as counts of tokens, `keys` each (0 for one it leaves out); None if it is not
    one (a number that is none, negative, or absurd): the reply's usage is then estimated."""
    if not usage or not isinstance(usage, dict):
        return None
    counts = {}
    for key in keys:
        if (count := _count(usage.get(key) or 0)) is None:
            return None
        counts[key] = count
    return counts


def _count(value: Any) -> int | None:
    if isinstance(value, str) and value.isascii() and value.strip().isdigit() and len(value) < 20:
        value = int(value)  # some servers send counts as text
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_TOKENS else None


def stored_json(text: str | None, fallback: Any) -> Any:
    """JSON text a store kept (a message's meta, a conversation's settings, a share's snapshot), read back
    as a value that can be sent and shown, whatever wrote it: an older version, or a path that missed
    cleaning. `fallback` if it is no JSON at all (or nested past the parser's stack), or not of the same
    type as `fallback`."""
    text = text or ""
    try:
        # Clean text, the usual case, is read once, not walked: orjson refuses what reads back unsafe (the
        # escape of a lone surrogate, NaN, a number too large for a float, a NUL unescaped), and writes
        # nothing nested past 255 levels; only the escape of a NUL it reads is looked for.
        value = orjson.loads(text)
        orjson.dumps(value)
        if "\\u0000" not in text:
            return value if isinstance(value, type(fallback)) else fallback
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        pass
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return fallback
    if not isinstance(value, type(fallback)):
        return fallback
    return clean_json(value, READ_DEPTH, values=None, characters=None)

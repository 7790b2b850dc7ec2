"""Search over a user's own conversations: what a query means, and how the hits the database finds are
ranked and shown, once for both stores.

The index lives in the database itself and is written by the transaction that writes the message or the
title (SQLite FTS5 tables kept by triggers, PostgreSQL tsvector columns with GIN indexes), so that it can
never drift from what is stored: a deleted conversation, or an edited message's old text, is gone from
the index when the delete commits. Each store finds the candidates (`Candidates`); this module makes
them hits: one a conversation, at its best-matching message, the title weighing more than a message.
"""

import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pocketchat.records import Role
from utils.retrieval import STOPWORDS

MAX_QUERY_CHARACTERS = 500
MAX_LIMIT = 50
WORD = re.compile(r"[^\W_]+")  # what the query's words are: letters and digits, nothing FTS syntax reads
# A last word shorter than this is matched whole: "ba*" or "wor*" would match a good part of every message.
PREFIX_MIN = 4
TERM_CHARACTERS = 64
# Messages ranked at most, the newest of those matching: ranking costs a read of each, and a word found
# in most messages would cost a scan of them all. Older matches are found by a more precise query.
CANDIDATES = 300
# A title that holds the words says more about a conversation than a message that does: the best title
# counts twice the best message (each score taken over the best of its kind in the answer: BM25 and
# ts_rank have scales of their own, and BM25 gives a word found in most titles almost nothing).
TITLE_WEIGHT = 2.0
# A message is searchable by its first SEARCHABLE_CHARACTERS: the index reads no more of it (SQLite's
# schema step 15 and PostgreSQL's 13 hold the same number; PostgreSQL's says why this one), and a snippet
# is made from no more. So what a search costs does not grow with the length of the messages it finds.
SEARCHABLE_CHARACTERS = 65_536
# SQLite's messages are ranked by BM25 over their first RANKED_CHARACTERS (about 700 words: the whole of
# nearly every message), computed here: a ranking of CANDIDATES messages reads a bounded amount of text.
RANKED_CHARACTERS = 4_096
SNIPPET_TOKENS = 20  # words in a snippet, about
# Characters in a snippet, at most (a word may be as long as a message), and before its first match
# when it had to be cut.
SNIPPET_CHARACTERS, CLIP_CONTEXT = 240, 40
# What the databases wrap a matching word in, in a snippet; turned into `highlights` here. Private-use
# characters: a message that holds one gets a snippet without highlights (never a wrong one).
MARK_START, MARK_END = "\ue000", "\ue001"


@dataclass(frozen=True)
class SearchQuery:
    """The words to find, lower case, each one in every hit (in the message, or in the title); `prefix`:
    the last one also matches the words it begins (the user is still typing it)."""

    terms: tuple[str, ...]
    prefix: bool = False


def parse_query(text: str) -> SearchQuery:
    """The query's words, without the common ones (they would match nearly every message). Quotes,
    operators and other punctuation are not syntax: they separate words, like spaces."""
    words = [word[:TERM_CHARACTERS] for word in WORD.findall(text.lower())]
    typing = bool(words) and WORD.fullmatch(text[-1:]) is not None  # the last word is not finished
    prefix = typing and len(words[-1]) >= PREFIX_MIN and words[-1] not in STOPWORDS
    kept = dict.fromkeys(word for word in words if word not in STOPWORDS)
    if prefix:
        kept.pop(words[-1], None)  # last, whatever came before
        kept[words[-1]] = None
    return SearchQuery(tuple(kept), prefix)


@dataclass
class Candidates:
    """What a store's index found for a query: the owner's newest matching messages, each as (its key in
    the store, its conversation, its score: higher is better), and the titles that match, by conversation."""

    messages: list[tuple[Any, str, float]] = field(default_factory=list)
    titles: dict[str, float] = field(default_factory=dict)

    def best(self, limit: int) -> list[tuple[str, Any | None, float]]:
        """One hit a conversation, best first: (conversation, its best message's key or None when only the
        title matches, rank). Rank: that message's score over the best message's, plus TITLE_WEIGHT times
        the title's over the best title's."""
        best: dict[str, tuple[Any, float]] = {}
        for key, conversation_id, score in self.messages:
            if conversation_id not in best or score > best[conversation_id][1]:
                best[conversation_id] = (key, score)
        top_message = max((score for _, score in best.values()), default=0.0) or 1.0
        top_title = max(self.titles.values(), default=0.0) or 1.0
        ranked = {conversation_id: (key, score / top_message) for conversation_id, (key, score) in best.items()}
        for conversation_id, score in self.titles.items():
            key, rank = ranked.get(conversation_id, (None, 0.0))
            ranked[conversation_id] = (key, rank + TITLE_WEIGHT * score / top_title)
        hits = [(conversation_id, key, rank) for conversation_id, (key, rank) in ranked.items()]
        hits.sort(key=lambda hit: hit[2], reverse=True)
        return hits[:limit]


Ranges = list[tuple[int, int]]


def unmark(marked: str) -> tuple[str, Ranges]:
    """Text with its matching words wrapped in MARK_START and MARK_END, as plain text and the ranges
    [start, end) of those words, in characters (code points)."""
    text: list[str] = []
    ranges: Ranges = []
    length = 0
    start: int | None = None
    for piece in re.split(f"([{MARK_START}{MARK_END}])", marked):
        if piece == MARK_START:
            start = length
        elif piece == MARK_END:
            if start is not None and length > start:
                ranges.append((start, length))
            start = None
        else:
            text.append(piece)
            length += len(piece)
    return "".join(text), ranges


def highlighted(marked: str | None, source: str | None) -> tuple[str, Ranges]:
    """`unmark(marked)`, or (if the source text holds a marker itself, so that the marks cannot be told
    from it) the text without any marker and without highlights."""
    if marked is None:
        return "", []
    if source is not None and (MARK_START in source or MARK_END in source):
        return marked.replace(MARK_START, "").replace(MARK_END, ""), []
    return unmark(marked)


@dataclass
class SearchHit:
    """A conversation that a search found, at its best-matching message (None: its title alone matched).
    `snippet` and `title` are plain text; `highlights` and `title_highlights` say where the query's words
    are in them: the page shows them as text, never as markup."""

    conversation_id: str
    message_id: str | None
    role: Role | None
    title: str | None
    title_highlights: Ranges
    snippet: str
    highlights: Ranges
    rank: float

    def to_wire(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "message_id": self.message_id,
            "role": self.role,
            "title": self.title,
            "title_highlights": [list(pair) for pair in self.title_highlights],
            "snippet": self.snippet,
            "highlights": [list(pair) for pair in self.highlights],
            "rank": round(self.rank, 6),
        }


def assemble(
    ranked: list[tuple[str, Any | None, float]],
    snippets: dict[Any, tuple[str, Role, str, Ranges]],
    titles: dict[str, tuple[str | None, Ranges]],
) -> list[SearchHit]:
    """The hits, in rank order, from what the store read for them: each message's (id, role, snippet,
    highlights) by key, each conversation's (title, highlights). A hit whose rows went meanwhile (a
    delete that committed between the reads) is left out."""
    hits = []
    for conversation_id, key, rank in ranked:
        if conversation_id not in titles or (key is not None and key not in snippets):
            continue
        title, title_highlights = titles[conversation_id]
        message_id, role, snippet, highlights = snippets[key] if key is not None else (None, None, "", [])
        hits.append(SearchHit(conversation_id, message_id, role, title, title_highlights, snippet, highlights, rank))
    return hits


def keys(ranked: Iterable[tuple[str, Any | None, float]]) -> list[Any]:
    """The message keys of ranked hits (those found by a message)."""
    return [key for _, key, _ in ranked if key is not None]


# ---- ranking and snippets from the text itself (SQLite's: see store/sqlite_search.py) --------------

BM25_K1, BM25_B = 1.2, 0.75  # BM25's usual constants (FTS5's too)
TOKEN = re.compile(r"\w+")
CONTEXT_TOKENS = 6  # words shown before the first match in a snippet
# A snippet's words are read this far either side of its first match, never further: enough for
# SNIPPET_TOKENS words of any ordinary text, and a bound on the work for any text at all.
WINDOW = 400


def fold(text: str) -> str:
    """Lower case without diacritics, character for character (the same length: offsets stay true).
    One table of the text's distinct characters, applied in C: a per-character loop in Python took
    seconds over the longest messages."""
    if text.isascii():
        return text.lower()
    return text.translate({ord(character): _fold_character(character) for character in set(text)})


@functools.lru_cache(maxsize=4096)
def _fold_character(character: str) -> str:
    base = unicodedata.normalize("NFKD", character)[:1].lower()
    return base if len(base) == 1 else character


def term_patterns(query: SearchQuery) -> list[re.Pattern[str]]:
    """For each word of the query, the words of a text that it matches, as the index does (about: the
    index stems words, this takes a word's first letters, and a short word with an s or not). Word
    boundaries rather than WORD's class: several times faster in `re`, and only an underscore differs."""
    patterns = []
    for term in (fold(term) for term in query.terms):
        if len(term) < PREFIX_MIN:
            patterns.append(re.compile(rf"\b{re.escape(term)}s?\b"))
        else:
            patterns.append(re.compile(rf"\b{re.escape(term[: max(PREFIX_MIN, len(term) - 3)])}\w*"))
    return patterns


def bm25_scores(texts: list[str], patterns: list[re.Pattern[str]]) -> list[float]:
    """BM25 of each text for the query's words: their counts and the text's length against the average.
    Every text here holds every word (the index found them so), so the words' rarity weighs them alike.
    The callers pass a bounded start of each message (RANKED_CHARACTERS): its cost is bounded too."""
    folded = [fold(text) for text in texts]
    lengths = [text.count(" ") + 1 for text in folded]  # about its words: fast, and enough for BM25
    average = sum(lengths) / len(lengths) if lengths else 1.0
    scores = []
    for text, length in zip(folded, lengths, strict=True):
        norm = BM25_K1 * (1 - BM25_B + BM25_B * length / average)
        counts = [len(pattern.findall(text)) for pattern in patterns]
        scores.append(sum(count * (BM25_K1 + 1) / (count + norm) for count in counts))
    return scores


def matches(text: str, patterns: list[re.Pattern[str]]) -> Ranges:
    """Where the query's words are in the text, in order, as [start, end) character ranges."""
    return _matches(fold(text), patterns, 0, len(text))


def _matches(folded: str, patterns: list[re.Pattern[str]], start: int, end: int) -> Ranges:
    """`matches` of folded text, between `start` and `end` only."""
    found = sorted({match.span() for pattern in patterns for match in pattern.finditer(folded, start, end)})
    ranges: Ranges = []
    for begin, finish in found:
        if not ranges or begin >= ranges[-1][1]:
            ranges.append((begin, finish))
    return ranges


def excerpt(text: str, patterns: list[re.Pattern[str]], size: int = SNIPPET_TOKENS) -> tuple[str, Ranges]:
    """About `size` words of the text from a little before its first match, with … where it was cut,
    and the ranges of the matches in it. Only WINDOW characters either side of the first match are read
    for words, and the snippet is `clip`ped: a text of one 60,000-letter word gives a snippet as short."""
    folded = fold(text)
    first = min((found.start() for pattern in patterns if (found := pattern.search(folded))), default=0)
    low, high = max(0, first - WINDOW), min(len(text), first + WINDOW)
    words = [match.span() for match in TOKEN.finditer(text, low, high)]
    if words and low > 0 and words[0][0] == low:
        words.pop(0)  # a word the window's start cut
    if words and high < len(text) and words[-1][1] == high:
        words.pop()  # or its end
    at = next((n for n, (_, end) in enumerate(words) if end > first), 0)
    begin = max(0, min(at - CONTEXT_TOKENS, len(words) - size))
    last = min(begin + size, len(words)) - 1  # the last word shown
    start = words[begin][0] if words and (begin > 0 or low > 0) else low
    end = words[last][1] if words and (last < len(words) - 1 or high < len(text)) else high
    if end <= first:  # the match is in a word the window cut: up to the window's end, then clipped
        end = high
    return clip(text, start, end, _matches(folded, patterns, start, end))


def clip(text: str, start: int, end: int, ranges: Ranges) -> tuple[str, Ranges]:
    """`text[start:end]`, at most SNIPPET_CHARACTERS of it from a little before its first range, with …
    where the text goes on, and the ranges within what is shown, made relative to it."""
    if end - start > SNIPPET_CHARACTERS:
        first = ranges[0][0] if ranges else start
        start = max(start, min(first - CLIP_CONTEXT, end - SNIPPET_CHARACTERS))
        end = start + SNIPPET_CHARACTERS
    lead = "…" if start > 0 else ""
    shift = len(lead) - start
    shown = lead + text[start:end] + ("…" if end < len(text) else "")
    return shown, [(a + shift, min(b, end) + shift) for a, b in ranges if a >= start and a < end]

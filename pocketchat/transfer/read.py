"""Reading an import file: its bytes to conversation trees, every one checked before any is stored.

An upload may be a hundred megabytes of JSON. Parsing it holds the GIL for seconds (json's parser never
lets it go), so the app never parses one in its own process: `check` runs in a job worker
(pocketchat/jobs), which writes the checked trees to a file, one line of our own format each, and answers
its verdict. The app then reads that file a line at a time, between writes.

It reads the file a conversation at a time (`values`: json's own parser, given one item of the
top-level list at a time), checking and writing each as it goes, so that it holds the largest
conversation, not the whole file: parsed whole, a 100 MB list of empty lists took 2.5 GB. And it runs
within the job's memory budget: a file that needs more is refused, saying so.
"""

import codecs
import gc
import json
import re
import resource
import sys
from collections.abc import Iterator
from itertools import count
from typing import Any, BinaryIO

from pocketchat.transfer.chatgpt import from_chatgpt, is_chatgpt
from pocketchat.transfer.native import from_file, is_native, to_file
from pocketchat.transfer.tree import MAX_CONVERSATIONS, BadFile, ConversationTree

CHUNK = 1 << 20  # bytes read at a time (more while a conversation is longer than what is read of it)
SPACE = re.compile(r"[ \t\n\r]*")
# A parse error this near the end of what is read so far may only be the cut (a `-Infinity` cut short):
# more is read and the conversation parsed again.
CUT_MARGIN = 16


def over_memory(budget: int) -> str:
    """What the user is told when reading their file needs more than `budget` bytes."""
    return f"The file needs more memory than an import may use ({budget / 2**20:,.0f} MiB); split it."


def _no_constant(name: str) -> None:
    raise BadFile(f"The file holds {name}, which is not a JSON number.")


class _Text:
    """A JSON file decoded a piece at a time, parsed a value at a time, with errors placed in the whole file."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.parser = json.JSONDecoder(parse_constant=_no_constant)
        self.read = 0  # bytes of the file read
        self.ended = False  # the file is read to its end
        self.first = True  # no character is decoded yet
        self.text = ""  # the file's text from `start` (characters) on, parsed up to `at`
        self.start = self.at = 0
        self.line, self.line_start = 1, 0  # the line `text` begins on, and where that line begins

    def peek(self) -> str:
        """The next character that is not white space ("" at the end of the file)."""
        while True:
            self.at = SPACE.match(self.text, self.at).end()  # type: ignore[union-attr]  # matches "" at least
            if self.at < len(self.text) or self.ended:
                return self.text[self.at : self.at + 1]
            self._more(CHUNK)

    def value(self) -> Any:
        """The next JSON value, read as far as it goes."""
        self.peek()
        while True:
            try:
                value, end = self.parser.raw_decode(self.text, self.at)
            except json.JSONDecodeError as error:
                cut = error.msg.startswith("Unterminated string") or error.pos >= len(self.text) - CUT_MARGIN
                if self.ended or not cut:
                    raise self.bad(error.msg, error.pos) from None
            except RecursionError:
                raise BadFile("The file's JSON is nested too deeply.") from None
            except ValueError:  # int's limit on digits, which keeps a number's conversion from taking seconds
                digits = f"{sys.get_int_max_str_digits():,}"
                raise BadFile(f"The file holds a number of over {digits} digits, which no conversation has.") from None
            else:
                if end < len(self.text) or self.ended:  # a number at the end of what is read may go on
                    self.at = end
                    if end > CHUNK:  # a long conversation's text is let go while it is checked
                        self._forget()
                    return value
            # At least as much again as the value so far, which is then parsed once more (so a long
            # conversation is parsed about twice over in all, not once a piece).
            self._more(max(CHUNK, len(self.text) - self.at))

    def bad(self, problem: str, at: int) -> BadFile:
        """The file is not JSON: `problem` at `text[at]`, by its line and column in the file."""
        newlines = self.text.count("\n", 0, at)
        line_start = self.start + self.text.rindex("\n", 0, at) + 1 if newlines else self.line_start
        where = f"line {self.line + newlines}, column {self.start + at - line_start + 1}"
        return BadFile(f"The file is not JSON ({problem} at {where}).")

    def rest(self) -> None:
        """Read the rest of the file at once (it is one conversation: read in pieces, it would be parsed
        about twice over)."""
        self._more(-1)

    def _more(self, size: int) -> None:
        """Read on `size` bytes (-1: to the end)."""
        data = self.file.read(size)
        self.ended = not data or size < 0
        begins = self.read  # the file's byte that `data` begins with
        self.read += len(data)
        pending = len(self.decoder.getstate()[0])  # bytes of a character cut at the last piece's end
        try:
            decoded = self.decoder.decode(data, final=self.ended)
        except UnicodeDecodeError as error:
            raise BadFile(f"The file is not UTF-8 text (byte {begins - pending + error.start:,} is not).") from None
        del data  # before the text is joined: a whole file's bytes and two copies of its text would be too many
        if self.first and decoded:  # the file's first character: the byte order mark some editors write?
            self.first, decoded = False, decoded.removeprefix("\ufeff")
        self._forget()
        self.text += decoded

    def _forget(self) -> None:
        """Let go of the text parsed so far."""
        if newlines := self.text.count("\n", 0, self.at):
            self.line += newlines
            self.line_start = self.start + self.text.rindex("\n", 0, self.at) + 1
        self.start += self.at
        self.text = self.text[self.at :]
        self.at = 0


def values(file: BinaryIO) -> Iterator[tuple[str, Any]]:
    """The file's conversations as JSON, one at a time, each with how an error names it: the items of a
    top-level list, or the one top-level value. BadFile where the file is not JSON."""
    text = _Text(file)
    if text.peek() != "[":
        text.rest()
        yield "The conversation", text.value()
    else:
        text.at += 1
        if text.peek() == "]":
            text.at += 1
        else:
            for number in count(1):
                yield f"Conversation {number}", text.value()
                after = text.peek()
                if after not in (",", "]"):
                    raise text.bad("Expecting ',' delimiter", text.at)
                text.at += 1
                if after == "]":
                    break
    if text.peek():
        raise text.bad("Extra data", text.at)


def read_tree(data: Any, where: str) -> ConversationTree:
    """One conversation of an import file: one of our own or one of ChatGPT's `conversations.json` (an
    object with a `mapping`). Checked whole: BadFile at the first thing wrong, naming where it is."""
    if is_native(data):
        return from_file(data, where)
    if is_chatgpt(data):
        return from_chatgpt(data, where)
    raise BadFile(
        f'{where} is neither PocketChat\'s format (an object with "format": "pocketchat.conversation")'
        ' nor ChatGPT\'s (an object with a "mapping").'
    )


def read_trees(file: BinaryIO) -> Iterator[ConversationTree]:
    """The conversations of an import file (one, or a list of them), each checked as it comes; BadFile
    at the first thing wrong."""
    number = 0
    for number, (where, data) in enumerate(values(file), start=1):
        if number > MAX_CONVERSATIONS:
            raise BadFile(f"The file holds over {MAX_CONVERSATIONS:,} conversations; split it.")
        tree = read_tree(data, where)
        del data  # the parsed JSON is let go while its tree is written
        yield tree
    if not number:
        raise BadFile("The file holds no conversation.")


def check(source: str, out: str) -> dict[str, Any]:
    """Read `source`, write its trees to `out` (a line each); the verdict: `{conversations, dropped}`, or
    `{error, status}` for a file that cannot be imported. Run in a job worker (pocketchat/jobs), whose
    memory budget ends it with MemoryError."""
    conversations, dropped = 0, dict[str, int]()
    # Parsing makes millions of containers and no cycle, and the collector walked them again and again:
    # 18 MB of ChatGPT's JSON parsed in 1.07 s with it, 0.38 s without.
    gc.disable()
    try:
        with open(source, "rb") as file, open(out, "w", encoding="utf-8") as lines:
            for tree in read_trees(file):
                lines.write(json.dumps(to_file(tree), ensure_ascii=False) + "\n")
                conversations += 1
                for kind, number in tree.dropped.items():
                    dropped[kind] = dropped.get(kind, 0) + number
    except BadFile as bad:
        return {"error": bad.message, "status": bad.status}
    finally:
        gc.enable()
    return {"conversations": conversations, "dropped": dropped}


if __name__ == "__main__":
    # `python -m pocketchat.transfer.read FILE OUT MEMORY`: the check alone, within MEMORY bytes of
    # address space, its verdict on stdout (to measure the reader's memory: tests, bench).
    budget = int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_AS, (budget, budget))
    over = {"error": over_memory(budget), "status": 413}  # made now: when memory runs out, there may be none
    try:
        verdict = check(sys.argv[1], sys.argv[2])
    except MemoryError:
        verdict = over
    print(json.dumps(verdict))

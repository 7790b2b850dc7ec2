"""Reading an import file whole: its bytes to conversation trees, every one checked before any is stored.

An upload may be a hundred megabytes of JSON. Parsing it holds the GIL for seconds (json's parser never
lets it go), so the app never parses one in its own process: it runs this module as a child process
(`python -m pocketchat.transfer.read FILE OUT`), which writes the checked trees to OUT, one line of our
own format each, and its verdict on stdout. The app then reads OUT a line at a time, between writes.
"""

import json
import os
import sys
from typing import Any

from pocketchat.transfer.chatgpt import from_chatgpt, is_chatgpt
from pocketchat.transfer.native import from_file, is_native, to_file
from pocketchat.transfer.tree import MAX_CONVERSATIONS, BadFile, ConversationTree


def _no_constant(name: str) -> None:
    raise BadFile(f"The file holds {name}, which is not a JSON number.")


def parse(data: bytes) -> Any:
    """The file's JSON, or BadFile saying why it is none."""
    try:
        return json.loads(data.decode("utf-8-sig"), parse_constant=_no_constant)
    except UnicodeDecodeError as error:
        raise BadFile(f"The file is not UTF-8 text (byte {error.start:,} is not).") from None
    except json.JSONDecodeError as error:
        raise BadFile(f"The file is not JSON ({error.msg} at line {error.lineno}, column {error.colno}).") from None
    except RecursionError:
        raise BadFile("The file's JSON is nested too deeply.") from None


def read_trees(data: Any) -> list[ConversationTree]:
    """The conversations of an import file: one of our own (an object), a list of them, or ChatGPT's
    `conversations.json` (a list of conversations with a `mapping`). Checked whole: BadFile at the first
    thing wrong, naming where it is."""
    items = data if isinstance(data, list) else [data]
    if not items:
        raise BadFile("The file holds no conversation.")
    if len(items) > MAX_CONVERSATIONS:
        raise BadFile(f"The file holds over {MAX_CONVERSATIONS:,} conversations; split it.")
    trees = []
    for number, item in enumerate(items, start=1):
        where = f"Conversation {number}" if isinstance(data, list) else "The conversation"
        if is_native(item):
            trees.append(from_file(item, where))
        elif is_chatgpt(item):
            trees.append(from_chatgpt(item, where))
        else:
            raise BadFile(
                f'{where} is neither PocketChat\'s format (an object with "format": "pocketchat.conversation")'
                ' nor ChatGPT\'s (an object with a "mapping").'
            )
    return trees


def main(source: str, out: str) -> int:
    """The child process: read `source`, write its trees to `out` (a line each), print the verdict."""
    try:
        with open(source, "rb") as file:
            trees = read_trees(parse(file.read()))
    except BadFile as bad:
        print(json.dumps({"error": bad.message}))
        return 1
    dropped: dict[str, int] = {}
    with open(out, "w", encoding="utf-8") as file:
        for tree in trees:
            file.write(json.dumps(to_file(tree), ensure_ascii=False) + "\n")
            for kind, count in tree.dropped.items():
                dropped[kind] = dropped.get(kind, 0) + count
    print(json.dumps({"conversations": len(trees), "dropped": dropped}))
    return 0


if __name__ == "__main__":
    os.nice(10)  # reading a file is never urgent: the app's chats get the CPU first
    sys.exit(main(sys.argv[1], sys.argv[2]))

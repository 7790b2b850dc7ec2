"""What the app and its job workers say to each other over a pipe: length-prefixed pickles.

The app trusts what it sends. What comes back was computed from a user's file, in a process that a
crafted file might take over through a parser's bug, so the app unpickles it with an allow-list: plain
data, and the few result and error types the jobs return (no other class can be named, so no pickle
trick can run code in the app).
"""

import io
import pickle
import struct
from typing import Any

HEADER = struct.Struct("!Q")
READY = b"R"  # a worker's first word: it started
# What a worker may be asked to run ("module:function"): each a function of utils/ whose time and memory
# a user's input sets.
JOB_FUNCTIONS = frozenset(
    {
        "utils.read_document:read_document",
        "utils.chunking:chunk_pages",
        "utils.read_image:read_image",
        "utils.calculator:calculate",
        "pocketchat.transfer.read:check",
    }
)
# The classes a worker's answer may hold, beyond plain data (dict, list, str, bytes, numbers...).
ANSWER_CLASSES = frozenset(
    {
        ("utils.read_document", "Page"),
        ("utils.read_document", "UnreadableDocument"),
        ("utils.chunking", "Chunk"),
        ("utils.read_image", "ImageKind"),
        ("utils.read_image", "UnreadableImage"),
        ("utils.calculator", "CalculationError"),
    }
)
SAFE_BUILTINS = frozenset({"ValueError", "MemoryError", "RecursionError"})


class _AnswerUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ANSWER_CLASSES or (module == "builtins" and name in SAFE_BUILTINS):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a job's answer may not hold {module}.{name}")


def frame(value: Any) -> tuple[bytes, bytes]:
    """`value` as one message: its length, then its pickle (written one after the other, not joined: an
    answer may be large)."""
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)), data


def length_of(header: bytes) -> int:
    return HEADER.unpack(header)[0]


def answer_of(data: bytes) -> Any:
    """A worker's answer, unpickled with the allow-list."""
    return _AnswerUnpickler(io.BytesIO(data)).load()

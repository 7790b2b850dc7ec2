"""What one hostile user sends, for each row of issue 30's table ("no single user stalls the server"):
one small generator a row, parameterised by its size, whose defaults are the sizes of the finding. The
tests use them at a size that shows the fault in seconds; bench/hostile.py replays them at full size while
a second user chats.

Each returns bytes (a file to upload or import), a str (an expression, a query), the fake provider's
script (`Reply`s) or an --mcp-config entry (tests/hostile_mcp_server.py). Files are built by hand or with
the libraries the app itself reads them with; nothing is downloaded.
"""

import functools
import json
import math
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fake_openai import Call, Reply

MCP_SERVER = Path(__file__).resolve().parent / "hostile_mcp_server.py"

# ---- row 1: the calculator -------------------------------------------------------------------------


def calculator_expression(exponent: int = 9) -> str:
    """`round(1,-10**exponent)`: rounding to 10**exponent digits makes Python build 10**(10**exponent).
    `utils/calculator.py` bounds `**` and `*` but not `round`: at 7 it takes ~12 s, at 9 it never ends."""
    return f"round(1,-10**{exponent})"


def calculator_replies(exponent: int = 9) -> list[Reply]:
    """The model's side of row 1: a reply that calls the calculator on `calculator_expression`, then the
    answer once its result (or error) came back."""
    call = Call("calculator", {"expression": calculator_expression(exponent)})
    return [Reply(tokens=["Let me compute. "], calls=[call]), Reply(tokens=["Done."])]


# ---- rows 2 and 3: text files --------------------------------------------------------------------


def one_line_text(megabytes: float = 20) -> bytes:
    """A .txt of `megabytes` MB of words on one line, with no sentence end: `utils/chunking.py` slices it
    700 characters at a time, copying the rest of the line for each slice (quadratic)."""
    size = int(megabytes * 1_000_000)
    return (b"lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]


def spaces_text(kilobytes: float = 100) -> bytes:
    """A .txt that is one run of `kilobytes` KB of spaces: `read_document._tidy`'s `[ \\t\\f\\v]+\\n` tries
    the whole run from each of its starts (quadratic; 100 KB ~24 s, 1 MB ~40 min)."""
    return b" " * int(kilobytes * 1000)


# ---- row 4: a PDF whose pages share one content stream -------------------------------------------

PDF_LINE = b"BT /F1 12 Tf 72 712 Td (Hello) Tj ET\n"  # a line of text, drawn again and again


def shared_stream_pdf(pages: int = 20, stream_megabytes: float = 1.0) -> bytes:
    """A ~6.5 KB PDF of `pages` pages that all name one Flate-compressed content stream as /Contents, which
    inflates to `stream_megabytes` MB of text operators: pypdf parses it again for every page (~1-3 s a
    page), so 20 pages hold the app's one document reader for about a minute. Hand-written, correct xref."""
    size = int(stream_megabytes * 1_000_000)
    content = (PDF_LINE * (size // len(PDF_LINE)))[:size]
    stream = zlib.compress(content, 9)
    first_page = 5
    kids = b" ".join(b"%d 0 R" % (first_page + n) for n in range(pages))
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages,
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        *[page + b"/Contents 4 0 R >>"] * pages,
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


# ---- row 5: HTML -----------------------------------------------------------------------------------


def close_tags_html(count: int = 200_000) -> bytes:
    """An .html of `"</" * count` (400 KB): `html.parser` rescans the rest of the buffer at each one
    (quadratic)."""
    return b"</" * count


# ---- row 6: a progressive JPEG of thousands of scans -------------------------------------------


class _Bits:
    """An entropy-coded segment: bits most significant first, 0xFF bytes stuffed, padded with ones."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.value = 0
        self.count = 0

    def put(self, value: int, length: int) -> None:
        self.value = (self.value << length) | value
        self.count += length
        while self.count >= 8:
            self.count -= 8
            byte = (self.value >> self.count) & 0xFF
            self.out += b"\xff\x00" if byte == 0xFF else bytes([byte])
        self.value &= (1 << self.count) - 1

    def done(self) -> bytes:
        if self.count:
            self.put((1 << (8 - self.count)) - 1, 8 - self.count)
        return bytes(self.out)


def _segment(marker: int, body: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, marker, len(body) + 2) + body


def _eob_runs(blocks: int) -> bytes:
    """An AC scan (first or refining) in which every block's band is zero: EOB runs over all `blocks`.
    Symbol r<<4 (EOBr, coded as r in 4 bits by the AC table below), then r bits: a run of 2**r + those bits."""
    bits = _Bits()
    while blocks:
        run = min(blocks, 32767)
        r = run.bit_length() - 1
        bits.put(r, 4)
        bits.put(run - (1 << r), r)
        blocks -= run
    return bits.done()


@functools.cache
def many_scans_jpeg(side: int = 6000, refinements: int = 10) -> bytes:
    """A progressive JPEG, `side`x`side`, mid-grey, of 1 + 3x63x(1 + refinements) scans (2,080 by default,
    ~360 KB: the DC scan is 211 KB of it): every AC coefficient of every component gets a scan of its own,
    then one per bit of successive approximation. A decoder walks every block at every scan, so Pillow
    takes tens of seconds on it; the app decodes it (one image thread) before any quota check.

    Hand-assembled: jpegtran's -scans stops at 100 scans. One Huffman table each for DC (one code: a
    difference of 0) and AC (EOB0..EOB14 in 4 bits); all coefficients 0, a quantisation table of ones."""
    blocks = math.ceil(side / 8) ** 2  # of each component, 1x1 sampling: one per MCU
    head = b"\xff\xd8"
    head += _segment(0xDB, b"\x00" + b"\x01" * 64)  # DQT: table 0, 8-bit, all ones
    components = b"".join(bytes([c, 0x11, 0]) for c in (1, 2, 3))
    head += _segment(0xC2, struct.pack(">BHHB", 8, side, side, 3) + components)  # SOF2: progressive
    dc_table = b"\x00" + bytes([1] + [0] * 15) + b"\x00"  # one code of length 1: category 0
    ac_table = b"\x10" + bytes([0, 0, 0, 15] + [0] * 12) + bytes(r << 4 for r in range(15))
    head += _segment(0xC4, dc_table + ac_table)
    # The DC scan, all three components interleaved, each block's DC difference 0 (one bit each).
    zeros, rest = divmod(3 * blocks, 8)
    dc_data = b"\x00" * zeros + (bytes([(1 << (8 - rest)) - 1]) if rest else b"")  # padded with ones
    scans = [_segment(0xDA, b"\x03\x01\x00\x02\x00\x03\x00" + bytes([0, 0, 0])) + dc_data]
    eob = _eob_runs(blocks)
    for component in (1, 2, 3):
        for k in range(1, 64):
            approximations = [(0, refinements)] + [(a, a - 1) for a in range(refinements, 0, -1)]
            for high, low in approximations:
                sos = bytes([1, component, 0x00, k, k, (high << 4) | low])
                scans.append(_segment(0xDA, sos) + eob)
    return head + b"".join(scans) + b"\xff\xd9"


# ---- rows 7, 8 and 10: import files -------------------------------------------------------------


def chatgpt_chain_export(empty: int = 11_000, kept: int = 8_500) -> bytes:
    """A ChatGPT `conversations.json` (~2.1 MB by default) of one conversation whose `kept` user messages
    all hang under a chain of `empty` nodes without a message: `chatgpt._nearest_kept` walks the whole
    chain up for every message, twice (empty x kept steps: ~10^8)."""
    mapping: dict[str, Any] = {"root": {"id": "root", "message": None, "parent": None, "children": ["e0"]}}
    for n in range(empty):
        child = f"e{n + 1}" if n + 1 < empty else None
        mapping[f"e{n}"] = {"id": f"e{n}", "message": None, "parent": "root" if n == 0 else f"e{n - 1}"}
        mapping[f"e{n}"]["children"] = [child] if child else [f"k{m}" for m in range(kept)]
    for m in range(kept):
        message = {"author": {"role": "user"}, "content": {"content_type": "text", "parts": [f"m{m}"]}}
        mapping[f"k{m}"] = {"id": f"k{m}", "message": message, "parent": f"e{empty - 1}", "children": []}
    conversation = {"title": "chain", "create_time": 1.0, "mapping": mapping, "current_node": f"k{kept - 1}"}
    return json.dumps([conversation], separators=(",", ":")).encode()


def empty_lists_import(megabytes: float = 100) -> bytes:
    """An import of `[[],[],…]`, `megabytes` MB: parsed whole before anything is checked, every `[]` a
    Python list (~25x the file in memory)."""
    count = (int(megabytes * 1_000_000) - 2) // 3
    return b"[" + b"[]," * count + b"[]]"


BIG_MESSAGE_QUERY = "cafe"  # matches every word of `big_message_import`'s message


def big_message_import(megabytes: float = 7) -> bytes:
    """A PocketChat conversation file holding one message of `megabytes` MB of "café au lait": every third
    word matches BIG_MESSAGE_QUERY (folded), and it is not ASCII, so a SQLite search ranks and cuts its
    snippet in Python over the whole text, character by character (~7 s alone, 34 s four at once)."""
    size = int(megabytes * 1_000_000)
    words = "café au lait "
    text = (words * (size // len(words) + 1))[:size].strip()
    message = {"id": "big", "parent_id": None, "role": "user", "content": text, "created_at": 1.0}
    conversation = {"id": "big-message", "title": "a long message", "created_at": 1.0, "updated_at": 1.0}
    data = {"format": "pocketchat.conversation", "version": 1, "conversation": conversation, "messages": [message]}
    return json.dumps(data, ensure_ascii=False).encode()


# ---- row 9: a burst of uploads --------------------------------------------------------------------


@dataclass(frozen=True)
class UploadBurst:
    """Row 9: `count` document uploads of `size` bytes each, sent at once (the bench uploads them)."""

    count: int = 25
    size: int = 19_000_000  # under the 20 MB a file, 25 of them far over the 200 MB a user

    def document(self) -> bytes:
        """One upload: plain prose, short sentences on lines of their own, `size` bytes."""
        line = b"The quick brown fox jumps over the lazy dog.\n"
        return (line * (self.size // len(line) + 1))[: self.size]


# ---- rows 11 and 12: the operator's MCP servers --------------------------------------------------


def flooding_mcp_server(megabytes: float = 100) -> dict[str, Any]:
    """An --mcp-config entry: a server that writes `megabytes` MB without a newline, then exits (started
    again by the app, it floods again). The SDK's stdio reader joins its buffer over and over."""
    return {"command": sys.executable, "args": [str(MCP_SERVER), "--flood", str(megabytes)]}


def many_tools_mcp_server(tools: int = 10_000) -> dict[str, Any]:
    """An --mcp-config entry: a server that lists `tools` tools, every one of them offered to every turn."""
    return {"command": sys.executable, "args": [str(MCP_SERVER), "--tools", str(tools)]}


def mcp_config(**servers: dict[str, Any]) -> str:
    """The text of an --mcp-config file of these servers, by name."""
    return json.dumps({"mcpServers": servers})


# ---- row 13: a reply of thousands of tool calls ---------------------------------------------------


def many_calls_replies(calls: int = 16_000) -> list[Reply]:
    """The model's side of row 13: one reply that makes `calls` tool calls (of the clock: cheap, so the
    cost is the calls' number), then the answer. Most are refused by the per-minute limit; every call and
    result is kept in the reply's steps (5.6 MB at 16,000)."""
    asked = [Call("current_time", {}) for _ in range(calls)]
    return [Reply(calls=asked), Reply(tokens=["Done."])]

"""The leaf helpers that take what a user or a model sends (utils/: the calculator, the clock, reading
and chunking documents) stay linear or bounded on hostile input: each hostile form of issues 30 and 31
answers, or is refused with a clear error, well within a generous deadline. A hostile call runs in a
child process (`within_deadline`): these helpers spin in C code that holds the GIL (the regex engine, big
integers, a parser), which no timeout inside the test's process can interrupt."""

import array
import io
import multiprocessing
import random
import time
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from utils.calculator import CalculationError, calculate, format_number
from utils.chunking import Chunk, chunk_pages
from utils.clock import UnknownTimeZone, current_time
from utils.read_document import Page, UnreadableDocument, read_document

# Seconds a hostile call may take: five times what the slowest here takes on an idle machine (so the
# suite holds at a load of 10 on 2 cores), and well under what each took before its fix.
DEADLINE = 15


def within_deadline(function: Callable[..., Any], *arguments: Any) -> Any:
    """function(*arguments) in a child process: its answer, or its exception raised here; the test
    fails if it runs longer than DEADLINE."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # leaving it kills the child
        try:
            return pool.apply_async(function, arguments).get(DEADLINE)
        except multiprocessing.TimeoutError:
            pytest.fail(f"{function.__name__}{arguments!r:.80} still ran after {DEADLINE} s")


# ---- the calculator ------------------------------------------------------------------------------

BIG = "(2**999)**8"  # 8,000 bits: the largest integer the calculator makes, in 11 characters
HOSTILE_EXPRESSIONS = [
    "round(1,-10**9)",  # took minutes: round computes 10**(10**9) first
    "round(1,-10**7)",
    "round(1.5,-10**9)",
    "round(1,10**9)",
    f"round({BIG},-2410)",
    "10**1000 // 3",
    "10**1000 % 7",
    f"{BIG} // 3",
    "floor(1e308)**7",
    "floor(1e308)**8",
    "ceil(1e308)*" * 8 + "1",
    "log(10**1000)",
    f"log({BIG}, 3)",
    "sqrt(10**1000)",
    "exp(1000)",
    "1e308 % 1e-308",
    f"{BIG} / 3",
    "max(" + ",".join([BIG] * 40) + ")",
    "+".join([BIG] * 40),
    "+".join([f"{BIG}*127"] * 4),  # each 7,999 bits: their sum is past the bound
    "+".join([f"{BIG}//(2**499)**8"] * 18),
    "%".join([BIG] * 40),
    "*".join(["999"] * 120),
    "*".join(["floor(1e308)"] * 7),
    "2**999**999",
    "9**9**9**9",
    "(" * 240 + "1" + ")" * 240,  # deeper than Python's parser goes
    "(" * 190 + "1" + ")" * 190,
    "-" * 499 + "1",
    "+-" * 249 + "1",
    "abs(" * 99 + "1" + ")" * 99,
    "floor(" * 70 + "1e308" + ")" * 70,
    "-(" * 160 + "1" + ")" * 160,
    "+".join(["1"] * 250),
]


def _calculate_each(expressions: list[str]) -> list[tuple[str, str, float]]:
    """(expression, its answer or "refused: why", seconds) for each; any other exception escapes."""
    outcomes = []
    for expression in expressions:
        started = time.perf_counter()
        try:
            outcome = format_number(calculate(expression))
        except CalculationError as error:
            outcome = f"refused: {error}"
        outcomes.append((expression, outcome, time.perf_counter() - started))
    return outcomes


def test_every_hostile_expression_is_answered_or_refused_at_once():
    outcomes = within_deadline(_calculate_each, HOSTILE_EXPRESSIONS)
    for expression, outcome, seconds in outcomes:
        assert seconds < 1, (expression[:60], outcome[:60], seconds)  # milliseconds, in fact
    answers = {expression: outcome for expression, outcome, _ in outcomes}
    assert answers["round(1,-10**9)"] == "refused: round() rounds to at most 2500 digits either side of the point."
    assert answers[f"round({BIG},-2410)"] == "0"
    assert answers["10**1000 // 3"] == "3" * 1000
    assert answers["+".join([f"{BIG}*127"] * 4)] == "refused: The result is too large to compute."
    assert answers["floor(1e308)**8"] == "refused: The power is too large to compute."


def test_round_still_rounds_to_a_few_digits_either_side():
    assert calculate("round(123456, -2)") == 123500
    assert calculate("round(2.675, 2)") == round(2.675, 2)
    assert calculate("round(1, -2500)") == 0 and calculate("round(7, 2500)") == 7


# ---- chunking ------------------------------------------------------------------------------------

SIZE = 700
SHAPES: dict[str, Callable[[], str]] = {
    "one 20 MB line of words": lambda: "word " * 4_000_000,  # took 42 s
    "20 MB of spaces between two words": lambda: "start" + " " * 20_000_000 + "end",  # over 90 s
    "4 MB of '. ', one sentence": lambda: ". " * 2_000_000,  # 20 MB took 28 s
    "4 MB of full stops, each before 1,000 spaces": lambda: ("." + " " * 1000 + "x") * 4000,
    "half a million tiny paragraphs": lambda: "a\n\n" * 500_000,
    "half a million sentences": lambda: "Word. " * 500_000,
    "a sentence of half a million lines": lambda: ".\n" * 500_000,
}


def _chunk_shape(shape: str) -> tuple[int, int, int]:
    """(chunks, longest, chunks of spaces only) of the shape's text chunked."""
    chunks = chunk_pages([Page(None, SHAPES[shape]())])
    return len(chunks), max(len(chunk.text) for chunk in chunks), sum(not chunk.text.strip() for chunk in chunks)


@pytest.mark.parametrize("shape", SHAPES)
def test_chunking_is_linear_in_every_shape_of_text(shape):
    count, longest, blank = within_deadline(_chunk_shape, shape)  # seconds, where quadratic took minutes
    assert count >= 1 and longest <= 2 * SIZE and blank == 0  # "about" SIZE: a paragraph break counts as one


def test_a_run_of_spaces_makes_no_passage():
    chunks = chunk_pages([Page(2, "start" + " " * 5000 + "end")])
    assert [(chunk.text.strip(), chunk.page) for chunk in chunks] == [("start", 2), ("end", 2)]


ORDINARY = (
    "# Owls\n\n"
    "Owls hunt at night. They hear a mouse under snow. Their feathers make no sound!\n\n"
    "Snowy owls live in the Arctic and hunt lemmings in the long summer light. They nest on the ground. "
    "Males are whiter than females, and smaller.\n\n"
    "owl_counts = {'barn': 12, 'tawny': 7, 'little': 3, 'eagle': 1, 'snowy': 0, 'long-eared': 2, 'short-eared': 4}\n"
    "print(sum(owl_counts.values()))\n\n"
    "Short."
)


def test_an_ordinary_text_is_chunked_as_before():
    # Paragraphs, sentences, the short last sentence carried into the next passage, a long line cut:
    # what the code before the rewrite made of this text.
    assert chunk_pages([Page(3, ORDINARY)], size=100, overlap=30) == [
        Chunk("# Owls\n\nOwls hunt at night. They hear a mouse under snow. Their feathers make no sound!", 3),
        Chunk("Snowy owls live in the Arctic and hunt lemmings in the long summer light. They nest on the ground.", 3),
        Chunk("They nest on the ground. Males are whiter than females, and smaller.", 3),
        Chunk(
            "owl_counts = {'barn': 12, 'tawny': 7, 'little': 3, 'eagle': 1, 'snowy': 0, 'long-eared': 2, 'short-e", 3
        ),
        Chunk("ared': 4}\nprint(sum(owl_counts.values()))\n\nShort.", 3),
    ]


# ---- reading text and HTML -----------------------------------------------------------------------


def _read(data: bytes, name: str) -> list[Page] | str:
    """The pages of the file, or why it was refused."""
    try:
        return read_document(io.BytesIO(data), name)
    except UnreadableDocument as error:
        return f"refused: {error}"


SPACES: dict[str, Callable[[], bytes]] = {  # made in the child: no test process holds them all
    "300 KB of spaces": lambda: b"x" + b" " * 300_000 + b"y",  # 100 KB took 24 s, and this 9 times that
    "1 MB of tabs and spaces": lambda: b"x" + b"\t " * 500_000 + b"y",  # about 40 minutes
    "4 MB of spaces": lambda: b"x" + b" " * 4_000_000 + b"y\n",
}


def _read_spaces(shape: str) -> list[Page] | str:
    return _read(SPACES[shape](), "spaces.txt")


@pytest.mark.parametrize("shape", SPACES)
def test_a_long_run_of_spaces_is_tidied_at_once(shape):
    (page,) = within_deadline(_read_spaces, shape)
    assert page.text.startswith("x") and page.text.endswith("y") and " \n" not in page.text


def test_lines_are_tidied_as_before():
    (page,) = read_document(io.BytesIO(b"  a  \t\r\n\r\n\r\n\r\nb \f\vc\t\n\n"), "a.txt")
    assert page.text == "a\n\nb \f\vc"


HOSTILE_HTML: dict[str, Callable[[], str]] = {  # about 1 MB each; the standard library's parser took
    "<": lambda: "<" * 1_000_000,  # from 5 s to over a minute on 400 KB of most of them
    "</": lambda: "</" * 500_000,
    "<!--": lambda: "<!--" * 250_000,
    "<a ": lambda: "<a " * 333_000,
    "<a b=": lambda: "<a b=" * 200_000,
    "<!": lambda: "<!" * 500_000,
    "<![CDATA[": lambda: "<![CDATA[" * 110_000,
    "&#": lambda: "&#" * 500_000,
    "<div>": lambda: "<div>" * 200_000 + "deep",
    "<script></": lambda: "<script>" + "</" * 500_000,
    "<p>x": lambda: "<p>x" * 250_000,
}


def _read_html(form: str) -> list[Page] | str:
    return _read(HOSTILE_HTML[form]().encode(), "page.html")


@pytest.mark.parametrize("form", HOSTILE_HTML)
def test_hostile_html_is_read_or_refused_at_once(form):
    pages = within_deadline(_read_html, form)
    assert pages == "refused: The file has no text." or pages[0].text


PAGE = (
    "<!DOCTYPE html><html><head><title>Owls</title><style>p { color: red }</style>"
    "<script>var secret = 'no';</script></head><body>"
    "<nav><ul><li>Home</li><li>Birds</li></ul></nav>"
    "<h1>Owls &amp; other birds</h1><p>Owls hunt   at\tnight.<br>They hear&nbsp;mice.</p>"
    "<div>A <b>barn</b> owl eats <i>1,000</i> mice a year.<svg><text>drawn</text></svg></div>"
    "<table><tr><td>barn</td><td>12</td></tr><tr><td>tawny</td><td>7</td></tr></table>"
    "<noscript>Turn on JavaScript.</noscript><template><p>hidden</p></template><!-- a comment -->"
    "<pre>owl = 1\nowl += 1</pre>\x00</body></html>"
)


def test_an_html_page_reads_as_before():
    # No head, script, style, svg, noscript, template, comment or NUL; a line for each block: what the
    # standard library's parser made of this page.
    (page,) = read_document(io.BytesIO(PAGE.encode("utf-16")), "owls.html")  # UTF-16: it may hold a NUL
    assert page.text == (
        "Home\n\nBirds\n\nOwls & other birds\n\nOwls hunt at night.\nThey hear\xa0mice.\n\n"
        "A barn owl eats 1,000 mice a year.\n\nbarn12\n\ntawny7\n\nowl = 1\nowl += 1"
    )


def _random_utf16_units(count: int) -> bytes:
    """Fixed random bytes that decode as UTF-16 (no lone surrogate), as a binary file's might."""
    chance = random.Random(31)
    units = (chance.getrandbits(16) for _ in range(count))
    return array.array("H", (unit for unit in units if not 0xD800 <= unit < 0xE000)).tobytes()


BINARY_AFTER_BOM = {
    "integers": b"\xff\xfe" + array.array("i", range(5000)).tobytes(),
    "random bytes": b"\xff\xfe" + _random_utf16_units(5000),
}


@pytest.mark.parametrize("data", BINARY_AFTER_BOM.values(), ids=BINARY_AFTER_BOM.keys())
def test_binary_after_a_utf16_byte_order_mark_is_refused(data):
    with pytest.raises(UnreadableDocument, match="not text"):
        read_document(io.BytesIO(data), "notes.txt")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_utf16_text_is_read(encoding):
    text = "Les chouettes chassent la nuit.\tУ совы большие глаза. 猫头鹰在夜间捕猎。🦉\n" * 40
    data = text.encode(encoding)
    data = data if encoding == "utf-16" else b"\xfe\xff" + data  # a byte order mark, little or big end first
    (page,) = read_document(io.BytesIO(data), "owls.txt")
    assert page.text == text.strip()


# ---- PDFs past pypdf's limits --------------------------------------------------------------------


def _pdf(objects: list[bytes]) -> bytes:
    """A PDF of these objects (the first is the catalog), with a correct cross-reference table."""
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    table = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, table)
    return bytes(out)


def inflating_pdf() -> bytes:
    """One page whose content stream, 120 KB as stored, inflates to 80 MB: past pypdf's 75 MB."""
    content = zlib.compress(b"0 0 m " * 13_400_000, 9)
    return _pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
            b"/Resources << /Font << /F1 5 0 R >> >> >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(content), content),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        ]
    )


def test_a_pdf_past_pypdfs_limits_is_refused_as_too_large():
    with pytest.raises(UnreadableDocument, match=r"too large or complex to read \(Limit reached while decompress"):
        read_document(io.BytesIO(inflating_pdf()), "bomb.pdf")


def test_uploading_a_pdf_past_pypdfs_limits_gets_a_clear_error_and_stores_nothing(app):
    from tests.test_documents import documents, new_conversation, upload

    _, conversation_id = new_conversation(app)
    status, answer = upload(app, conversation_id, "bomb.pdf", inflating_pdf())
    assert status == 422 and "too large or complex to read" in answer["detail"], (status, answer)
    assert documents(app, conversation_id) == []


# ---- the clock -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["localtime", "posixrules", "/etc/localtime", "../../etc/localtime", "posix/Europe/Paris", "right/UTC"]
)
def test_the_clock_refuses_what_is_no_iana_time_zone(name):
    # "localtime" answered the host's own time zone: nobody's business.
    with pytest.raises(UnknownTimeZone, match="use an IANA name"):
        current_time(name)


@pytest.mark.parametrize("name", ["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata", "Etc/GMT+5"])
def test_the_clock_tells_the_time_in_an_iana_time_zone(name):
    assert current_time(name).endswith(f", {name})")


def test_documents_are_embedded_at_a_lower_priority_than_the_chats_and_questions_are_not():
    """A long document's passages take minutes of CPU: the chats get it first (the thread's own nice)."""
    import asyncio
    import os

    from utils.embeddings import LocalEmbedder

    embedder = LocalEmbedder()

    async def priorities() -> tuple[int, int]:
        await embedder.embed(["a passage"])
        await embedder.embed(["a question"], question=True)
        (documents,), (questions,) = embedder._documents._threads, embedder._questions._threads
        return os.getpriority(os.PRIO_PROCESS, documents.native_id), os.getpriority(
            os.PRIO_PROCESS, questions.native_id
        )

    try:
        assert asyncio.run(priorities()) == (
            os.getpriority(os.PRIO_PROCESS, 0) + 10,
            os.getpriority(os.PRIO_PROCESS, 0),
        )
    finally:
        embedder.close()

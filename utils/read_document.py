"""The text of an uploaded file: plain text, Markdown, source code, HTML (its text only) and PDF (its
text layer, page by page). Runs off the event loop: a PDF may take seconds."""

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import BinaryIO

HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
PDF_SUFFIX = ".pdf"
# Text, Markdown and source code: read as UTF-8 (or UTF-16 with a byte order mark) text.
_TEXT_SUFFIXES = (
    ".txt .text .md .markdown .rst .adoc .org .csv .tsv .json .jsonl .yaml .yml .toml .ini .cfg .conf .log .tex "
    ".py .pyi .js .mjs .cjs .ts .tsx .jsx .java .kt .kts .scala .groovy .c .h .cc .cpp .cxx .hpp .hh .cs .go .rs "
    ".rb .php .swift .m .mm .r .jl .lua .pl .pm .sh .bash .zsh .fish .ps1 .bat .sql .css .scss .less .xml .svg "
    ".vue .svelte .dart .ex .exs .erl .hrl .hs .ml .mli .clj .cljs .el .lisp .scm .zig .nim .v .sv .vhd .proto "
    ".graphql .gradle .cmake .mk .dockerfile .env.example .ipynb"
)
TEXT_SUFFIXES = frozenset(_TEXT_SUFFIXES.split())
SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | {PDF_SUFFIX}
PLAIN_NAMES = frozenset({"makefile", "dockerfile", "readme", "license", "changelog"})
MAX_PDF_PAGES = 2000  # a longer PDF is refused: reading one takes minutes
SCANNED = "No text found; scanned PDFs are not read (PocketChat reads a PDF's text layer, and does no OCR)."


@dataclass(frozen=True)
class Page:
    """The text of one page of a PDF (`number` from 1), or of a whole file that has no pages (None)."""

    number: int | None
    text: str


class UnreadableDocument(ValueError):
    """A file that is no document PocketChat can read; the message says why, for the user."""


def kind_of(name: str) -> str:
    """ "text", "html" or "pdf" by the file's name; UnreadableDocument for any other."""
    path = PurePosixPath(name.lower())
    if path.suffix in HTML_SUFFIXES:
        return "html"
    if path.suffix == PDF_SUFFIX:
        return "pdf"
    if path.suffix in TEXT_SUFFIXES or (not path.suffix and path.name in PLAIN_NAMES):
        return "text"
    raise UnreadableDocument(
        f"“{name}” is not a kind of file PocketChat reads: it reads text, Markdown, source code, HTML and PDF."
    )


def read_document(file: BinaryIO, name: str) -> list[Page]:
    """The pages of text of `file`, named `name`; UnreadableDocument says why it cannot be read."""
    kind = kind_of(name)
    if kind == "pdf":
        pages = _read_pdf(file)
    else:
        text = _decode(file.read())
        pages = [Page(None, html_text(text) if kind == "html" else text)]
    pages = [Page(page.number, _tidy(page.text)) for page in pages]
    pages = [page for page in pages if page.text]
    if not pages:
        raise UnreadableDocument(SCANNED if kind == "pdf" else "The file has no text.")
    return pages


# What binary bytes read as UTF-16 give, and text holds next to none of: control characters (but tab,
# line and form feed, carriage return), private-use ones, noncharacters, and the planes Unicode leaves
# unassigned (4 to 13). Random bytes give one in ten of these (private use, mostly).
_NOT_TEXT = re.compile(
    "[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\ue000-\uf8ff\ufdd0-\ufdef\ufffe\uffff\U00040000-\U000dffff\U000f0000-\U0010ffff]"
)


def _decode(data: bytes) -> str:
    """Text from bytes: UTF-8 (or UTF-16 with its byte order mark); Windows-1252 for older text files.
    Bytes that are none of these, that hold NULs, or that read as UTF-16 with more than one character
    in a hundred that no text has, are a binary file, whatever its name says."""
    if not data:
        raise UnreadableDocument("The file is empty.")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        # Almost any bytes decode as UTF-16 (all but lone surrogates): what they decode to tells.
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError:
            pass
        else:
            if _NOT_TEXT.subn("", text)[1] <= len(text) // 100:
                return text
    elif b"\x00" not in data:
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError:
            # Windows-1252 text has few control characters; a binary file has many.
            text = data.decode("cp1252", errors="replace")
            controls = sum(1 for char in text if ord(char) < 32 and char not in "\t\n\r\f")
            if controls <= len(text) // 1000 and text.count("\ufffd") <= len(text) // 1000:
                return text
    raise UnreadableDocument("The file is not text (it holds binary data), though its name says it is.")


def _read_pdf(file: BinaryIO) -> list[Page]:
    # Imported here: a process that never reads a PDF never loads pypdf.
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, LimitReachedError, PdfReadError

    try:
        reader = PdfReader(file)
        if reader.is_encrypted and not reader.decrypt(""):  # an empty user password opens some
            raise FileNotDecryptedError("a password is needed")
        if len(reader.pages) > MAX_PDF_PAGES:
            pages = len(reader.pages)
            raise UnreadableDocument(f"The PDF has {pages} pages; PocketChat reads {MAX_PDF_PAGES} at most.")
        return [Page(number, page.extract_text() or "") for number, page in enumerate(reader.pages, start=1)]
    except FileNotDecryptedError:
        raise UnreadableDocument("The PDF is encrypted (it needs a password); PocketChat cannot read it.") from None
    except UnreadableDocument:
        raise
    except LimitReachedError as error:
        # pypdf's own bounds on the work a file may ask of it (a stream that inflates past 75 MB, a page
        # tree or an array of over 100,000 entries...). Not a PdfReadError, so caught on its own.
        detail = " ".join(str(error).split())[:200].rstrip(".")
        raise UnreadableDocument(f"The PDF is too large or complex to read ({detail}).") from None
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as error:
        # pypdf's own errors (PdfStreamError, a broken cross-reference table), and what a malformed
        # object makes it trip on; the detail helps whoever made the file.
        detail = " ".join(str(error).split())[:200]
        raise UnreadableDocument(f"The PDF is damaged and cannot be read ({detail or type(error).__name__}).") from None


# Spaces at the end of a line. A match starts only where a run of spaces does: without the lookbehind,
# a run with no newline after it was scanned again from each of its spaces (quadratic: 100 KB of
# spaces took 24 s, in the regex engine, which holds the GIL).
_TRAILING_SPACES = re.compile(r"(?<![ \t\f\v])[ \t\f\v]+\n")


def _tidy(text: str) -> str:
    """Spaces and blank lines collapsed; NULs dropped (PostgreSQL text cannot hold them)."""
    text = text.replace("\x00", "").replace("\r\n", "\n").replace("\r", "\n")
    text = _TRAILING_SPACES.sub("\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


# ---- HTML ---------------------------------------------------------------------------------------

SKIPPED = frozenset({"script", "style", "noscript", "template", "head", "svg", "iframe", "object", "canvas"})
_BLOCKS = (
    "p div br li ul ol dl dt dd h1 h2 h3 h4 h5 h6 tr table section article header footer nav aside main pre "
    "blockquote figure figcaption hr title form fieldset details summary"
)
BLOCKS = frozenset(_BLOCKS.split())


class _TextOfHtml:
    """What lxml's HTML parser finds, as it finds it (its parser target): the text, less that of
    SKIPPED elements, with a line break around each block. The parser closes every element it opens
    (implied ends, stray ones dropped), so the depth count cannot drift."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.skipping = 0  # depth inside elements whose text is no content (script, style...)

    def start(self, tag: str, attributes: dict[str, str]) -> None:
        if tag in SKIPPED:
            self.skipping += 1
        elif tag in BLOCKS:
            self.parts.append("\n\n" if tag in ("p", "div", "section", "article", "table") else "\n")

    def end(self, tag: str) -> None:
        if tag in SKIPPED:
            self.skipping -= 1
        elif tag in BLOCKS and tag not in ("br", "hr"):  # empty elements: their start made the line break
            self.parts.append("\n")

    def data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)

    def close(self) -> str:
        return "".join(self.parts)


def html_text(markup: str) -> str:
    """The text a reader sees in an HTML page: no script, style or markup; blocks on lines of their own."""
    # libxml2's parser, in C and linear in the markup: the standard library's went quadratic on
    # repeated broken markup ("</" 200,000 times took 41 s). Imported here, as pypdf is.
    from lxml import etree

    parser = etree.HTMLParser(target=_TextOfHtml())
    parser.feed(markup.replace("\x00", ""))  # dropped, as _tidy drops them (libxml2 reads one as U+FFFD)
    text = re.sub(r"[ \t\r\f\v]+", " ", parser.close())
    return re.sub(r" *\n *", "\n", text)  # linear: runs of spaces are single spaces by now

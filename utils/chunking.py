"""A document's pages cut into passages of a few sentences: what is embedded, searched and cited."""

import re
from dataclasses import dataclass

from utils.read_document import Page

CHUNK_CHARS = 700  # about 150 tokens: within what the embedding model reads (256), one idea or two
OVERLAP_CHARS = 150  # the last sentence of a passage starts the next one, when it is this short
# Possessive (\s++): giving spaces back could never let the lookahead match, and trying each was a
# step per space of a long run after a full stop.
SENTENCE_END = re.compile(r"(?<=[.!?])\s++(?=[\"'(\[]?[A-Z0-9])")


@dataclass(frozen=True)
class Chunk:
    """One passage, and the page it is on (None for a file without pages)."""

    text: str
    page: int | None


def _pieces(text: str, size: int) -> list[tuple[str, str]]:
    """(separator, text) pieces: paragraphs (after a blank line), a paragraph longer than `size` cut into
    sentences (after a space), and a sentence longer than `size` (code, a table) into lines, then slices."""
    pieces: list[tuple[str, str]] = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = paragraph.strip()
        if len(paragraph) <= size:
            pieces += [("\n\n", paragraph)] if paragraph else []
            continue
        for number, sentence in enumerate(SENTENCE_END.split(paragraph)):
            separator = "\n\n" if number == 0 else " "
            if len(sentence) <= size:
                pieces.append((separator, sentence))
                continue
            for line in sentence.split("\n"):
                for start in range(0, len(line), size):
                    # Each slice is tested alone (testing the rest of the line copied it for every
                    # slice: quadratic in one long line), and one of spaces only makes no passage.
                    piece = line[start : start + size]
                    if not piece.isspace():
                        pieces.append((separator, piece))
                        separator = "\n"
                separator = "\n"
    return pieces


def chunk_pages(pages: list[Page], size: int = CHUNK_CHARS, overlap: int = OVERLAP_CHARS) -> list[Chunk]:
    """Passages of up to about `size` characters, each within one page (so that it cites one page),
    made of whole paragraphs or sentences where they fit; a passage starts with the last sentence of
    the one before when that sentence is short, so that an idea cut in two is found whole once."""
    chunks: list[Chunk] = []
    for page in pages:
        current: list[tuple[str, str]] = []
        length = 0
        for separator, piece in _pieces(page.text, size):
            if current and length + len(piece) + 1 > size:
                chunks.append(Chunk(_joined(current), page.number))
                last = current[-1][1]
                current = [("", last)] if len(last) <= overlap and len(last) + len(piece) + 1 <= size else []
                length = sum(len(part) + 1 for _, part in current)
            current.append((separator, piece))
            length += len(piece) + 1
        if current:
            chunks.append(Chunk(_joined(current), page.number))
    return chunks


def _joined(pieces: list[tuple[str, str]]) -> str:
    return "".join(separator + piece for separator, piece in pieces).strip()

"""Real PDFs for the document tests, made with reportlab: with a text layer (a page per text), scanned
(an image and no text), encrypted (AES, by pypdf), and damaged."""

import io

from PIL import Image, ImageDraw
from pypdf import PdfReader, PdfWriter
from reportlab.lib.pagesizes import A4
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen import canvas


def text_pdf(pages: list[str]) -> bytes:
    """A PDF whose page n holds pages[n - 1], wrapped in lines of about 90 characters."""
    out = io.BytesIO()
    pdf = canvas.Canvas(out, pagesize=A4)
    for text in pages:
        y = 800
        for paragraph in text.split("\n\n"):
            words, line = paragraph.split(), ""
            for word in words:
                if len(line) + len(word) > 90:
                    pdf.drawString(50, y, line)
                    y -= 14
                    line = ""
                line = f"{line} {word}".strip()
            pdf.drawString(50, y, line)
            y -= 28
        pdf.showPage()
    pdf.save()
    return out.getvalue()


def scanned_pdf() -> bytes:
    """A page that is a picture of text: no text layer, as a scanner makes it."""
    image = Image.new("RGB", (600, 200), "white")
    ImageDraw.Draw(image).text((20, 80), "This text is only pixels.", fill="black")
    out = io.BytesIO()
    pdf = canvas.Canvas(out, pagesize=A4)
    pdf.drawImage(ImageReader(image), 50, 500, width=500, height=160)
    pdf.showPage()
    pdf.save()
    return out.getvalue()


def encrypted_pdf(password: str = "s3cret") -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf(["A secret page."]))))
    writer.encrypt(password, algorithm="AES-256")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def damaged_pdf() -> bytes:
    """The first bytes of a real PDF, cut off: a header, then nothing that parses."""
    return text_pdf(["Soon cut off."])[:300]

"""Small PDFs made with reportlab, so PDF tests need no files from the internet."""

from __future__ import annotations

import io

from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate, Spacer

Section = tuple[str, list[str]]  # heading, paragraphs

DEFAULT_SECTIONS: list[Section] = [
    (
        "1 Introduction",
        [
            "Large language models have a fixed context window, which limits long conversations "
            "and the analysis of long documents. We study how an agent can page information in "
            "and out of its context, much as an operating system pages memory.",
            "Our system keeps a small working context and a large external store, and it moves "
            "passages between them with function calls that the model itself decides to make.",
        ],
    ),
    (
        "2 Method",
        [
            "The hierarchical memory has a main context and an archival store backed by a "
            "vector index. Retrieval uses both embeddings and keyword search.",
            "Interrupts let the agent yield control while waiting for tools.",
        ],
    ),
    (
        "3 Results",
        [
            "On document question answering the agent answers questions about texts far longer "
            "than its context window, and in multi-session chat it stays consistent.",
        ],
    ),
]


def make_pdf(
    sections: list[Section] = DEFAULT_SECTIONS,
    title: str = "A Test Paper",
    page_break_after: int = 1,
) -> bytes:
    """A PDF with a title, numbered headings and paragraphs; a page break after section N."""
    styles = getSampleStyleSheet()
    story: list = [Paragraph(title, styles["Title"]), Spacer(1, 12)]
    for number, (heading, paragraphs) in enumerate(sections, start=1):
        story.append(Paragraph(heading, styles["Heading2"]))
        for text in paragraphs:
            story.append(Paragraph(text, styles["BodyText"]))
            story.append(Spacer(1, 8))
        if number == page_break_after:
            story.append(PageBreak())
    buffer = io.BytesIO()
    SimpleDocTemplate(buffer, pagesize=A4, title=title, author="Test Author").build(story)
    return buffer.getvalue()


def make_encrypted_pdf(text: str = "secret text", password: str = "pw") -> bytes:
    """A password-protected PDF: ingestion must refuse it with a clear message."""
    from reportlab.lib import pdfencrypt
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    enc = pdfencrypt.StandardEncryption(password, canPrint=0)
    pdf = canvas.Canvas(buffer, encrypt=enc)
    pdf.drawString(72, 720, text)
    pdf.save()
    return buffer.getvalue()


def make_blank_pdf(pages: int = 2) -> bytes:
    """A PDF with pages but no text (like a scan)."""
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer)
    for _ in range(pages):
        pdf.rect(72, 72, 200, 200)
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()

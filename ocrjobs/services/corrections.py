"""Corrections of a page's lines (issue 42, item 7): a person's reading of a line replaces the
engine's in the page's stored result, so that every output — result.txt, .md, .jsonl, the
viewer, the API's pages and the searchable PDF's text layer — reads it with nothing of its own
to change; the engine's reading stays beside it, in the result (``engine_text`` on the line and
on the page) and in a LineCorrection row with who wrote it and when.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from fleetadmin.errors import Conflict, Forbidden, Invalid, NotFound
from ocrjobs.models import Job, LineCorrection, Page, lowest_line_confidence
from ocrjobs.services.outputs import document_pdf_outdated
from ocrjobs.services.pages import result_json

MAX_LINE_CHARS = 2000


def line_text_checked(text) -> str:
    """A corrected line as stored, or Invalid: one line of text, at most MAX_LINE_CHARS."""
    if not isinstance(text, str):
        raise Invalid("text: send the line's corrected text as a string", field="text")
    text = text.strip()
    if not text:
        raise Invalid("text: a corrected line cannot be empty", field="text")
    if "\n" in text or "\r" in text or "\f" in text:
        raise Invalid("text: a line is one line: no line breaks", field="text")
    if len(text) > MAX_LINE_CHARS:
        raise Invalid(f"text: at most {MAX_LINE_CHARS} characters a line ({len(text)} sent)", field="text")
    return text


def may_correct(user, job: Job) -> bool:
    return bool(user.is_staff or job.owner_id == user.pk)


def page_text_with_line(text: str, lines: list, index: int, new: str) -> str:
    """The page's text with line ``index``'s reading replaced by ``new``: each line is found in
    the text after the one before it (the engine's text is its lines, with the breaks between
    paragraphs), so a line read twice on a page is replaced where it is. A text the lines cannot
    be found in (an engine that rewrote them) is made again from the lines, one a line."""
    cursor = 0
    for number, line in enumerate(lines):
        old = str(line.get("text") or "") if isinstance(line, dict) else ""
        at = text.find(old, cursor) if old else -1
        if number == index:
            if at < 0:
                break
            return text[:at] + new + text[at + len(old) :]
        if at >= 0:
            cursor = at + len(old)
    texts = [str(line.get("text") or "") if isinstance(line, dict) else "" for line in lines]
    texts[index] = new
    return "\n".join(texts) + ("\n" if text.endswith("\n") else "")


def line_correct(*, job: Job, page_id: int, line: int, text: str, user) -> LineCorrection:
    """Store ``user``'s reading of line ``line`` of the job's page ``page_id``. Forbidden for
    anyone but the job's owner or staff, NotFound for a page or line the job does not have,
    Conflict for a page not read (nothing to correct), Invalid for bad text. A searchable PDF
    built from the text before is asked for again (outputs workers)."""
    if not may_correct(user, job):
        raise Forbidden(f"only the owner of job {job.pk} or staff may correct its pages")
    text = line_text_checked(text)
    with transaction.atomic():
        page = Page.objects.select_for_update().select_related("document").filter(job=job, pk=page_id).first()
        if page is None:
            raise NotFound(f"job {job.pk} has no page {page_id}")
        result = page.read_result() if page.status == Page.Status.DONE else None
        if not result:
            raise Conflict(f"page {page_id} is {page.status}: only a page read has lines to correct")
        lines = result.get("lines")
        if not isinstance(lines, list) or not 0 <= line < len(lines) or not isinstance(lines[line], dict):
            raise NotFound(f"page {page_id} has no line {line}")
        engine_line = str(lines[line].get("engine_text", lines[line].get("text") or ""))
        page_text = str(result.get("text") or "")
        result.setdefault("engine_text", page_text)
        result["text"] = page_text_with_line(page_text, lines, line, text)
        lines[line] = {**lines[line], "text": text, "engine_text": engine_line}
        result["corrected_lines"] = sum(isinstance(x, dict) and "engine_text" in x for x in lines)
        page.result = result_json(result)
        page.min_line_confidence = lowest_line_confidence(result)  # a corrected line is checked
        page.save(update_fields=["result", "min_line_confidence"])
        correction, _ = LineCorrection.objects.update_or_create(
            page=page, line=line, defaults={"text": text, "engine_text": engine_line, "by": user, "at": timezone.now()}
        )
        document_pdf_outdated(document=page.document)
    return correction

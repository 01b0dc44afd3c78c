"""Whether a PDF page's own text layer can be trusted as text (issue 40, item 3).

A text layer whose font has no usable ToUnicode map extracts as garbage: glyph codes read as
UTF-16 the wrong way round ("䴀甀氀琀椀" for "Multi": each letter's code shifted into the high
byte), U+FFFD, private-use characters, control codes, or characters pdfium itself says it could
not map. Kept as the page's text (a job that skips pages with text) or left beside ours in a
searchable PDF, such a layer is what search and copy find. A page whose layer is unusable is read
whatever the job's mode, and its result says so (``text_layer``, a warning).

Pure functions of the text, and one reading of a pdfium page (the pod's render, the split's
skip): no Django, so that the pod image and the control plane judge a page alike.
"""

from __future__ import annotations

import re

# Share of a layer's characters that may be unreadable before the layer is judged unusable: a
# real page has none (a stray symbol font's bullet at most); a broken font makes all of them so.
UNUSABLE_SHARE = 0.1
# (pdfium marks a hyphen that ends a line as U+0002: not a control code here.)
WHITESPACE = " \t\r\n\x0b\x0c\u00a0\x02"


# Characters no text of a page is made of: a replacement or non-character, private use, a control
# code, or a letter's code shifted into the high byte (the UTF-16 byte order mistake of a broken
# ToUnicode map: U+4D00 for "M"; real CJK text has such code points once in 256). One pattern,
# matched in C: judged a character at a time in Python, a dense page took 1.8 ms.
UNREADABLE = re.compile(
    "[\x00\x01\x03-\x08\x0e-\x1f\x7f-\x9f\ue000-\uf8ff\ufffd\ufffe\uffff\U000f0000-\U0010ffff"
    + "".join(chr(code << 8) for code in range(0x21, 0x7F))
    + "]"
)


def text_layer_problem(text: str, unmapped: int = 0) -> str | None:
    """Why this text layer cannot stand as the page's text, or None when it can (or is empty).
    ``unmapped``: characters the PDF reader found no Unicode for (pdfium's map errors)."""
    chars = len(text) - sum(text.count(c) for c in WHITESPACE)
    if chars <= 0:
        return None
    bad = len(UNREADABLE.findall(text))
    if unmapped >= bad and unmapped / chars >= UNUSABLE_SHARE:
        return f"{unmapped} of its {chars} characters do not map to Unicode"
    if bad / chars >= UNUSABLE_SHARE:
        return f"{bad} of its {chars} characters are mojibake (a font without a usable Unicode map)"
    return None


# Characters asked of pdfium whether it mapped them, spread over the page: a broken font shows in
# any sample, and asking each of a dense page's 3,000 took 10 ms (a page's render takes 15-120).
UNMAPPED_SAMPLE = 300


def page_text_problem(textpage) -> str | None:
    """``text_layer_problem`` of a pypdfium2 text page (the caller holds pdfium's lock)."""
    import pypdfium2.raw as pdfium_c

    count = textpage.count_chars()
    if count <= 0:
        return None
    text = textpage.get_text_range()
    if problem := text_layer_problem(text):
        return problem
    step = max(1, count // UNMAPPED_SAMPLE)
    sample = range(0, count, step)
    unmapped = sum(bool(pdfium_c.FPDFText_HasUnicodeMapError(textpage, i)) for i in sample)
    # (scaled to the page's characters: text_layer_problem judges the share)
    return text_layer_problem(text, unmapped * step)


def mark_unusable(result: dict, problem: str | None) -> dict:
    """A reading of a page whose own text layer is unusable (``problem``) says so: ``text_layer``
    (the searchable PDF draws such a page as an image when its text is visible) and a warning."""
    if problem:
        result["text_layer"] = "unusable"
        result.setdefault("warnings", []).append(f"the page's own text layer is unusable ({problem}): read instead")
    return result

"""OCR pod server: a tiny HTTP front for tesseract that runs inside a GPU/CPU pod.

Deliberately free of Django so the pod image only needs stdlib, Pillow and pytesseract.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_BYTES"]

DEFAULT_MAX_BYTES = 50 * 1024 * 1024

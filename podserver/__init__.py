"""OCR pod server: a small HTTP front for an OCR engine that runs inside a GPU/CPU pod.

Deliberately free of Django: it is what goes into the pod image (see deploy/pod/).
"""

from __future__ import annotations

from .config import DEFAULT_MAX_BYTES

__all__ = ["DEFAULT_MAX_BYTES"]

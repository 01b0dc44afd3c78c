"""The pod's OCR engines, chosen by ENGINE: tesseract (CPU), rapidocr (ONNX Runtime, CPU or CUDA), vlm (vLLM).

``ENGINES`` is the one registry: a new engine is a module here and a line in it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from .base import Engine, PageTimeout

__all__ = ["ENGINES", "Engine", "PageTimeout", "create"]

# name: (module in this package, class); a module is imported only by ``create``, so a pod needs
# only its own engine's extra.
ENGINES: dict[str, tuple[str, str]] = {
    "tesseract": ("tesseract", "TesseractEngine"),
    "rapidocr": ("rapidocr", "RapidOcrEngine"),
    "vlm": ("vlm", "VlmEngine"),
}


def create(name: str, *, model: str = "", device: str = "auto", environ: Mapping[str, str] | None = None) -> Engine:
    """The engine called ``name``."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}")
    module, cls = ENGINES[name]
    engine = getattr(importlib.import_module(f".{module}", __name__), cls)
    return engine(model=model, device=device, environ=environ)

"""The pod's OCR engines, chosen by ENGINE: tesseract (CPU), rapidocr (ONNX Runtime, CPU or CUDA), vlm (vLLM)."""

from __future__ import annotations

from collections.abc import Mapping

from .base import Engine, PageTimeout

__all__ = ["Engine", "PageTimeout", "create"]


def create(name: str, *, model: str = "", device: str = "auto", environ: Mapping[str, str] | None = None) -> Engine:
    """The engine called ``name``; its own package is imported only here, so a pod needs only its engine's extra."""
    if name == "tesseract":
        from .tesseract import TesseractEngine as cls
    elif name == "rapidocr":
        from .rapidocr import RapidOcrEngine as cls
    elif name == "vlm":
        from .vlm import VlmEngine as cls
    else:
        raise ValueError(f"unknown engine {name!r}")
    return cls(model=model, device=device, environ=environ)

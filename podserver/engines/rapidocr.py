"""RapidOCR (PP-OCR detection, direction and recognition models) on ONNX Runtime, CPU or CUDA.

The rapidocr wheel ships its PP-OCR models, so the loading code here is the same on a CPU test
machine and on a GPU pod. On a GPU it uses onnxruntime-gpu's CUDA execution provider with
``cudnn_conv_algo_search: DEFAULT``: rapidocr's default, EXHAUSTIVE, re-searches convolution
algorithms for every new input shape, and pages come in all shapes (measured 4x slower than CPU,
docling#4167). ONNX Runtime falls back to the CPU silently when CUDA cannot start (RapidOCR#650),
so a pod asked for CUDA checks every session's providers and refuses to start on the CPU.

ONNX Runtime cannot be interrupted mid-page: the page time limit is checked when a page ends.
"""

from __future__ import annotations

import time
from importlib.metadata import version
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .base import LATIN_AND_CJK, Engine, PageTimeout, page_result, usable_cpus

CUDA = "CUDAExecutionProvider"


class RapidOcrEngine(Engine):
    name = "rapidocr"
    gives_markdown = False
    gives_boxes = True
    gives_confidence = True

    def load(self) -> None:
        import onnxruntime
        import rapidocr

        available = onnxruntime.get_available_providers()
        cuda_ready = CUDA in available and onnxruntime.get_device() == "GPU"
        if self.requested_device == "cuda" and not cuda_ready:
            raise RuntimeError(
                f"DEVICE=cuda but ONNX Runtime {onnxruntime.__version__} offers {available}: "
                "install onnxruntime-gpu (and only it) with a CUDA and cuDNN it supports"
            )
        use_cuda = self.requested_device == "cuda" or (self.requested_device == "auto" and cuda_ready)
        params: dict[str, Any] = {"Global.log_level": "warning"}
        if use_cuda:
            # The GPU image's CUDA and cuDNN are the pip packages PyTorch brought (nvidia-*-cu12);
            # ONNX Runtime finds them only when told to load them.
            if hasattr(onnxruntime, "preload_dlls"):
                onnxruntime.preload_dlls()
            params |= {
                "EngineConfig.onnxruntime.use_cuda": True,
                "EngineConfig.onnxruntime.cuda_ep_cfg.cudnn_conv_algo_search": "DEFAULT",
                "EngineConfig.onnxruntime.cuda_ep_cfg.device_id": int(self.environ.get("CUDA_DEVICE_ID", "0")),
            }
        if threads := self.environ.get("RAPIDOCR_THREADS"):
            params["EngineConfig.onnxruntime.intra_op_num_threads"] = int(threads)
        self.reader = rapidocr.RapidOCR(params=params)
        # The models load on the first page: read one, so that the providers can be checked now.
        self.reader(_bgr(_probe_page()))
        providers = self.session_providers()
        if use_cuda and any(CUDA not in found for found in providers.values()):
            raise RuntimeError(f"CUDA was asked for, but ONNX Runtime runs {providers}: refusing to run on the CPU")
        self.device = "cuda" if use_cuda else "cpu"
        self.version = f"rapidocr {version('rapidocr')}, onnxruntime {onnxruntime.__version__}"
        self.model = _model_names(self.reader)  # the models it really loaded, whatever MODEL says
        self.languages = sorted(LATIN_AND_CJK)

    def suggested_lanes(self) -> int:
        # On a GPU, a few pages in flight keep it busy while others are pre- and post-processed
        # on the CPU; on a CPU, ONNX Runtime already spreads one page over every core.
        if self.device == "cuda":
            return 4
        return 2 if usable_cpus() >= 8 else 1

    def session_providers(self) -> dict[str, list[str]]:
        """The execution providers each loaded model's session really runs on."""
        found = {}
        for stage in ("text_det", "text_cls", "text_rec"):
            wrapper = getattr(self.reader, stage, None)
            session = getattr(getattr(wrapper, "session", None), "session", None)
            if session is not None:
                found[stage] = list(session.get_providers())
        if not found:
            raise RuntimeError("rapidocr loaded no ONNX Runtime session")
        return found

    def ocr(self, img: Image.Image, lang: str, timeout: float) -> dict[str, Any]:
        started = time.monotonic()
        output = self.reader(_bgr(img))
        if time.monotonic() - started > timeout:
            raise PageTimeout(f"rapidocr took {time.monotonic() - started:.1f} s")
        lines = []
        if output.boxes is not None:
            for box, text, score in zip(output.boxes, output.txts, output.scores, strict=True):
                xs, ys = box[:, 0], box[:, 1]
                bbox = [int(max(0, xs.min())), int(max(0, ys.min())), int(xs.max()), int(ys.max())]
                lines.append({"text": text, "bbox": bbox, "confidence": round(float(score) * 100, 2)})
        lines.sort(key=lambda line: (line["bbox"][1], line["bbox"][0]))  # top to bottom, as tesseract
        confidence = sum(line["confidence"] for line in lines) / len(lines) if lines else 0.0
        text = "\n".join(line["text"] for line in lines)
        return page_result(self, img, text, lines, confidence, started)


def _bgr(img: Image.Image) -> np.ndarray:
    # rapidocr reads an ndarray as OpenCV's BGR; a PIL image would be re-encoded on the way.
    return np.ascontiguousarray(np.asarray(img.convert("RGB"))[:, :, ::-1])


def _probe_page() -> Image.Image:
    font = ImageFont.load_default(size=40)
    img = Image.new("L", (420, 100), 255)
    ImageDraw.Draw(img).text((30, 30), "RapidOCR 2026", font=font, fill=0)
    return img


def _model_names(reader: Any) -> str:
    cfg = reader.cfg

    def name(value: Any) -> str:
        return str(getattr(value, "value", value))  # rapidocr keeps enums in its config

    return f"{name(cfg.Det.ocr_version)} det {name(cfg.Det.model_type)}, rec {name(cfg.Rec.model_type)}"

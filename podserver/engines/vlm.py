"""An OCR vision-language model behind vLLM's OpenAI-compatible chat-completions API, in the same pod.

The default model is olmOCR-2 (allenai/olmOCR-2-7B-1025-FP8). It is asked exactly as olmOCR's own
pipeline asks it: its v4 YAML prompt, then the page as a PNG data URL whose longest side is 1288
pixels, temperature 0.1, up to 8000 new tokens. It answers markdown behind a YAML front matter
(primary_language, is_rotation_valid, rotation_correction, is_table, is_diagram); a page it
reports as rotated is turned and read once more, as olmOCR does. Page confidence is the mean
probability of the tokens of the page's text (``logprobs: true``), as a percentage.

vLLM is started by deploy/pod/entrypoint.sh; ``load`` waits for it to list the model (a 7B
model takes minutes to load), and the pod stays unready until then.
"""

from __future__ import annotations

import base64
import io
import json
import math
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

from PIL import Image

from .base import LATIN_AND_CJK, Engine, PageTimeout, page_result

DEFAULT_URL = "http://127.0.0.1:8001/v1"
DEFAULT_MODEL = "allenai/olmOCR-2-7B-1025-FP8"
TARGET_LONGEST_DIM = 1288
MAX_TOKENS = 8000
TEMPERATURE = 0.1
DEFAULT_START_TIMEOUT = 1800.0

# olmOCR's build_no_anchoring_v4_yaml_prompt(), the prompt olmOCR-2 was trained with.
OLMOCR_PROMPT = (
    "Attached is one page of a document that you must process. "
    "Just return the plain text representation of this document as if you were reading it naturally. "
    "Convert equations to LateX and tables to HTML.\n"
    "If there are any figures or charts, label them with the following markdown syntax "
    "![Alt text describing the contents of the figure](page_startx_starty_width_height.png)\n"
    "Return your output as markdown, with a front matter section on top specifying values for the "
    "primary_language, is_rotation_valid, rotation_correction, is_table, and is_diagram parameters."
)


class VlmError(RuntimeError):
    pass


class VlmEngine(Engine):
    name = "vlm"
    gives_markdown = True
    gives_boxes = False
    gives_confidence = False

    def load(self) -> None:
        self.url = self.environ.get("VLM_URL", DEFAULT_URL).rstrip("/")
        self.api_key = self.environ.get("VLM_API_KEY", "")
        self.model = self.model or DEFAULT_MODEL
        deadline = time.monotonic() + float(self.environ.get("VLM_START_TIMEOUT", DEFAULT_START_TIMEOUT))
        while True:
            try:
                served = [entry["id"] for entry in self._get("/models", timeout=10)["data"]]
                break
            except (OSError, VlmError, KeyError, ValueError) as exc:
                if time.monotonic() > deadline:
                    raise VlmError(f"the VLM server at {self.url} did not answer: {exc}") from None
                time.sleep(2)
        if self.model not in served:
            raise VlmError(f"the VLM server serves {served}, not {self.model}")
        self.version = self._server_version()
        self.device = "cuda"  # vLLM serves from the GPU
        self.languages = sorted(LATIN_AND_CJK)

    def suggested_lanes(self) -> int:
        # vLLM batches whatever is in flight; more pages in flight than its batch only queue
        # inside it. A GPU's memory bounds the batch: ~16 pages per 24 GB beside olmOCR-2's
        # weights is a starting point, to be measured with bench/gpu_engine.py per GPU type.
        memory_mib = gpu_memory_mib()
        if memory_mib is None:
            return 16
        return max(8, min(64, 16 * memory_mib // 24_000))

    def ocr(self, img: Image.Image, lang: str, timeout: float) -> dict[str, Any]:
        started = time.monotonic()
        page = _fit(img)
        answer = self._complete(page, started + timeout)
        if not answer.front.get("is_rotation_valid", True) and answer.rotation in (90, 180, 270):
            # olmOCR's own retry: the model says how far the page is turned; turn it back.
            page = page.rotate(-answer.rotation, expand=True)
            answer = self._complete(page, started + timeout)
        lines = [
            {"text": line, "bbox": None, "confidence": answer.confidence}
            for line in answer.text.splitlines()
            if line.strip()
        ]
        return page_result(
            self,
            img,
            answer.text,
            lines,
            answer.confidence,
            started,
            language=answer.front.get("primary_language"),
            tokens=answer.tokens,
        )

    def _complete(self, page: Image.Image, deadline: float) -> Answer:
        png = io.BytesIO()
        page.save(png, format="PNG")
        request = {
            "model": self.model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": OLMOCR_PROMPT},
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()},
                        },
                    ],
                }
            ],
            "max_tokens": MAX_TOKENS,
            "temperature": TEMPERATURE,
            "logprobs": True,
        }
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PageTimeout("no time left for the VLM")
        try:
            body = self._post("/chat/completions", request, timeout=remaining)
        except TimeoutError:
            raise PageTimeout(f"the VLM did not answer within {remaining:.0f} s") from None
        return parse_completion(body)

    def _server_version(self) -> str:
        # vLLM answers GET /version beside /v1; another server may not.
        try:
            root = self.url.removesuffix("/v1")
            with urllib.request.urlopen(root + "/version", timeout=5) as response:
                return "vllm " + json.load(response)["version"]
        except (OSError, ValueError, KeyError):
            return "unknown"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _get(self, path: str, timeout: float) -> dict[str, Any]:
        request = urllib.request.Request(self.url + path, headers=self._headers())
        return self._send(request, timeout)

    def _post(self, path: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        data = json.dumps(payload).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=self._headers(), method="POST")
        return self._send(request, timeout)

    @staticmethod
    def _send(request: urllib.request.Request, timeout: float) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode(errors="replace")
            raise VlmError(f"VLM server answered {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise TimeoutError(str(exc.reason)) from None
            raise VlmError(f"VLM server unreachable: {exc.reason}") from None


def gpu_memory_mib() -> int | None:
    """The first GPU's memory, from nvidia-smi, or None where there is none."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return int(done.stdout.split()[0]) if done.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


class Answer:
    def __init__(self, front: dict[str, Any], text: str, confidence: float, tokens: int) -> None:
        self.front, self.text, self.confidence, self.tokens = front, text, confidence, tokens

    @property
    def rotation(self) -> int:
        value = self.front.get("rotation_correction", 0)
        return value if isinstance(value, int) else 0


def _fit(img: Image.Image) -> Image.Image:
    """The page with its longest side at olmOCR's 1288 pixels, in RGB."""
    scale = TARGET_LONGEST_DIM / max(img.size)
    page = img.convert("RGB")
    if scale != 1:
        size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
        page = page.resize(size, Image.Resampling.LANCZOS)
    return page


def parse_completion(body: dict[str, Any]) -> Answer:
    """Text, front matter and confidence from a chat-completions answer of olmOCR."""
    try:
        choice = body["choices"][0]
        content = choice["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise VlmError(f"not a chat completion: {str(body)[:200]}") from None
    if choice.get("finish_reason") == "length":
        raise VlmError(f"the model's answer was cut at {MAX_TOKENS} tokens")
    front, text, text_starts = split_front_matter(content)
    tokens = ((choice.get("logprobs") or {}).get("content")) or []
    return Answer(front, text, token_confidence(tokens, text_starts), len(tokens))


def split_front_matter(content: str) -> tuple[dict[str, Any], str, int]:
    """(front matter, text, offset where the text starts) of ``---\\nkey: value\\n---\\ntext``."""
    front: dict[str, Any] = {}
    stripped = content.lstrip()
    if not stripped.startswith("---"):
        return front, content.strip(), 0
    offset = len(content) - len(stripped)
    end = stripped.find("\n---", 3)
    if end == -1:
        return front, content.strip(), 0
    for line in stripped[3:end].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            front[key.strip()] = _scalar(value.strip())
    after = offset + end + len("\n---")
    body = content[after:]
    text = body.strip()
    starts = after + (len(body) - len(body.lstrip()))
    return front, text, starts


def _scalar(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", "~", ""):
        return None
    try:
        return int(raw)
    except ValueError:
        return raw.strip("'\"")


def token_confidence(tokens: list[dict[str, Any]], text_starts: int) -> float:
    """Mean probability (0-100) of the tokens from ``text_starts`` on (the page's text, not the front matter)."""
    position, probabilities = 0, []
    for token in tokens:
        if position >= text_starts and token.get("logprob") is not None:
            probabilities.append(math.exp(max(float(token["logprob"]), -100.0)))
        position += len(token.get("token", ""))
    if not probabilities:  # a page without text: the front matter's certainty is all there is
        probabilities = [math.exp(float(t["logprob"])) for t in tokens if t.get("logprob") is not None]
    return round(100 * sum(probabilities) / len(probabilities), 2) if probabilities else 0.0

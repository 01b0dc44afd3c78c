"""A stand-in for vLLM's OpenAI-compatible server, for the vlm engine's tests.

It speaks the protocol (GET /v1/models, GET /version, POST /v1/chat/completions with logprobs)
and answers the way olmOCR-2 does: YAML front matter, then the page's text. It reads the page
it is sent with tesseract, so the image really travels and is really decoded. It is no model:
the tests that use it check the adapter, not olmOCR.
"""

from __future__ import annotations

import base64
import io
import json
import math
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytesseract
from PIL import Image

MODEL = "allenai/olmOCR-2-7B-1025-FP8"


class StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model: str = MODEL, port: int = 0) -> None:
        self.model = model
        self.requests: list[dict[str, Any]] = []  # every chat request received, parsed
        self.images: list[Image.Image] = []
        # Steering, for one test at a time: answers to give before reading pages for real.
        self.scripted: list[dict[str, Any]] = []
        self.text_probability = 0.9
        super().__init__(("127.0.0.1", port), StandInHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class StandInHandler(BaseHTTPRequestHandler):
    server: StandIn

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.server.model, "object": "model"}]})
        elif self.path == "/version":
            self._json(200, {"version": "0.0-standin"})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": "not found"})
            return
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(request)
        if request.get("model") != self.server.model:
            self._json(404, {"error": f"model {request.get('model')!r} not served"})
            return
        content = request["messages"][0]["content"]
        url = next(part["image_url"]["url"] for part in content if part["type"] == "image_url")
        prefix = "data:image/png;base64,"
        assert url.startswith(prefix), url[:40]
        image = Image.open(io.BytesIO(base64.b64decode(url[len(prefix) :])))
        image.load()
        self.server.images.append(image)
        if self.server.scripted:
            scripted = self.server.scripted.pop(0)
            front, text, finish = scripted["front"], scripted.get("text", ""), scripted.get("finish", "stop")
        else:
            front = "primary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\nis_diagram: False"
            text, finish = pytesseract.image_to_string(image).strip(), "stop"
        self._json(200, completion(front, text, finish, self.server.text_probability, request.get("logprobs")))

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def completion(front: str, text: str, finish: str, text_probability: float, logprobs: bool | None) -> dict[str, Any]:
    """A chat completion as vLLM shapes it; front matter tokens are certain, text tokens have ``text_probability``."""
    head = f"---\n{front}\n---\n"
    tokens = [{"token": piece, "logprob": 0.0} for piece in _pieces(head)]
    tokens += [{"token": piece, "logprob": math.log(text_probability)} for piece in _pieces(text)]
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": head + text},
        "finish_reason": finish,
        "logprobs": {"content": tokens} if logprobs else None,
    }
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "choices": [choice],
        "usage": {"prompt_tokens": 1000, "completion_tokens": len(tokens), "total_tokens": 1000 + len(tokens)},
    }


def _pieces(text: str) -> list[str]:
    # Tokens of four characters: enough to check that only the text's tokens make the confidence.
    return [text[i : i + 4] for i in range(0, len(text), 4)]


def main(argv: list[str]) -> None:
    """Run as a fake ``vllm serve WEIGHTS --served-model-name NAME --port PORT ...`` until killed."""
    model, port = argv[argv.index("--served-model-name") + 1], int(argv[argv.index("--port") + 1])
    server = StandIn(model=model, port=port)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.stop()


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main(sys.argv)

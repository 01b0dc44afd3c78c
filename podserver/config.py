"""The pod server's settings: command-line flags over environment variables over defaults.

In a RunPod pod the control plane sets the environment (PORT, LANES, ENGINE, MODEL, POD_TOKEN,
PAGE_TIMEOUT, ...); the local provider passes flags. The token is read from the environment
only (``POD_TOKEN``, or a file named by ``POD_TOKEN_FILE``), never from a flag: a command line
is readable by every user of the machine through /proc.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .engines import ENGINES

DEFAULT_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_PORT = 8000
DEFAULT_CACHE_BYTES = 2 * 1024**3
DEFAULT_MAX_DOCUMENT_BYTES = 512 * 1024**2
# RunPod's HTTP proxy cuts a request at 100 s (Cloudflare answers 524): a page in a pod must
# end before that with an answer the dispatcher understands (504) rather than a cut.
DEFAULT_PAGE_TIMEOUT, DEFAULT_PAGE_TIMEOUT_IN_RUNPOD = 120.0, 90.0
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Config:
    host: str
    port: int
    lanes: int  # 0: "auto", the engine's choice for this machine once it has loaded
    page_timeout: float
    name: str
    max_bytes: int
    engine: str
    model: str
    device: str
    token: str
    cache_dir: str
    cache_bytes: int
    max_document_bytes: int
    # Seconds without a request from the control plane (one carrying the token) before the server
    # exits, and with it the pod's container, so no GPU bills while the control plane is gone
    # (SkyPilot's autostop). 0: never.
    autostop: float = 0.0

    def __repr__(self) -> str:  # the token must not reach a log through a repr
        return f"Config(host={self.host!r}, port={self.port}, engine={self.engine!r}, token={'set' if self.token else 'none'})"


class ConfigError(ValueError):
    pass


def _positive(kind: type[int | float]) -> Callable[[str], int | float]:
    def parse(raw: str) -> int | float:
        try:
            value = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {raw}")
        return value

    return parse


def _lanes(raw: str) -> int:
    return 0 if raw == "auto" else int(_positive(int)(raw))


def _port(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {raw!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {raw}")
    return value


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost: assume it is reachable from outside


def parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    in_runpod = bool(environ.get("RUNPOD_POD_ID"))
    env = environ.get
    p = argparse.ArgumentParser(prog="python -m podserver", description="OCR pod server")
    p.add_argument(
        "--host",
        default=env("HOST") or ("0.0.0.0" if in_runpod else "127.0.0.1"),
        help="env HOST; 0.0.0.0 inside a RunPod pod (RUNPOD_POD_ID set), else 127.0.0.1",
    )
    p.add_argument("--port", type=_port, default=env("PORT") or DEFAULT_PORT, help="env PORT; 0 picks a free port")
    p.add_argument(
        "--lanes",
        type=_lanes,
        default=env("LANES") or 1,
        help="env LANES: concurrent pages, or auto (the engine picks for the CPUs or GPU it finds)",
    )
    p.add_argument(
        "--page-timeout",
        type=_positive(float),
        default=env("PAGE_TIMEOUT") or (DEFAULT_PAGE_TIMEOUT_IN_RUNPOD if in_runpod else DEFAULT_PAGE_TIMEOUT),
        help="env PAGE_TIMEOUT: seconds per page",
    )
    p.add_argument("--name", default=env("POD_NAME") or socket.gethostname(), help="reported in /v1/models")
    p.add_argument("--max-bytes", type=_positive(int), default=DEFAULT_MAX_BYTES, help="largest raw image body")
    p.add_argument("--engine", choices=ENGINES, default=env("ENGINE") or "tesseract", help="env ENGINE")
    p.add_argument("--model", default=env("MODEL") or "", help="env MODEL: engine-specific model name")
    p.add_argument(
        "--device",
        choices=DEVICES,
        default=env("DEVICE") or "auto",
        help="env DEVICE: auto (CUDA when the engine finds it), cpu, or cuda (fail rather than fall back)",
    )
    p.add_argument("--cache-dir", default=env("DOCUMENT_CACHE_DIR") or "", help="env DOCUMENT_CACHE_DIR")
    p.add_argument(
        "--cache-bytes",
        type=_positive(int),
        default=env("DOCUMENT_CACHE_BYTES") or DEFAULT_CACHE_BYTES,
        help="env DOCUMENT_CACHE_BYTES",
    )
    p.add_argument(
        "--max-document-bytes",
        type=_positive(int),
        default=env("MAX_DOCUMENT_BYTES") or DEFAULT_MAX_DOCUMENT_BYTES,
        help="env MAX_DOCUMENT_BYTES",
    )
    p.add_argument(
        "--autostop",
        type=_seconds_or_off,
        default=env("AUTOSTOP_SECONDS") or 0,
        help="env AUTOSTOP_SECONDS: exit after this many seconds without a request carrying the token (0: never)",
    )
    return p


def _seconds_or_off(raw: str) -> float:
    return 0.0 if raw in ("0", "0.0") else float(_positive(float)(raw))


def read_token(environ: Mapping[str, str]) -> str:
    token = environ.get("POD_TOKEN", "")
    if not token and environ.get("POD_TOKEN_FILE"):
        with open(environ["POD_TOKEN_FILE"]) as fh:
            token = fh.read()
    return token.strip()


def load(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Parse flags and environment; exits (argparse) on a bad value or an open public bind."""
    environ = os.environ if environ is None else environ
    p = parser(environ)
    args = p.parse_args(argv)
    if args.engine not in ENGINES:  # argparse does not check a default (from ENGINE) against choices
        p.error(f"ENGINE must be one of {', '.join(ENGINES)}, not {args.engine!r}")
    if args.device not in DEVICES:
        p.error(f"DEVICE must be one of {', '.join(DEVICES)}, not {args.device!r}")
    token = read_token(environ)
    if not token and not is_loopback(args.host):
        p.error(f"refusing to listen on {args.host} without a token: set POD_TOKEN (or bind 127.0.0.1)")
    return Config(
        host=args.host,
        port=args.port,
        lanes=args.lanes,
        page_timeout=args.page_timeout,
        name=args.name,
        max_bytes=args.max_bytes,
        engine=args.engine,
        model=args.model,
        device=args.device,
        token=token,
        cache_dir=args.cache_dir,
        cache_bytes=args.cache_bytes,
        max_document_bytes=args.max_document_bytes,
        autostop=float(args.autostop),
    )

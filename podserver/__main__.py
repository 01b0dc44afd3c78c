"""CLI: python -m podserver --port PORT [--lanes N] [--page-timeout S] ..."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType

from . import DEFAULT_MAX_BYTES
from .server import make_server


def _positive(kind: type[int | float]) -> Callable[[str], int | float]:
    def parse(raw: str) -> int | float:
        value = kind(raw)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {raw}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m podserver", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--lanes", type=_positive(int), default=1, help="concurrent pages")
    parser.add_argument("--page-timeout", type=_positive(float), default=120.0, help="seconds per page")
    parser.add_argument("--name", default=socket.gethostname(), help="reported in /v1/models")
    parser.add_argument("--max-bytes", type=_positive(int), default=DEFAULT_MAX_BYTES)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from PIL import Image

    from .engine import MAX_PIXELS

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS  # Pillow stops the worst bombs inside Image.open too
    server = make_server(args.host, args.port, args.lanes, args.page_timeout, args.name, args.max_bytes)

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever() to return, and serve_forever() runs in
        # this (the signal-handling) thread, so it must be called from another thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # Handlers go in first: the parent may signal as soon as it reads this line.
    print(f"LISTENING {server.url}", flush=True)

    server.serve_forever()
    server.draining = True
    server.server_close()  # refuse new connections while in-flight pages finish
    _wait_for_lanes(server.lanes, server.lane_count, args.page_timeout + 5)
    return 0


def _wait_for_lanes(lanes: threading.BoundedSemaphore, count: int, budget: float) -> None:
    # A page in flight is bounded by the page timeout, so finishing it beats making
    # the dispatcher redo it; past the budget we exit anyway.
    deadline = time.monotonic() + budget
    for _ in range(count):
        if not lanes.acquire(timeout=max(0.0, deadline - time.monotonic())):
            print("podserver: exiting with pages still in flight", file=sys.stderr)
            return


if __name__ == "__main__":
    sys.exit(main())

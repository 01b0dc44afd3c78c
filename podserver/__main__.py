"""CLI: python -m podserver [--port PORT] [--lanes N] [--page-timeout S] ...; see podserver.config."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from PIL import Image

from .config import Config
from .config import load as load_config
from .documents import CacheInUse
from .pages import MAX_PIXELS
from .sandbox import confine_from_environment
from .server import make_server


def parse_args(argv: Sequence[str] | None = None) -> Config:
    return load_config(argv)


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    # Before any thread starts: the sandbox binds this thread and all it starts afterwards.
    confined = confine_from_environment()
    if confined is not None:
        print(f"podserver: {confined}", file=sys.stderr, flush=True)
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS  # Pillow stops the worst bombs inside Image.open too
    try:
        server = make_server(config, environ=os.environ)
    except (CacheInUse, OSError) as exc:  # a taken port or cache: say so in one line, exit 1
        print(f"podserver: {exc}", file=sys.stderr)
        return 1

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
    _wait_for_lanes(server.lanes, server.lane_count, config.page_timeout + 5)
    server.documents.close()
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

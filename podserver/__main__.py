"""CLI: python -m podserver [--port PORT] [--lanes N] [--page-timeout S] ...; see podserver.config."""

from __future__ import annotations

import os
import signal
import sys
import threading
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

    server.serve_forever()  # returns once stopped, the pages in flight answered (or past their time)
    server.server_close()
    server.documents.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

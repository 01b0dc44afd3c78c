"""PDF pages rendered in child processes, each killed when its page runs past its time limit.

pdfium cannot be interrupted, and a crafted page renders for minutes (fifty thousand thick strokes
make a 3 kB file that takes seconds per page, and more strokes take longer). Rendered in the pod's
own process, such a page would hold its lane past every deadline and, under pdfium's process-wide
lock, every other lane's render too, until the dispatcher gave up on the pod and counted it faulty
(review M5). Here each PDF page renders in one of at most ``workers`` child processes, one page at
a time each. A page that overruns its time limit has its child killed and fails alone
(``RenderTimeout``: the pod answers 504, the page spends an attempt, the pod is not at fault), and
the next page gets a fresh child. A child that dies while rendering (a crash in pdfium) fails its
page as unreadable.

Children are spawned, never forked from the threaded server, and kept between pages: a render
costs the pod one round trip through a pipe with the page's pixels (a few MB at 200 DPI).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from PIL import Image

from . import pages


class RenderTimeout(Exception):
    """The page did not render within its time limit."""


def _serve(conn: Connection) -> None:
    """A child's loop: render each (path, page, dpi) asked for and send back its pixels."""
    while True:
        try:
            path, page, dpi = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        try:
            img = pages.render_pdf_page(Path(path), page, dpi)
            info = {key: img.info[key] for key in (pages.RENDER_DPI, pages.TEXT_LAYER_PROBLEM) if key in img.info}
            conn.send(("ok", img.mode, img.size, img.tobytes(), info))
        except pages.BadImage as exc:
            conn.send(("bad", str(exc)))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class _Child:
    def __init__(self, context) -> None:
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=_serve, args=(theirs,), name="pod-render", daemon=True)
        self.process.start()
        theirs.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


class Renderer:
    """Renders PDF pages in at most ``workers`` children at once; a page waiting for a free child
    waits within its own time limit."""

    def __init__(self, workers: int) -> None:
        self.context = multiprocessing.get_context("spawn")
        self.slots = threading.BoundedSemaphore(workers)
        self.idle: list[_Child] = []
        self.lock = threading.Lock()
        self.closed = False

    def warm(self) -> None:
        """Start one child ahead of the first page (a spawn takes a fraction of a second)."""
        with self.lock:
            if not self.idle and not self.closed:
                self.idle.append(_Child(self.context))

    def render(self, path: Path, page: int, dpi: int, timeout: float) -> Image.Image:
        deadline = time.monotonic() + timeout
        if not self.slots.acquire(timeout=max(0.0, timeout)):
            raise RenderTimeout(f"page {page} did not render within {timeout:g} s (all renderers busy)")
        try:
            child = self._take()
            child.conn.send((str(path), page, dpi))
            if not child.conn.poll(max(0.0, deadline - time.monotonic())):
                child.kill()
                raise RenderTimeout(f"page {page} did not render within {timeout:g} s")
            try:
                answer = child.conn.recv()
            except EOFError:
                child.kill()
                raise pages.BadImage(f"page {page} crashed the PDF renderer") from None
            self._give_back(child)
        finally:
            self.slots.release()
        if answer[0] == "bad":
            raise pages.BadImage(answer[1])
        if answer[0] == "error":
            raise RuntimeError(f"render failed: {answer[1]}")
        _, mode, size, pixels, info = answer
        img = Image.frombytes(mode, size, pixels)
        img.info.update({pages.RENDER_DPI: dpi, **info})
        return img

    def _take(self) -> _Child:
        with self.lock:
            while self.idle:
                child = self.idle.pop()
                if child.process.is_alive():
                    return child
                child.kill()
        return _Child(self.context)

    def _give_back(self, child: _Child) -> None:
        with self.lock:
            if self.closed:
                child.kill()
            else:
                self.idle.append(child)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            children, self.idle = self.idle, []
        for child in children:
            child.kill()

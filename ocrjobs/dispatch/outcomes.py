"""What a pod's HTTP status (other than 200 and 429) makes of a page's attempt: the error stored,
whether the page fails for good, and whether it counts against the pod.
"""

from __future__ import annotations

from dataclasses import dataclass

# RunPod's HTTP proxy answers 524 once a request has taken 100 s; a page that fails so every time
# fails with this, not with Cloudflare's HTML page.
PROXY_TIMEOUT_ERROR = (
    "the page took longer than RunPod's proxy allows (it cuts a request at 100 s; a pod there stops a "
    "page at PAGE_TIMEOUT, 90 s at most): split it or use a faster engine or GPU"
)


@dataclass(frozen=True)
class Failure:
    error: str
    final: bool = False  # the page fails now, whatever attempts it has left
    pod_fault: bool = False  # counts towards draining the pod


def status_failure(status: int, error: str) -> Failure:
    """The failed attempt a pod's answer ``status`` (not 200 or 429) stands for; ``error`` is the
    pod's own message."""
    if status in (400, 413, 415):
        return Failure(f"the pod refused the page: {error}", final=True)
    if status == 504:
        return Failure(error)
    if status == 524:
        # RunPod's proxy cut the request at 100 s: the pod is alive, the page too long for it
        # (pods stop a page at 90 s there). An attempt like a 504, not the pod's fault.
        return Failure(PROXY_TIMEOUT_ERROR)
    return Failure(f"HTTP {status}: {error}", pod_fault=True)

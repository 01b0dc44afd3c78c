"""Helpers of tests/fleetadmin's tests of the front (raw sockets against a real front)."""

from __future__ import annotations

import socket

import pytest


def closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the front sent before it closed the connection, which it must do within ``seconds``
    (a generous bound: the front's checks run once a second)."""
    sock.settimeout(seconds)
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the front still held the connection after {seconds} s (got {answer!r})")
    return answer

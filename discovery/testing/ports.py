"""Loopback ports for local servers.

``free_port``/``free_ports`` pick ports the kernel considers free right now. Nothing reserves
them afterwards, so another process may take one before our server binds it; the server then
fails to start and :meth:`~discovery.testing.process.ManagedProcess.wait_ready` reports
its log (``Address already in use``) instead of hanging.
"""

from __future__ import annotations

import contextlib
import socket

__all__ = ["LOOPBACK", "free_port", "free_ports"]

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that is free at the time of the call.

    Raises ``OSError`` if the host cannot be bound at all.
    """
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """Return ``n`` distinct TCP ports on ``host`` that are free at the time of the call.

    All sockets are held open until every port has been chosen, so the kernel cannot hand out
    the same port twice. Raises ``ValueError`` for a negative ``n`` and ``OSError`` if binding
    fails.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports

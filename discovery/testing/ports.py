"""Free loopback ports for local servers, picked below the kernel's ephemeral range.

Nothing reserves a port once picked: one taken meanwhile fails the server's start with its
log (``Address already in use``), never a hang.

Why below the range: docs/development.md, "The development cluster".
"""

from __future__ import annotations

import contextlib
import random
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
    low, high = _server_range()
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            ports.append(_bind_one(sock, host, low, high))
        return ports


# Ports below this are left alone: well-known and registered services live there.
_LOWEST = 10_000
_ATTEMPTS = 200


def _server_range() -> tuple[int, int]:
    """The ports below the kernel's ephemeral range and above :data:`_LOWEST`, or
    ``(0, 0)`` where the range cannot be read (then a bind to port 0 picks)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as file:
            first = int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return (0, 0)
    if first - 1 - _LOWEST < 1000:
        return (0, 0)  # too narrow a gap to pick from
    return (_LOWEST, first - 1)


def _bind_one(sock: socket.socket, host: str, low: int, high: int) -> int:
    """Bind ``sock`` to a free port of ``low..high`` (any port if the range is empty)."""
    if high:
        rng = random.Random()
        for _ in range(_ATTEMPTS):
            port = rng.randint(low, high)
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    sock.bind((host, 0))
    return int(sock.getsockname()[1])

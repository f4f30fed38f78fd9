"""A real ``redis-server`` for development and tests, on loopback, without persistence.

The server runs in the foreground as our child, with RDB and AOF disabled: the live list it
holds is republished by the leader, so a dev server never needs its data on disk.
``$REDIS_SERVER`` overrides the binary; ``make setup`` installs the Debian package.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from pathlib import Path

from discovery.devcluster.ports import LOOPBACK, free_port
from discovery.devcluster.process import ManagedProcess
from discovery.errors import DevClusterError

__all__ = ["RedisServer", "find_redis_server", "redis_ping"]

logger = logging.getLogger(__name__)

_SETUP_HINT = "run `make setup` (installs the Debian package redis-server)"


def find_redis_server() -> str:
    """Return the ``redis-server`` executable: ``$REDIS_SERVER`` or ``redis-server`` on PATH.

    Raises ``DevClusterError`` naming ``make setup`` if it is not found.
    """
    explicit = os.environ.get("REDIS_SERVER")
    name = explicit or "redis-server"
    found = shutil.which(name)
    if found is None:
        where = (
            f"$REDIS_SERVER={explicit!r} is not an executable"
            if explicit
            else ("no `redis-server` on PATH")
        )
        raise DevClusterError(f"{where}; {_SETUP_HINT}")
    return found


def redis_ping(port: int, host: str = LOOPBACK, timeout: float = 1.0) -> bool:
    """Return True if a Redis server on ``host:port`` answers PING with ``+PONG``.

    Never raises: unreachable, loading (``-LOADING``) or misbehaving servers give False.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            answer = b""
            while b"\r\n" not in answer:
                chunk = sock.recv(64)
                if not chunk:
                    break
                answer += chunk
    except OSError:
        return False
    return answer.startswith(b"+PONG")


class RedisServer(ManagedProcess):
    """One ``redis-server`` on ``127.0.0.1:port`` with its log in ``workdir/redis.log``.

    ``port`` defaults to a free port chosen at construction and kept across restarts; data
    is not kept (persistence is off). ``start()`` returns once the server answers PING
    (``start(wait=False)`` only launches it) and raises ``DevClusterError`` with the log
    tail if it exits or does not answer in time. ``stop()`` is idempotent and always reaps
    the process (SIGTERM, then SIGKILL after its timeout).
    """

    def __init__(self, workdir: str | os.PathLike[str], port: int | None = None) -> None:
        directory = Path(workdir)
        super().__init__("redis", directory, directory / "redis.log")
        self._port = free_port() if port is None else port

    @property
    def port(self) -> int:
        """The TCP port on 127.0.0.1."""
        return self._port

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"{LOOPBACK}:{self._port}"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, for redis-py's ``from_url``."""
        return f"redis://{LOOPBACK}:{self._port}/0"

    def _command(self) -> list[str]:
        return [
            find_redis_server(),
            "--port",
            str(self._port),
            "--bind",
            LOOPBACK,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self._workdir),
            "--logfile",
            str(self._log_path),
        ]

    def _probe(self) -> bool:
        return redis_ping(self._port)

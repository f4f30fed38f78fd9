"""One Redis Sentinel process for tests, the chaos run and ``discovery devcluster``.

A sentinel rewrites its configuration file with what it learns: one restarted on its own
keeps it, one whose configuration is reset writes it anew.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from discovery.errors import DevClusterError

from .ports import LOOPBACK, free_port
from .process import ManagedProcess
from .redis import config_quote, find_redis_server, redis_ping

__all__ = ["DEFAULT_DOWN_AFTER_MS", "Address", "RedisSentinel", "find_redis_sentinel"]

#: ``(host, port)`` of a Redis data server or sentinel.
Address = tuple[str, int]

#: The sentinels' default ``down-after-milliseconds``: 2 s, twice their 1 s ping period.
#: With 1 s, a primary promoted a moment ago is often judged down again before its
#: first PONG comes back (the sentinel's new link counts from its creation, and its
#: first PING goes out a ping period later; redis/redis#8607), and the sentinels fail
#: over a primary that is alive, leaving a stale one taking reads for ~10 s until they
#: convert it.
DEFAULT_DOWN_AFTER_MS = 2000


def find_redis_sentinel() -> str:
    """Return the executable to run as ``<it> <conf> --sentinel``.

    ``$REDIS_SENTINEL`` if set, else ``redis-sentinel`` on PATH, else ``redis-server``
    (:func:`~discovery.testing.redis.find_redis_server`): a sentinel is ``redis-server``
    in sentinel mode, which ``--sentinel`` selects whatever the binary is called.

    Raises:
        DevClusterError: ``$REDIS_SENTINEL`` is not an executable, or neither binary is
            found (naming ``make setup``).
    """
    explicit = os.environ.get("REDIS_SENTINEL")
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise DevClusterError(
                f"$REDIS_SENTINEL={explicit!r} is not an executable; run `make setup` "
                "(installs the Debian package redis-server)"
            )
        return found
    return shutil.which("redis-sentinel") or find_redis_server()


def _write_private(path: Path, text: str) -> None:
    # Created 0600 (not chmod-ed afterwards): the file may hold a password in clear.
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


class RedisSentinel(ManagedProcess):
    """One Redis Sentinel monitoring ``master`` as ``master_name``, on ``host:port``.

    The configuration (``workdir/sentinel.conf``, created 0600 as it may hold
    ``sentinel auth-pass`` and ``requirepass``; the sentinel's own rewrites leave it
    0644) is written at the
    first start and after :meth:`reset_config`;
    other restarts keep the file the sentinel has rewritten with what it learnt (replicas,
    other sentinels, the current primary), as a real deployment does. ``start()`` returns
    once it answers PING; failures raise ``DevClusterError`` with the log tail, and
    ``stop()`` is idempotent and reaps the process, as for every :class:`ManagedProcess`.

    ``password`` is the data servers' (``sentinel auth-pass``); ``sentinel_password`` the
    sentinel's own (``requirepass``: clients must authenticate to ask it anything).
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        master: Address,
        *,
        master_name: str = "mymaster",
        quorum: int = 2,
        down_after_ms: int = DEFAULT_DOWN_AFTER_MS,
        failover_timeout_ms: int = 6000,
        password: str | None = None,
        sentinel_password: str | None = None,
        port: int | None = None,
        host: str = LOOPBACK,
        name: str = "sentinel",
    ) -> None:
        directory = Path(workdir)
        super().__init__(name, directory, directory / "sentinel.log")
        self._host = host
        self._port = free_port(host) if port is None else port
        self._master = master
        self._master_name = master_name
        self._quorum = quorum
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        self._password = password
        self._sentinel_password = sentinel_password
        self._write_config = True

    @property
    def host(self) -> str:
        """The address the sentinel binds and clients connect to."""
        return self._host

    @property
    def port(self) -> int:
        """The TCP port on :attr:`host`."""
        return self._port

    @property
    def address(self) -> str:
        """``<host>:<port>``."""
        return f"{self._host}:{self._port}"

    @property
    def config_path(self) -> Path:
        """``workdir/sentinel.conf``, which the sentinel rewrites as it learns."""
        return self._workdir / "sentinel.conf"

    def reset_config(self, master: Address | None = None) -> None:
        """Write a fresh configuration at the next start, monitoring ``master`` if given
        (else the original one), forgetting what the sentinel had learnt."""
        if master is not None:
            self._master = master
        self._write_config = True

    def _prepare(self) -> None:
        if not self._write_config and self.config_path.is_file():
            return
        name = self._master_name
        lines = [
            f"port {self._port}",
            f"bind {self._host}",
            f"protected-mode {'yes' if self._host == LOOPBACK else 'no'}",
            "daemonize no",
            f"dir {config_quote(str(self._workdir))}",
            f"logfile {config_quote(str(self._log_path))}",
            # "monitor" first: the other "sentinel" directives refer to the master by name.
            f"sentinel monitor {name} {self._master[0]} {self._master[1]} {self._quorum}",
            f"sentinel down-after-milliseconds {name} {self._down_after_ms}",
            f"sentinel failover-timeout {name} {self._failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]
        if self._password is not None:
            lines.append(f"sentinel auth-pass {name} {config_quote(self._password)}")
        if self._sentinel_password is not None:
            lines.append(f"requirepass {config_quote(self._sentinel_password)}")
        _write_private(self.config_path, "\n".join(lines) + "\n")
        self._write_config = False

    def _command(self) -> list[str]:
        return [find_redis_sentinel(), str(self.config_path), "--sentinel"]

    def _probe(self) -> bool:
        return redis_ping(self._port, self._host, password=self._sentinel_password)

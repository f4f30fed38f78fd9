"""A real Redis primary, its replicas and the Sentinels watching them, for tests and tools.

``start()`` returns once a failover can happen; a failed one stops everything it started.
Failovers are forced, or made as a crash makes them; clients use ``redis+sentinel://``.

Development: docs/development.md, "The development cluster".
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import TracebackType

from discovery.errors import DevClusterError

from .ports import LOOPBACK, free_ports
from .process import remaining
from .redis import RedisServer, config_quote
from .sentinelfaults import SentinelFaults
from .sentinelprocess import DEFAULT_DOWN_AFTER_MS, Address, RedisSentinel, find_redis_sentinel
from .sentinelview import SentinelView, address_of

__all__ = [
    "DEFAULT_DOWN_AFTER_MS",
    "RedisSentinel",
    "RedisSentinelGroup",
    "find_redis_sentinel",
]

logger = logging.getLogger(__name__)

# How long a silent primary takes to be judged down while failovers are held: longer
# than any test holds them.
_HELD_DOWN_AFTER_MS = 3_600_000


class RedisSentinelGroup:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels, all real processes.

    Data servers live in ``workdir/redis-<i>`` (``redis-1`` is the first primary),
    sentinels in ``workdir/sentinel-<i>``; ports are chosen at construction and kept.
    The sentinels monitor the primary as ``master_name`` with ``quorum`` (default: a
    majority of the sentinels), ``down_after_ms`` (how long a silent primary takes to be
    judged down) and ``failover_timeout_ms``. With ``password`` the data servers' ``default``
    user needs it (replicas and sentinels are given it); sentinels themselves have none.

    ``start()`` returns once everything is ready (see there); it raises ``DevClusterError``
    with the logs' tails on failure, after stopping everything. ``stop()`` is idempotent
    and reaps every process; the group is also a context manager.

    Raises:
        ValueError: ``replicas`` < 0, ``sentinels`` < 1, ``quorum`` not in
            1..``sentinels``, a non-positive timing, or a ``master_name`` that is empty or
            holds whitespace or ``/`` (it is a path segment of the URL).
        OSError: no free ports could be bound on ``host``.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        replicas: int = 2,
        sentinels: int = 3,
        master_name: str = "mymaster",
        down_after_ms: int = DEFAULT_DOWN_AFTER_MS,
        failover_timeout_ms: int = 6000,
        quorum: int | None = None,
        host: str = LOOPBACK,
        password: str | None = None,
    ) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        if sentinels < 1:
            raise ValueError(f"sentinels must be >= 1, got {sentinels}")
        quorum = sentinels // 2 + 1 if quorum is None else quorum
        if not 1 <= quorum <= sentinels:
            raise ValueError(f"quorum must be 1..{sentinels}, got {quorum}")
        if down_after_ms < 1 or failover_timeout_ms < 1:
            raise ValueError("down_after_ms and failover_timeout_ms must be >= 1")
        if not master_name or "/" in master_name or any(c.isspace() for c in master_name):
            raise ValueError(f"master_name must be one word without '/', got {master_name!r}")
        self._workdir = Path(workdir).absolute()
        self._master_name = master_name
        self._password = password
        self._host = host
        self._down_after_ms = down_after_ms
        config = [
            # Diskless replication waits 5 s by default for more replicas before a full sync.
            "repl-diskless-sync-delay 0",
            # A replica loads a full sync straight from the socket instead of via dump.rdb,
            # so no data lands on disk (and none is loaded at a restart).
            "repl-diskless-load swapdb",
        ]
        if password is not None:
            # Any server may become a replica after a failover, so all of them need it.
            config.append(f"masterauth {config_quote(password)}")
        ports = free_ports(replicas + 1 + sentinels, host)  # all distinct
        self._servers = [
            RedisServer(
                self._workdir / f"redis-{i + 1}",
                port=ports.pop(),
                password=password,
                host=host,
                config=config,
                name=f"redis-{i + 1}",
            )
            for i in range(replicas + 1)
        ]
        first = address_of(self._servers[0])
        self._sentinels = [
            RedisSentinel(
                self._workdir / f"sentinel-{i + 1}",
                first,
                master_name=master_name,
                quorum=quorum,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
                password=password,
                port=ports.pop(),
                host=host,
                name=f"sentinel-{i + 1}",
            )
            for i in range(sentinels)
        ]
        self._view = SentinelView(self._servers, self._sentinels, master_name, password)
        self._faults = SentinelFaults(self._servers, self._sentinels, master_name, self._view)

    # -- addresses ---------------------------------------------------------------------

    @property
    def master_name(self) -> str:
        """The name the sentinels know the primary by."""
        return self._master_name

    @property
    def password(self) -> str | None:
        """The data servers' ``default`` user password, None without one."""
        return self._password

    @property
    def workdir(self) -> Path:
        """The directory holding every server's subdirectory."""
        return self._workdir

    @property
    def servers(self) -> list[RedisServer]:
        """Every data server, primary and replicas, in a fixed order (``redis-1`` first)."""
        return list(self._servers)

    @property
    def sentinels(self) -> list[RedisSentinel]:
        """Every sentinel process."""
        return list(self._sentinels)

    @property
    def sentinel_addresses(self) -> list[Address]:
        """``(host, port)`` of every sentinel."""
        return [(s.host, s.port) for s in self._sentinels]

    def sentinel_url(self, db: int = 0) -> str:
        """``redis+sentinel://h1:p1,h2:p2,.../<master_name>/<db>``, without credentials."""
        hosts = ",".join(s.address for s in self._sentinels)
        return f"redis+sentinel://{hosts}/{self._master_name}/{db}"

    @property
    def running(self) -> bool:
        """True while every data server and sentinel process is running."""
        return all(p.running for p in (*self._servers, *self._sentinels))

    @property
    def pids(self) -> dict[str, int | None]:
        """Process ids by name (``redis-1``.., ``sentinel-1``..); None for a stopped one."""
        return {p.name: p.pid for p in (*self._servers, *self._sentinels)}

    def primary_address(self) -> Address:
        """The primary's address as the first answering sentinel reports it.

        Raises:
            DevClusterError: no sentinel answers with an address.
        """
        return self._view.primary_address()

    @property
    def primary(self) -> RedisServer:
        """The data server the sentinels report as primary (it may have just died).

        Raises:
            DevClusterError: no sentinel answers, or the address is none of ours.
        """
        return self._view.server_at(self._view.primary_address())

    @property
    def replicas(self) -> list[RedisServer]:
        """Every data server other than the current :attr:`primary`."""
        primary = self.primary
        return [s for s in self._servers if s is not primary]

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Start the data servers, then (with ``wait``) everything else; see :meth:`wait_ready`.

        ``redis-1`` starts as the primary and the others as its replicas; sentinels get a
        fresh configuration. ``wait=False`` only launches the data servers, so they boot
        while the caller starts something else; :meth:`wait_ready` finishes the job.

        Raises:
            DevClusterError: a process is already running, cannot start, or (with ``wait``)
                the group is not ready within ``timeout`` seconds; everything started is
                stopped first.
        """
        if any(p.running for p in (*self._servers, *self._sentinels)):
            raise DevClusterError("the sentinel group is already started")
        try:
            first = address_of(self._servers[0])
            for index, server in enumerate(self._servers):
                server.replicaof = None if index == 0 else first
                server.start(wait=False)
            for sentinel in self._sentinels:
                sentinel.reset_config(first)
            if wait:
                self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Finish :meth:`start`: wait for the data servers, the replicas' links to the
        primary, then start the sentinels and wait until each one knows the primary (not
        down), all replicas and all other sentinels.

        Raises:
            DevClusterError: a process exits or the group is not ready within ``timeout``
                seconds (with the logs' tails). Processes are left as they are; the caller
                decides whether to ``stop()``.
        """
        deadline = time.monotonic() + timeout
        for server in self._servers:
            server.wait_ready(remaining(deadline))
        self._view.wait(
            self._view.replicas_linked,
            "the replicas replicate from redis-1",
            deadline,
            alive=self._servers,
        )
        for sentinel in self._sentinels:
            if not sentinel.running:
                sentinel.start(wait=False)
        for sentinel in self._sentinels:
            sentinel.wait_ready(remaining(deadline))
        self._view.wait(
            self._view.sentinels_converged,
            "every sentinel sees the whole group",
            deadline,
            alive=[*self._servers, *self._sentinels],
        )
        logger.info(
            "sentinel group ready: %s, primary %s, %d replicas",
            self.sentinel_url(),
            self._servers[0].address,
            len(self._servers) - 1,
        )

    def stop(self) -> None:
        """Stop every sentinel, then every data server (no failover during the stop).

        Idempotent. All processes are stopped and reaped even if one fails to stop; the
        first failure is then raised as ``DevClusterError``.
        """
        first_error: Exception | None = None
        for process in (*self._sentinels, *self._servers):
            try:
                process.stop()
            except Exception as exc:  # keep stopping the rest; report the first failure
                first_error = first_error or exc
        if first_error is not None:
            raise DevClusterError(
                f"could not stop the sentinel group: {first_error}"
            ) from first_error

    # -- faults (carried out by :class:`~discovery.testing.sentinelfaults.SentinelFaults`) --

    def failover(self, timeout: float = 30.0) -> Address:
        """Force a failover (``SENTINEL FAILOVER``) and wait until it is complete.

        A sentinel refuses while it has no replica fit to promote (``NOGOODSLAVE``, e.g.
        right after a failover, until it has heard from the replicas again) or another
        failover is under way (``INPROG``); the request is then repeated until one accepts.
        Returns the new primary's address, once every running sentinel reports it, it says
        ``role:master`` and no sentinel has a failover in progress (so another can follow).
        The old primary stays a primary until the sentinels turn it into a replica, some
        8-10 s later (:meth:`wait_replicated` waits for that); they then disconnect its
        clients, so Sentinel-aware clients move to the new one.

        Raises:
            DevClusterError: no sentinel accepted the request, or the failover did not
                complete, within ``timeout`` seconds.
        """
        return self._faults.failover(timeout)

    def hold_failovers(self) -> None:
        """Start no failover until :meth:`release_failovers`: every running sentinel
        judges a silent primary down only after an hour, so a primary killed meanwhile
        stays unreachable, however slow the machine, for as long as a test needs.

        Raises:
            redis.RedisError, OSError: a running sentinel did not take the setting.
        """
        self._faults.set_down_after(_HELD_DOWN_AFTER_MS)

    def release_failovers(self) -> None:
        """The group's own ``down_after_ms`` again: a primary silent all along is judged
        down at once, and a failover follows."""
        self._faults.set_down_after(self._down_after_ms)

    def kill_primary(self) -> RedisServer:
        """SIGKILL the current primary, as a crash would, and return it (reaped, stopped).

        The sentinels elect a new primary after ``down_after_ms`` plus an election; wait for
        it with :meth:`wait_for_new_primary`, and bring the old one back with
        :meth:`restart`.

        Raises:
            DevClusterError: no sentinel knows the primary, or it is not running.
        """
        return self._faults.kill_primary()

    def wait_for_new_primary(self, previous: Address, timeout: float = 30.0) -> Address:
        """Wait until every running sentinel reports the same primary other than
        ``previous``, that server answers ``role:master`` and no sentinel has a failover in
        progress; return its address.

        Raises:
            DevClusterError: not so within ``timeout`` seconds (with the logs' tails).
        """
        return self._faults.wait_for_new_primary(previous, timeout)

    def restart(self, server: RedisServer, timeout: float = 30.0) -> None:
        """(Re)start ``server`` as a replica of the current primary and wait until it
        replicates from the primary every running sentinel reports (a later failover's
        included) and every running sentinel sees it as a replica that is up.

        Use this, not ``server.restart()``, after a failover: the server is started with
        ``replicaof`` the primary the sentinels report now (a server the sentinels still
        take for the primary starts as the primary again). A running server is stopped
        first.

        Raises:
            ValueError: ``server`` is not one of this group's data servers.
            DevClusterError: it cannot start, or is not a replica seen by every sentinel
                within ``timeout`` seconds; it is then left running, for the logs.
        """
        self._faults.restart(server, timeout)

    def wait_replicated(self, timeout: float = 30.0) -> None:
        """Wait until every running data server other than the primary replicates from it
        (``master_link_status:up``), e.g. after a failover, before checking replicas' data.

        Raises:
            DevClusterError: not so within ``timeout`` seconds.
        """
        self._faults.wait_replicated(timeout)

    def __enter__(self) -> RedisSentinelGroup:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"<RedisSentinelGroup {self._master_name} servers={len(self._servers)} "
            f"sentinels={len(self._sentinels)} dir={self._workdir}>"
        )

"""Redis high availability for tests, the chaos run and ``discovery devcluster``: a real
primary, its replicas and the Sentinels that watch them.

:class:`RedisSentinelGroup` runs every one of them as a ``redis-server`` child process on
a free port of ``host`` (loopback by default), persistence off, each in a subdirectory of
one work directory with its log there. ``start()`` returns once the replicas replicate and
every sentinel knows the primary, all replicas and all other sentinels, so a failover can
happen right away; ``failover()`` forces one, ``kill_primary()`` makes one happen the way
a crash does, and ``restart()`` brings a stopped server back as a replica of whoever is
primary now. Clients reach the group through :meth:`RedisSentinelGroup.sentinel_url`,
``redis+sentinel://h1:p1,h2:p2,.../<master name>/<db>``.

:class:`RedisSentinel` is one sentinel: ``redis-server <conf> --sentinel``, where the
binary is ``$REDIS_SENTINEL``, else ``redis-sentinel`` on PATH, else ``redis-server``
(:func:`find_redis_sentinel`). Sentinels rewrite their configuration file with what they
learn; a sentinel restarted on its own keeps it, a group started afresh writes it anew.

Every wait polls a condition with a deadline and fails with ``DevClusterError`` carrying
the tails of the logs; a failed ``start()`` stops everything it had started.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from discovery.errors import DevClusterError

from .ports import LOOPBACK, free_port, free_ports
from .process import ManagedProcess, log_tails, remaining
from .redis import (
    RedisServer,
    config_quote,
    find_redis_server,
    redis_command,
    redis_ping,
    redis_query,
)

__all__ = [
    "DEFAULT_DOWN_AFTER_MS",
    "RedisSentinel",
    "RedisSentinelGroup",
    "find_redis_sentinel",
]

logger = logging.getLogger(__name__)

Address = tuple[str, int]

_POLL_INTERVAL_S = 0.05
# Each process's log tail in a group's error message: enough to see why, for five or more.
_TAIL_LINES = 12

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


def _query(address: Address, *command: str, password: str | None = None) -> Any:
    return redis_query(*address, *command, password=password)


def _fields(reply: Any) -> dict[str, str]:
    """A flat ``[key, value, key, value, ...]`` reply (``SENTINEL MASTER``) as a dict."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    if not isinstance(reply, list):
        return {}
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


def _info(address: Address, password: str | None) -> dict[str, str]:
    """``INFO replication`` of a data server as a dict; empty if it does not answer."""
    reply = _query(address, "INFO", "replication", password=password)
    if not isinstance(reply, dict):
        return {}
    return {str(k): str(v) for k, v in reply.items()}


def _address_of(server: RedisServer) -> Address:
    return (server.host, server.port)


class RedisSentinel(ManagedProcess):
    """One Redis Sentinel monitoring ``master`` as ``master_name``, on ``host:port``.

    The configuration (``workdir/sentinel.conf``, created 0600 as it may hold
    ``sentinel auth-pass``; the sentinel's own rewrites leave it 0644) is written at the
    first start and after :meth:`reset_config`;
    other restarts keep the file the sentinel has rewritten with what it learnt (replicas,
    other sentinels, the current primary), as a real deployment does. ``start()`` returns
    once it answers PING; failures raise ``DevClusterError`` with the log tail, and
    ``stop()`` is idempotent and reaps the process, as for every :class:`ManagedProcess`.
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
        _write_private(self.config_path, "\n".join(lines) + "\n")
        self._write_config = False

    def _command(self) -> list[str]:
        return [find_redis_sentinel(), str(self.config_path), "--sentinel"]

    def _probe(self) -> bool:
        return redis_ping(self._port, self._host)


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
        first = _address_of(self._servers[0])
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
        for sentinel in self._sentinels:
            address = self._sentinel_primary(sentinel)
            if address is not None:
                return address
        raise DevClusterError(f"no sentinel knows the address of {self._master_name!r}")

    @property
    def primary(self) -> RedisServer:
        """The data server the sentinels report as primary (it may have just died).

        Raises:
            DevClusterError: no sentinel answers, or the address is none of ours.
        """
        return self._server_at(self.primary_address())

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
            first = _address_of(self._servers[0])
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
        self._wait(
            self._replicas_linked,
            "the replicas replicate from redis-1",
            deadline,
            alive=self._servers,
        )
        for sentinel in self._sentinels:
            if not sentinel.running:
                sentinel.start(wait=False)
        for sentinel in self._sentinels:
            sentinel.wait_ready(remaining(deadline))
        self._wait(
            self._sentinels_converged,
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

    # -- faults ------------------------------------------------------------------------

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
        deadline = time.monotonic() + timeout
        while True:
            old = self.primary_address()
            refusals: list[str] = []
            for sentinel in self._sentinels:
                if not sentinel.running:
                    continue
                try:
                    redis_command(
                        sentinel.host, sentinel.port, "SENTINEL", "FAILOVER", self._master_name
                    )
                except (redis.RedisError, OSError) as exc:
                    refusals.append(f"{sentinel.name}: {exc}")
                    continue
                logger.info("%s forced a failover away from %s:%d", sentinel.name, *old)
                return self.wait_for_new_primary(old, remaining(deadline))
            if time.monotonic() >= deadline:
                raise DevClusterError(
                    f"no sentinel started a failover within {timeout:g} s: "
                    f"{'; '.join(refusals) or 'none is running'}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def kill_primary(self) -> RedisServer:
        """SIGKILL the current primary, as a crash would, and return it (reaped, stopped).

        The sentinels elect a new primary after ``down_after_ms`` plus an election; wait for
        it with :meth:`wait_for_new_primary`, and bring the old one back with
        :meth:`restart`.

        Raises:
            DevClusterError: no sentinel knows the primary, or it is not running.
        """
        primary = self.primary
        pid = primary.pid
        if pid is None or not primary.running:
            raise DevClusterError(f"the primary {primary.name} is not running")
        os.kill(pid, signal.SIGKILL)
        # ``running`` polls the child, which reaps it once the kill has landed.
        self._wait(lambda: not primary.running, f"{primary.name} is dead", time.monotonic() + 10)
        primary.stop()  # only bookkeeping now: its pid goes, as for any stopped server
        logger.info("killed the primary %s (pid %d)", primary.name, pid)
        return primary

    def wait_for_new_primary(self, previous: Address, timeout: float = 30.0) -> Address:
        """Wait until every running sentinel reports the same primary other than
        ``previous``, that server answers ``role:master`` and no sentinel has a failover in
        progress; return its address.

        Raises:
            DevClusterError: not so within ``timeout`` seconds (with the logs' tails).
        """
        started = time.monotonic()
        found: list[Address] = []

        def promoted() -> bool:
            addresses = {self._sentinel_primary(s) for s in self._sentinels if s.running}
            if len(addresses) != 1:
                return False
            (address,) = addresses
            if address is None or address == previous:
                return False
            if _info(address, self._password).get("role") != "master":
                return False
            for sentinel in self._sentinels:
                if sentinel.running:
                    fields = self._sentinel_master(sentinel)
                    if "failover_in_progress" in fields.get("flags", "failover_in_progress"):
                        return False
            found[:] = [address]
            return True

        self._wait(promoted, f"a primary other than {previous[0]}:{previous[1]}", started + timeout)
        logger.info("new primary %s:%d after %.1f s", *found[0], time.monotonic() - started)
        return found[0]

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
        if not any(server is s for s in self._servers):
            raise ValueError(f"{server!r} is not a data server of this group")
        deadline = time.monotonic() + timeout
        server.stop()
        primary = self.primary_address()
        own = _address_of(server)
        server.replicaof = None if primary == own else primary
        server.start(timeout=remaining(deadline))
        if primary == own:
            return

        def rejoined() -> bool:
            # The primary is read again on every poll: the sentinels may fail over once
            # more while the server rejoins (with a short down-after on a loaded machine a
            # live primary can be judged down), and then they repoint the server to the
            # new primary, which is what rejoining means.
            running = [s for s in self._sentinels if s.running]
            current = {self._sentinel_primary(s) for s in running}
            if len(current) != 1:
                return False
            (now,) = current
            if now is None:
                return False
            if now == own:
                return _info(own, self._password).get("role") == "master"
            info = _info(own, self._password)
            if info.get("role") != "slave" or info.get("master_link_status") != "up":
                return False
            if (info.get("master_host"), info.get("master_port")) != (now[0], str(now[1])):
                return False
            return all(self._sentinel_sees_replica(s, own) for s in running)

        self._wait(
            rejoined,
            f"{server.name} is a replica of the primary every sentinel reports"
            f" ({primary[0]}:{primary[1]} when it started)",
            deadline,
            alive=[server],
        )

    def wait_replicated(self, timeout: float = 30.0) -> None:
        """Wait until every running data server other than the primary replicates from it
        (``master_link_status:up``), e.g. after a failover, before checking replicas' data.

        Raises:
            DevClusterError: not so within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout

        def linked() -> bool:
            primary = self.primary_address()
            return all(
                self._replicates_from(s, primary)
                for s in self._servers
                if s.running and _address_of(s) != primary
            )

        self._wait(linked, "every running replica replicates from the primary", deadline)

    # -- conditions --------------------------------------------------------------------

    def _replicates_from(self, server: RedisServer, primary: Address) -> bool:
        info = _info(_address_of(server), self._password)
        return (
            info.get("role") == "slave"
            and info.get("master_link_status") == "up"
            and (info.get("master_host"), info.get("master_port")) == (primary[0], str(primary[1]))
        )

    def _replicas_linked(self) -> bool:
        first = _address_of(self._servers[0])
        return all(self._replicates_from(s, first) for s in self._servers[1:])

    def _sentinels_converged(self) -> bool:
        first = self._servers[0]
        for sentinel in self._sentinels:
            fields = self._sentinel_master(sentinel)
            if (
                fields.get("ip") != first.host
                or fields.get("port") != str(first.port)
                or fields.get("flags") != "master"
                or fields.get("num-slaves") != str(len(self._servers) - 1)
                or fields.get("num-other-sentinels") != str(len(self._sentinels) - 1)
            ):
                return False
            # A replica counts once the sentinel has had its INFO: before, it is not fit
            # to promote and a failover would be refused (NOGOODSLAVE).
            fit = [
                replica
                for replica in self._sentinel_replicas(sentinel)
                if replica.get("flags") == "slave" and replica.get("master-link-status") == "ok"
            ]
            if len(fit) != len(self._servers) - 1:
                return False
        return True

    def _sentinel_master(self, sentinel: RedisSentinel) -> dict[str, str]:
        return _fields(
            _query((sentinel.host, sentinel.port), "SENTINEL", "MASTER", self._master_name)
        )

    def _sentinel_primary(self, sentinel: RedisSentinel) -> Address | None:
        reply = _query(
            (sentinel.host, sentinel.port),
            "SENTINEL",
            "GET-MASTER-ADDR-BY-NAME",
            self._master_name,
        )
        if not isinstance(reply, list | tuple) or len(reply) != 2:
            return None
        try:
            return (str(reply[0]), int(reply[1]))
        except ValueError:
            return None

    def _sentinel_replicas(self, sentinel: RedisSentinel) -> list[dict[str, str]]:
        reply = _query((sentinel.host, sentinel.port), "SENTINEL", "REPLICAS", self._master_name)
        return [_fields(entry) for entry in reply] if isinstance(reply, list) else []

    def _sentinel_sees_replica(self, sentinel: RedisSentinel, address: Address) -> bool:
        for fields in self._sentinel_replicas(sentinel):
            if (fields.get("ip"), fields.get("port")) == (address[0], str(address[1])):
                return fields.get("flags") == "slave"
        return False

    def _server_at(self, address: Address) -> RedisServer:
        for server in self._servers:
            if _address_of(server) == address:
                return server
        raise DevClusterError(f"the sentinels report {address[0]}:{address[1]}, not ours")

    def _wait(
        self,
        condition: Callable[[], bool],
        what: str,
        deadline: float,
        alive: Sequence[ManagedProcess] = (),
    ) -> None:
        """Poll ``condition`` until it holds; raise with the logs' tails at the deadline,
        or at once if a process of ``alive`` has exited."""
        while not condition():
            dead = [p.name for p in alive if not p.running]
            if dead:
                raise DevClusterError(
                    f"{', '.join(dead)} exited while waiting until {what}\n{self._log_tails()}"
                )
            if time.monotonic() >= deadline:
                raise DevClusterError(f"not reached in time: {what}\n{self._log_tails()}")
            time.sleep(_POLL_INTERVAL_S)

    def _log_tails(self) -> str:
        return log_tails((*self._servers, *self._sentinels), _TAIL_LINES)

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

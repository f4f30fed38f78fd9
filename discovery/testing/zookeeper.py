"""Real ZooKeeper servers for development and tests: one JVM per server, on loopback.

A :class:`ZooKeeperEnsemble` is one standalone server or a quorum of three or more; each
server keeps its data in its own directory, so a restart comes back with it on its port.

Development: docs/development.md, "The development cluster".
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from discovery.errors import DevClusterError

from .ports import LOOPBACK, free_port, free_ports
from .process import ManagedProcess
from .zkconfig import JVM_FLAGS, ZooKeeperTls, find_java, four_letter_word, zookeeper_classpath

__all__ = [
    "DEFAULT_MAX_SESSION_TIMEOUT_MS",
    "DEFAULT_PRE_ALLOC_KB",
    "DEFAULT_TICK_TIME_MS",
    "QuorumPeer",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "ZooKeeperTls",
    "find_java",
    "four_letter_word",
    "zookeeper_classpath",
]

logger = logging.getLogger(__name__)

# ZooKeeper's own default of 2000 ms makes the minimum session timeout 4 s, which makes every
# session-expiry test slow; 500 ms keeps failure detection quick on a single machine.
DEFAULT_TICK_TIME_MS = 500
DEFAULT_MAX_SESSION_TIMEOUT_MS = 60_000
#: ``preAllocSize``: how far ZooKeeper grows its transaction log at a time, in KiB.
DEFAULT_PRE_ALLOC_KB = 4096

_STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
_QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


@dataclass(frozen=True)
class QuorumPeer:
    """One member of an ensemble as the others see it: its id, address and peer ports."""

    server_id: int
    quorum_port: int
    election_port: int
    host: str = LOOPBACK


class ZooKeeperServer(ManagedProcess):
    """One ZooKeeper JVM listening on ``host:client_port`` (``host`` 127.0.0.1 by default;
    a network lab's gateway address to be reachable from its namespaces).

    ``workdir`` is this server's own directory: it gets ``zoo.cfg``, ``data/`` (with
    ``myid`` for ensemble members; ``data_dir`` puts it elsewhere, say on a small
    filesystem of its own) and ``zookeeper.log``. ``pre_alloc_kb`` is ZooKeeper's
    ``preAllocSize``: a small one makes nearly every write grow the log, so that a full
    disk refuses the next write rather than one a few megabytes later. Without
    ``peers`` the server runs standalone (``ZooKeeperServerMain``); with ``peers``
    (which must include ``server_id``) it is a quorum member (``QuorumPeerMain``).
    With ``tls`` the client port speaks only TLS (:class:`ZooKeeperTls`; the peers
    still talk in plaintext), and readiness is probed over TLS.

    ``start()`` returns once the server actually serves (``start(wait=False)`` only launches
    the JVM). Constructor arguments are validated with ``ValueError``.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        server_id: int = 1,
        client_port: int | None = None,
        tick_time_ms: int = DEFAULT_TICK_TIME_MS,
        min_session_timeout_ms: int | None = None,
        max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS,
        peers: Sequence[QuorumPeer] = (),
        host: str = LOOPBACK,
        launcher: Sequence[str] = (),
        data_dir: str | os.PathLike[str] | None = None,
        pre_alloc_kb: int = DEFAULT_PRE_ALLOC_KB,
        tls: ZooKeeperTls | None = None,
    ) -> None:
        if server_id < 1:
            raise ValueError(f"server_id must be >= 1, got {server_id}")
        if tick_time_ms < 1:
            raise ValueError(f"tick_time_ms must be >= 1, got {tick_time_ms}")
        if pre_alloc_kb < 1:
            raise ValueError(f"pre_alloc_kb must be >= 1, got {pre_alloc_kb}")
        min_timeout = 2 * tick_time_ms if min_session_timeout_ms is None else min_session_timeout_ms
        if not 0 < min_timeout <= max_session_timeout_ms:
            raise ValueError(
                f"need 0 < min_session_timeout_ms ({min_timeout}) <= "
                f"max_session_timeout_ms ({max_session_timeout_ms})"
            )
        if peers and server_id not in {p.server_id for p in peers}:
            raise ValueError(f"server_id {server_id} is not among the peers {list(peers)}")
        if len({p.server_id for p in peers}) != len(peers):
            raise ValueError(f"peer ids must be unique: {list(peers)}")
        directory = Path(workdir)
        super().__init__(f"zookeeper-{server_id}", directory, directory / "zookeeper.log")
        self._server_id = server_id
        self._client_port = free_port() if client_port is None else client_port
        self._tick_time_ms = tick_time_ms
        self._min_session_timeout_ms = min_timeout
        self._max_session_timeout_ms = max_session_timeout_ms
        self._peers = tuple(sorted(peers, key=lambda p: p.server_id))
        self._host = host
        self._launcher = tuple(launcher)
        self._data_dir = directory / "data" if data_dir is None else Path(data_dir)
        self._pre_alloc_kb = pre_alloc_kb
        self._tls = tls

    @property
    def server_id(self) -> int:
        """The ZooKeeper server id (``myid``)."""
        return self._server_id

    @property
    def client_port(self) -> int:
        """The port clients connect to."""
        return self._client_port

    @property
    def address(self) -> str:
        """``<host>:<client port>``, usable as a kazoo hosts string."""
        return f"{self._host}:{self._client_port}"

    @property
    def tls(self) -> ZooKeeperTls | None:
        """The client port's TLS (None: plaintext)."""
        return self._tls

    def four_letter_word(self, word: str, timeout: float = 2.0) -> str:
        """Send a four-letter command to this server (over TLS with :attr:`tls`).

        Raises ``OSError`` if the server cannot be reached (see :func:`four_letter_word`).
        """
        context = None if self._tls is None else self._tls.client_context()
        return four_letter_word(self._client_port, word, self._host, timeout, context=context)

    @property
    def tick_time_ms(self) -> int:
        """ZooKeeper's tick: the unit of heartbeats and of the session timeout bounds."""
        return self._tick_time_ms

    @property
    def _sync_limit_ticks(self) -> int:
        return max(5, math.ceil(5_000 / self._tick_time_ms))

    @property
    def sync_limit(self) -> float:
        """Seconds a quorum member waits for its peer (a follower for its leader, the
        leader for a follower's acknowledgement) before it gives the link up: how long
        the ensemble takes to notice that its leader stopped answering."""
        return self._sync_limit_ticks * self._tick_time_ms / 1000

    @property
    def config_path(self) -> Path:
        """The ``zoo.cfg`` written before each start."""
        return self._workdir / "zoo.cfg"

    @property
    def data_dir(self) -> Path:
        """Snapshots and transaction logs; kept across restarts."""
        return self._data_dir

    def mode(self) -> str | None:
        """Return ``standalone``, ``leader`` or ``follower`` while serving, else None.

        Never raises: an unreachable or not-yet-serving server gives None.
        """
        try:
            answer = self.four_letter_word("srvr", timeout=1.0)
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.partition(":")[2].strip()
        return None

    def _command(self) -> list[str]:
        main_class = _QUORUM_MAIN if self._peers else _STANDALONE_MAIN
        return [
            *self._launcher,
            find_java(),
            *JVM_FLAGS,
            "-cp",
            zookeeper_classpath(netty=self._tls is not None),
            main_class,
            str(self.config_path),
        ]

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self._tick_time_ms}",
            f"dataDir={self.data_dir}",
            f"minSessionTimeout={self._min_session_timeout_ms}",
            f"maxSessionTimeout={self._max_session_timeout_ms}",
            "admin.enableServer=false",
            # Every client connects from 127.0.0.1 here; ZooKeeper's default limit of 60
            # connections per address would refuse a fleet of 100 simulated servers.
            "maxClientCnxns=0",
            "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons",
            # The transaction log is still written to the OS before each reply, so data
            # survives a process restart; skipping fsync only risks data on an OS crash,
            # and makes writes much faster for tests.
            "forceSync=no",
            # ZooKeeper pads each transaction log to 64 MB by default; 4 MB is plenty here
            # (a disk-full test wants it small, so that the next write needs new space).
            f"preAllocSize={self._pre_alloc_kb}",
            # Every election writes a snapshot and starts a new log (some 50 KB a minute
            # in a chaos run): purged hourly, as in production, a long-running dev
            # cluster or soak keeps its data directory to about an hour's worth.
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        if self._tls is None:
            lines += [f"clientPort={self._client_port}", f"clientPortAddress={self._host}"]
        else:
            keystore = self._workdir / "keystore.pem"
            self._tls.write_keystore(keystore)
            lines += self._tls.zoo_cfg(port=self._client_port, host=self._host, keystore=keystore)
        if self._peers:
            # The limits count ticks. With the short ticks we use for short sessions,
            # ZooKeeper's usual 10 and 5 ticks would give a follower 0.5 s to answer its
            # leader: a busy machine (a JVM starting next door) then drops followers and
            # loses quorum by itself. Keep them at the usual seconds instead.
            init_limit = max(10, math.ceil(20_000 / self.tick_time_ms))
            lines += [f"initLimit={init_limit}", f"syncLimit={self._sync_limit_ticks}"]
            lines += ["reconfigEnabled=false"]
            lines += [
                f"server.{p.server_id}={p.host}:{p.quorum_port}:{p.election_port}"
                for p in self._peers
            ]
            (self.data_dir / "myid").write_text(f"{self._server_id}\n", encoding="ascii")
        self.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _probe(self) -> bool:
        # `ruok` answers `imok` as soon as the port is open, even while a quorum member is
        # still electing; `srvr` reports a Mode only once the server really serves.
        try:
            answer = self.four_letter_word("srvr", timeout=1.0)
        except OSError:
            return False
        return "Mode:" in answer


class ZooKeeperEnsemble:
    """A standalone ZooKeeper (``size`` 1) or a quorum of ``size`` >= 3 servers on loopback.

    ``host`` binds every server to another address (a network lab's gateway);
    ``server_hosts`` gives each server an address of its own and ``launchers`` a command
    prefix each (``Host.wrap([])``: the server runs inside that lab host's namespace),
    so that a link between two servers can be cut; ``data_dirs``, ``pre_alloc_kb`` and
    ``tls`` are each server's (see :class:`ZooKeeperServer`).

    Ports are chosen when the ensemble is constructed and kept for its lifetime, so
    :attr:`hosts` is stable across ``stop_server``/``start_server``. Server ``i`` lives in
    ``workdir/zk<i+1>``. Use as a context manager to start and stop it.
    """

    def __init__(
        self,
        size: int,
        workdir: str | os.PathLike[str],
        *,
        tick_time_ms: int = DEFAULT_TICK_TIME_MS,
        min_session_timeout_ms: int | None = None,
        max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS,
        host: str = LOOPBACK,
        server_hosts: Sequence[str] | None = None,
        launchers: Sequence[Sequence[str]] | None = None,
        data_dirs: Sequence[str | os.PathLike[str]] | None = None,
        pre_alloc_kb: int = DEFAULT_PRE_ALLOC_KB,
        tls: ZooKeeperTls | None = None,
    ) -> None:
        if size < 1 or size == 2:
            raise ValueError(
                f"an ensemble needs 1 server (standalone) or 3 or more (a quorum), got {size}"
            )
        self._workdir = Path(workdir)
        self._tick_time_ms = tick_time_ms
        peer_ports = free_ports(3 * size if size > 1 else 1)
        client_ports = peer_ports[:size]
        addresses = list(server_hosts) if server_hosts is not None else [host] * size
        prefixes = [list(p) for p in launchers] if launchers is not None else [[]] * size
        data: list[str | os.PathLike[str] | None] = (
            list(data_dirs) if data_dirs is not None else [None] * size
        )
        if len(addresses) != size or len(prefixes) != size or len(data) != size:
            raise ValueError(
                f"need one server host, launcher and data directory per server ({size})"
            )
        peers: list[QuorumPeer] = []
        if size > 1:
            peers = [
                QuorumPeer(
                    i + 1, peer_ports[size + 2 * i], peer_ports[size + 2 * i + 1], addresses[i]
                )
                for i in range(size)
            ]
        self._servers = [
            ZooKeeperServer(
                self._workdir / f"zk{i + 1}",
                server_id=i + 1,
                client_port=client_ports[i],
                tick_time_ms=tick_time_ms,
                min_session_timeout_ms=min_session_timeout_ms,
                max_session_timeout_ms=max_session_timeout_ms,
                peers=peers,
                host=addresses[i],
                launcher=prefixes[i],
                data_dir=data[i],
                pre_alloc_kb=pre_alloc_kb,
                tls=tls,
            )
            for i in range(size)
        ]

    @property
    def size(self) -> int:
        """The number of servers."""
        return len(self._servers)

    @property
    def servers(self) -> list[ZooKeeperServer]:
        """The servers, in id order (a copy of the list)."""
        return list(self._servers)

    @property
    def hosts(self) -> str:
        """The kazoo connection string ``127.0.0.1:p1,127.0.0.1:p2,...``."""
        return ",".join(server.address for server in self._servers)

    @property
    def tick_time_ms(self) -> int:
        """The tick time every server runs with."""
        return self._tick_time_ms

    @property
    def workdir(self) -> Path:
        """The directory holding one sub-directory per server."""
        return self._workdir

    @property
    def running(self) -> bool:
        """True if every server process is running (not necessarily serving)."""
        return all(server.running for server in self._servers)

    def start(self, timeout: float = 60.0) -> None:
        """Launch every server that is not running, then wait until all of them serve.

        The JVMs boot in parallel, so this takes about as long as the slowest one. On any
        failure (or interruption) every server is stopped before the error propagates;
        failures are ``DevClusterError`` with the failing server's log tail.
        """
        deadline = time.monotonic() + timeout
        try:
            for server in self._servers:
                if not server.running:
                    server.start(wait=False)
            for server in self._servers:
                server.wait_ready(max(0.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        logger.info("ZooKeeper ready at %s (%d server(s))", self.hosts, self.size)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every server; idempotent. Each server gets ``timeout`` seconds after SIGTERM."""
        first_error: Exception | None = None
        for server in self._servers:
            try:
                server.stop(timeout)
            except Exception as exc:  # keep stopping the others; report the first failure
                first_error = first_error or exc
        if first_error is not None:
            raise DevClusterError(
                f"could not stop every ZooKeeper server: {first_error}"
            ) from first_error

    def stop_server(self, index: int, timeout: float = 10.0) -> None:
        """Stop server ``index`` (0-based); idempotent. The others keep running."""
        self._servers[index].stop(timeout)

    def start_server(self, index: int, timeout: float = 60.0) -> None:
        """Start server ``index`` (0-based) again and wait until it serves.

        Raises ``DevClusterError`` on failure, after stopping that server.
        """
        self._servers[index].start(timeout=timeout)

    def __enter__(self) -> ZooKeeperEnsemble:
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
        return f"<ZooKeeperEnsemble size={self.size} hosts={self.hosts}>"

"""A real Redis Cluster (``redis+cluster://``) for tests, the chaos run and development.

Formed with ``redis-cli --cluster create`` (``$REDIS_CLI`` overrides it); a failed
``start()`` stops everything it started and raises ``DevClusterError`` with the logs' tails.

Development: docs/development.md, "The development cluster".
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from discovery.errors import DevClusterError

from .ports import LOOPBACK
from .process import log_tail, log_tails, remaining
from .redis import RedisServer, config_quote, redis_query

__all__ = ["CLUSTER_SLOTS", "RedisClusterServers", "cluster_ports", "find_redis_cli"]

logger = logging.getLogger(__name__)

#: The number of hash slots of every Redis Cluster.
CLUSTER_SLOTS = 16384
# Redis listens for its peers on the client port plus this, the "cluster bus".
_BUS_PORT_OFFSET = 10000
_MAX_PORT = 65535
_POLL_INTERVAL_S = 0.05
_TAIL_LINES = 12
# Tries to bind ports before giving up: ephemeral ports above 55535 have no bus port.
_PORT_ATTEMPTS = 1000


def find_redis_cli() -> str:
    """Return the ``redis-cli`` executable: ``$REDIS_CLI`` or ``redis-cli`` on PATH.

    Raises ``DevClusterError`` naming ``make setup`` if it is not found.
    """
    explicit = os.environ.get("REDIS_CLI")
    found = shutil.which(explicit or "redis-cli")
    if found is None:
        where = (
            f"$REDIS_CLI={explicit!r} is not an executable"
            if explicit
            else "no `redis-cli` on PATH"
        )
        raise DevClusterError(
            f"{where}; run `make setup` (installs the Debian package redis-server)"
        )
    return found


def cluster_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """Return ``n`` distinct ports on ``host`` that are free now, each with its cluster bus
    port (+10000, at most 65535) free too and distinct from every other chosen port.

    Every socket stays bound until all ports are chosen, so none is handed out twice.
    Like :func:`~discovery.testing.ports.free_ports`, nothing reserves them afterwards.

    Raises:
        ValueError: ``n`` < 0.
        OSError: ``host`` cannot be bound, or no such ports were found.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    ports: list[int] = []
    with contextlib.ExitStack() as stack:

        def bind(port: int) -> bool:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind((host, port))
            except OSError:
                return False
            return True

        taken: set[int] = set()
        for _ in range(_PORT_ATTEMPTS):
            if len(ports) == n:
                break
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))  # held open, so the kernel does not offer it again
            port = int(sock.getsockname()[1])
            bus = port + _BUS_PORT_OFFSET
            if bus > _MAX_PORT or port in taken or bus in taken or not bind(bus):
                taken.add(port)
                continue
            taken.update((port, bus))
            ports.append(port)
    if len(ports) < n:
        raise OSError(f"found only {len(ports)} of {n} ports with a free cluster bus port")
    return ports


def _query(node: RedisServer, *command: str) -> Any:
    """The reply to ``command``, or None if the node does not answer or answers an error."""
    return redis_query(node.host, node.port, *command, password=node.password)


def _info_fields(reply: Any) -> dict[str, str]:
    """``CLUSTER INFO``/``INFO`` as a dict, whether redis-py parsed it or not."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    if not isinstance(reply, str):
        return {}
    fields: dict[str, str] = {}
    for line in reply.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


class RedisClusterServers:
    """A Redis Cluster of ``primaries`` primaries with ``replicas_per_primary`` replicas
    each, all real ``redis-server`` processes in ``workdir/node-<i>``.

    Ports are chosen at construction (:func:`cluster_ports`) and kept. Nodes judge a
    silent peer failed after ``node_timeout_ms`` (``cluster-node-timeout``). With
    ``password`` every node's ``default`` user needs it (replicas and ``redis-cli`` are
    given it). ``start()`` returns once the cluster is formed and healthy; it raises
    ``DevClusterError`` with the logs' tails on failure, after stopping everything.
    ``stop()`` is idempotent and reaps every process; the object is also a context
    manager. A node stopped and started again on its own (``servers[i].restart()``)
    keeps its ``nodes.conf`` and rejoins; ``start()`` forms a new cluster.

    Raises:
        ValueError: ``primaries`` < 3 (``redis-cli --cluster create`` needs three),
            ``replicas_per_primary`` < 0 or ``node_timeout_ms`` < 1.
        OSError: no free ports were found.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        primaries: int = 3,
        replicas_per_primary: int = 0,
        *,
        node_timeout_ms: int = 2000,
        password: str | None = None,
        host: str = LOOPBACK,
    ) -> None:
        if primaries < 3:
            raise ValueError(f"a Redis Cluster needs primaries >= 3, got {primaries}")
        if replicas_per_primary < 0:
            raise ValueError(f"replicas_per_primary must be >= 0, got {replicas_per_primary}")
        if node_timeout_ms < 1:
            raise ValueError(f"node_timeout_ms must be >= 1, got {node_timeout_ms}")
        self._workdir = Path(workdir).absolute()
        self._primaries = primaries
        self._replicas_per_primary = replicas_per_primary
        self._password = password
        config = [
            "cluster-enabled yes",
            "cluster-config-file nodes.conf",
            f"cluster-node-timeout {node_timeout_ms}",
            # Full syncs of replicas start at once and never go through dump.rdb.
            "repl-diskless-sync-delay 0",
            "repl-diskless-load swapdb",
        ]
        if password is not None:
            config.append(f"masterauth {config_quote(password)}")
        total = primaries * (1 + replicas_per_primary)
        self._servers = [
            RedisServer(
                self._workdir / f"node-{i + 1}",
                port=port,
                password=password,
                host=host,
                config=config,
                name=f"redis-node-{i + 1}",
            )
            for i, port in enumerate(cluster_ports(total, host))
        ]

    @property
    def workdir(self) -> Path:
        """The directory holding every node's subdirectory."""
        return self._workdir

    @property
    def servers(self) -> list[RedisServer]:
        """Every node process, in a fixed order."""
        return list(self._servers)

    @property
    def nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node (primaries and replicas)."""
        return [(s.host, s.port) for s in self._servers]

    @property
    def url(self) -> str:
        """``redis+cluster://h1:p1,h2:p2,...`` naming every node, without credentials."""
        return "redis+cluster://" + ",".join(s.address for s in self._servers)

    @property
    def password(self) -> str | None:
        """The nodes' ``default`` user password, None without one."""
        return self._password

    @property
    def running(self) -> bool:
        """True while every node process is running."""
        return all(s.running for s in self._servers)

    @property
    def pids(self) -> dict[str, int | None]:
        """Process ids by node name; None for a stopped node."""
        return {s.name: s.pid for s in self._servers}

    def start(self, timeout: float = 30.0) -> None:
        """Start every node, form the cluster and wait until it is healthy.

        Healthy: every node reports ``cluster_state:ok`` with all 16384 slots assigned and
        served and knows every other node, and every replica's link to its primary is up.
        Stale ``nodes.conf`` files of an earlier run are removed first.

        Raises:
            DevClusterError: a node is already running or cannot start, ``redis-cli
                --cluster create`` fails, or the cluster is not healthy within
                ``timeout`` seconds; everything is stopped first.
        """
        if any(s.running for s in self._servers):
            raise DevClusterError("the Redis Cluster is already started")
        deadline = time.monotonic() + timeout
        try:
            for server in self._servers:
                (server.workdir / "nodes.conf").unlink(missing_ok=True)
                server.start(wait=False)
            for server in self._servers:
                server.wait_ready(remaining(deadline))
            self._create(deadline)
            self.wait_healthy(remaining(deadline))
        except BaseException:
            self.stop()
            raise
        logger.info(
            "Redis Cluster ready: %s (%d primaries, %d replicas each)",
            self.url,
            self._primaries,
            self._replicas_per_primary,
        )

    def _create(self, deadline: float) -> None:
        log_path = self._workdir / "cluster-create.log"
        argv = [
            find_redis_cli(),
            "--cluster",
            "create",
            *(s.address for s in self._servers),
            "--cluster-replicas",
            str(self._replicas_per_primary),
            "--cluster-yes",
        ]
        env = dict(os.environ)
        env.pop("REDISCLI_AUTH", None)
        if self._password is not None:
            env["REDISCLI_AUTH"] = self._password  # not -a: the command line is visible
        try:
            with log_path.open("ab") as log:
                result = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    timeout=remaining(deadline),
                    check=False,
                )
        except subprocess.TimeoutExpired:
            raise DevClusterError(
                f"redis-cli --cluster create did not finish in time; last lines of "
                f"{log_path}:\n{log_tail(log_path, _TAIL_LINES)}\n{self._log_tails()}"
            ) from None
        except OSError as exc:
            raise DevClusterError(f"cannot run {argv[0]}: {exc}") from exc
        if result.returncode != 0:
            raise DevClusterError(
                f"redis-cli --cluster create exited with code {result.returncode}; last "
                f"lines of {log_path}:\n{log_tail(log_path, _TAIL_LINES)}"
            )

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until every running node reports a healthy cluster (see :meth:`start`).

        Raises:
            DevClusterError: a node exits or the cluster is not healthy within ``timeout``
                seconds (with the logs' tails).
        """
        deadline = time.monotonic() + timeout
        expected_replicas = self._primaries * self._replicas_per_primary
        while True:
            running = [s for s in self._servers if s.running]
            if len(running) < len(self._servers):
                dead = ", ".join(s.name for s in self._servers if not s.running)
                raise DevClusterError(f"{dead} not running\n{self._log_tails()}")
            if all(self._node_healthy(s) for s in running) and (
                self._linked_replicas() == expected_replicas
            ):
                return
            if time.monotonic() >= deadline:
                raise DevClusterError(
                    f"the Redis Cluster was not healthy within {timeout:g} s\n{self._log_tails()}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def _node_healthy(self, node: RedisServer) -> bool:
        info = _info_fields(_query(node, "CLUSTER", "INFO"))
        return (
            info.get("cluster_state") == "ok"
            and info.get("cluster_slots_assigned") == str(CLUSTER_SLOTS)
            and info.get("cluster_slots_ok") == str(CLUSTER_SLOTS)
            and info.get("cluster_known_nodes") == str(len(self._servers))
        )

    def _linked_replicas(self) -> int:
        linked = 0
        for node in self._servers:
            info = _info_fields(_query(node, "INFO", "replication"))
            if info.get("role") == "slave" and info.get("master_link_status") == "up":
                linked += 1
        return linked

    def stop(self) -> None:
        """Stop every node. Idempotent; all are stopped and reaped even if one fails to
        stop, and the first failure is then raised as ``DevClusterError``."""
        first_error: Exception | None = None
        for server in self._servers:
            try:
                server.stop()
            except Exception as exc:  # keep stopping the rest; report the first failure
                first_error = first_error or exc
        if first_error is not None:
            raise DevClusterError(f"could not stop the Redis Cluster: {first_error}") from (
                first_error
            )

    def _log_tails(self) -> str:
        return log_tails(self._servers, _TAIL_LINES)

    def __enter__(self) -> RedisClusterServers:
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
            f"<RedisClusterServers primaries={self._primaries} "
            f"replicas_per_primary={self._replicas_per_primary} dir={self._workdir}>"
        )

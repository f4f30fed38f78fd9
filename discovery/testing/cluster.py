"""A local backend in one scratch directory: ZooKeeper, and one Redis or a Sentinel group.

Development: docs/development.md, "The development cluster".
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from discovery.errors import DevClusterError

from .ports import LOOPBACK
from .redis import RedisServer
from .sentinel import DEFAULT_DOWN_AFTER_MS, RedisSentinelGroup
from .zookeeper import (
    DEFAULT_MAX_SESSION_TIMEOUT_MS,
    DEFAULT_TICK_TIME_MS,
    ZooKeeperEnsemble,
)

__all__ = ["DevCluster"]

logger = logging.getLogger(__name__)


class DevCluster:
    """ZooKeeper (``zk_nodes`` servers) and Redis on loopback ports, in one work directory.

    Redis is one ``redis-server`` by default. With ``sentinels`` > 0 it is a
    :class:`~discovery.testing.sentinel.RedisSentinelGroup` instead: a primary,
    ``redis_replicas`` replicas and that many sentinels (an odd number >= 3 gives a real
    quorum; 1 works but cannot survive its own loss), reached through
    :meth:`~discovery.testing.sentinel.RedisSentinelGroup.sentinel_url`. Replicas need
    sentinels: without them nothing would promote a replica, and clients would only know
    the primary's URL. ``sentinel_down_after_ms`` is how long the sentinels wait for a
    silent primary before they fail it over. ``zk_ensemble`` builds the ensemble
    instead, given its directory (servers in network namespaces, data directories on
    filesystems of their own); ``zk_nodes``, the tick and the session bounds are then
    its business.

    Without ``workdir`` a scratch directory is created by ``start()`` and removed by
    ``stop()``; a given ``workdir`` is created if needed and always kept. Use as a context
    manager, or call ``start()``/``stop()``. ``start()`` raises ``DevClusterError`` if a
    server cannot be started or is not ready within ``start_timeout`` seconds, after
    stopping whatever it had started.

    Raises:
        ValueError: ``zk_nodes`` is 2 or < 1, ``tick_time_ms`` < 1, ``redis_replicas`` or
            ``sentinels`` < 0, ``redis_replicas`` > 0 without sentinels, or ``redis_port``
            given with sentinels (the group chooses its ports).
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        zk_nodes: int = 1,
        tick_time_ms: int = DEFAULT_TICK_TIME_MS,
        *,
        min_session_timeout_ms: int | None = None,
        max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS,
        redis_port: int | None = None,
        start_timeout: float = 60.0,
        host: str = LOOPBACK,
        redis_replicas: int = 0,
        sentinels: int = 0,
        sentinel_down_after_ms: int = DEFAULT_DOWN_AFTER_MS,
        zk_ensemble: Callable[[Path], ZooKeeperEnsemble] | None = None,
    ) -> None:
        if zk_nodes < 1 or zk_nodes == 2:
            raise ValueError(f"zk_nodes must be 1 or >= 3, got {zk_nodes}")
        if tick_time_ms < 1:
            raise ValueError(f"tick_time_ms must be >= 1, got {tick_time_ms}")
        self._sentinel_down_after_ms = sentinel_down_after_ms
        self._zk_ensemble = zk_ensemble
        if redis_replicas < 0 or sentinels < 0:
            raise ValueError(
                f"redis_replicas and sentinels must be >= 0, got {redis_replicas}, {sentinels}"
            )
        if redis_replicas > 0 and sentinels == 0:
            raise ValueError("redis_replicas needs sentinels >= 1 (nothing else would fail over)")
        if sentinels > 0 and redis_port is not None:
            raise ValueError("redis_port applies to a single Redis server, not with sentinels")
        self._requested_workdir = None if workdir is None else Path(workdir).absolute()
        self._zk_nodes = zk_nodes
        self._tick_time_ms = tick_time_ms
        self._min_session_timeout_ms = min_session_timeout_ms
        self._max_session_timeout_ms = max_session_timeout_ms
        self._redis_port = redis_port
        self._redis_replicas = redis_replicas
        self._sentinels = sentinels
        self._start_timeout = start_timeout
        # Where the servers listen: loopback, or a network lab's gateway.
        self._host = host
        self._workdir: Path | None = None
        self._owns_workdir = False
        self._zk: ZooKeeperEnsemble | None = None
        self._redis: RedisServer | None = None
        self._redis_group: RedisSentinelGroup | None = None

    @property
    def zk(self) -> ZooKeeperEnsemble:
        """The ZooKeeper ensemble; ``DevClusterError`` before ``start()``."""
        if self._zk is None:
            raise DevClusterError("the dev cluster is not started")
        return self._zk

    @property
    def redis(self) -> RedisServer:
        """The Redis server, or with sentinels the data server that is primary now (as a
        sentinel reports it: it changes with every failover).

        Raises:
            DevClusterError: before ``start()``, or no sentinel can tell the primary.
        """
        if self._redis_group is not None:
            return self._redis_group.primary
        if self._redis is None:
            raise DevClusterError("the dev cluster is not started")
        return self._redis

    @property
    def redis_group(self) -> RedisSentinelGroup:
        """The primary, replicas and sentinels of a dev cluster with ``sentinels`` > 0.

        Raises:
            DevClusterError: before ``start()``, or the dev cluster runs without sentinels.
        """
        if self._sentinels == 0:
            raise DevClusterError("this dev cluster runs a single Redis server, no sentinels")
        if self._redis_group is None:
            raise DevClusterError("the dev cluster is not started")
        return self._redis_group

    @property
    def redis_url(self) -> str:
        """What clients use: the Redis server's URL, or with sentinels the sentinel URL
        (``redis+sentinel://h1:p1,.../mymaster/0``); ``DevClusterError`` before ``start()``.
        """
        if self._redis_group is not None:
            return self._redis_group.sentinel_url()
        return self.redis.url

    @property
    def workdir(self) -> Path | None:
        """The work directory in use, or None while stopped with no ``workdir`` given."""
        return self._workdir if self._workdir is not None else self._requested_workdir

    @property
    def running(self) -> bool:
        """True while every ZooKeeper and Redis process (sentinels included) is running."""
        redis_running = (self._redis is not None and self._redis.running) or (
            self._redis_group is not None and self._redis_group.running
        )
        return self._zk is not None and self._zk.running and redis_running

    def start(self) -> None:
        """Start ZooKeeper and Redis and wait until both answer.

        All processes boot in parallel. On failure or interruption everything already
        started is stopped (and a scratch directory removed) before the error propagates.
        Raises ``DevClusterError`` if already started.
        """
        if self._zk is not None or self._redis is not None or self._redis_group is not None:
            raise DevClusterError("the dev cluster is already started")
        deadline = time.monotonic() + self._start_timeout
        try:
            workdir = self._make_workdir()
            redis: RedisServer | RedisSentinelGroup
            if self._sentinels > 0:
                redis = self._redis_group = RedisSentinelGroup(
                    workdir / "redis",
                    replicas=self._redis_replicas,
                    sentinels=self._sentinels,
                    down_after_ms=self._sentinel_down_after_ms,
                    host=self._host,
                )
            else:
                redis = self._redis = RedisServer(
                    workdir / "redis", port=self._redis_port, host=self._host
                )
            if self._zk_ensemble is not None:
                self._zk = self._zk_ensemble(workdir / "zookeeper")
            else:
                self._zk = ZooKeeperEnsemble(
                    self._zk_nodes,
                    workdir / "zookeeper",
                    tick_time_ms=self._tick_time_ms,
                    min_session_timeout_ms=self._min_session_timeout_ms,
                    max_session_timeout_ms=self._max_session_timeout_ms,
                    host=self._host,
                )
            # Redis is up in milliseconds; launching it first lets it boot while the
            # ensemble waits for its JVMs (a sentinel group launches its data servers; the
            # sentinels follow in wait_ready).
            redis.start(wait=False)
            self._zk.start(timeout=self._start_timeout)
            redis.wait_ready(max(0.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        logger.info(
            "dev cluster ready: zk=%s redis=%s workdir=%s",
            self._zk.hosts,
            self.redis_url,
            workdir,
        )

    def stop(self) -> None:
        """Stop every process and remove the scratch directory if ``start()`` created it.

        Idempotent. Processes are always stopped and reaped; a failure to stop one is
        raised as ``DevClusterError`` after the others have been stopped.
        """
        zk, redis, group = self._zk, self._redis, self._redis_group
        self._zk = self._redis = self._redis_group = None
        first_error: Exception | None = None
        # The sentinels go before ZooKeeper, so none fails over while the rest stops.
        for server in (group, zk, redis):
            if server is None:
                continue
            try:
                server.stop()
            except Exception as exc:  # keep stopping the rest; report the first failure
                first_error = first_error or exc
        if self._owns_workdir and self._workdir is not None:
            _remove_scratch(self._workdir)
        self._workdir = None
        self._owns_workdir = False
        if first_error is not None:
            raise DevClusterError(f"could not stop the dev cluster: {first_error}") from first_error

    def info(self) -> dict[str, Any]:
        """Connection details for people and scripts (JSON-serialisable).

        Keys: ``zk`` (kazoo hosts), ``redis`` (URL), ``workdir``, ``zk_nodes``,
        ``tick_time_ms`` and ``pids`` (``zk1``..``zkN`` and ``redis``; None for a stopped
        process). With sentinels ``redis`` is the sentinel URL, ``redis_servers`` and
        ``sentinels`` list their ``host:port`` addresses (``redis_servers[0]`` the first
        primary), ``redis_primary`` is the primary's address now, and ``pids`` has
        ``redis-1``.. and ``sentinel-1``.. instead of ``redis``. Raises
        ``DevClusterError`` before ``start()``.
        """
        zk = self.zk
        pids: dict[str, int | None] = {f"zk{s.server_id}": s.pid for s in zk.servers}
        info: dict[str, Any] = {
            "zk": zk.hosts,
            "redis": self.redis_url,
            "workdir": str(self.workdir),
            "zk_nodes": zk.size,
            "tick_time_ms": zk.tick_time_ms,
            "pids": pids,
        }
        if self._redis_group is not None:
            group = self._redis_group
            pids.update(group.pids)
            info["redis_servers"] = [s.address for s in group.servers]
            info["sentinels"] = [s.address for s in group.sentinels]
            info["redis_primary"] = "{}:{}".format(*group.primary_address())
        else:
            pids["redis"] = self.redis.pid
        return info

    def _make_workdir(self) -> Path:
        if self._requested_workdir is not None:
            self._requested_workdir.mkdir(parents=True, exist_ok=True)
            self._workdir = self._requested_workdir
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="discovery-devcluster-"))
            self._owns_workdir = True
        return self._workdir

    def __enter__(self) -> DevCluster:
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
            f"<DevCluster zk_nodes={self._zk_nodes} sentinels={self._sentinels} "
            f"workdir={self.workdir}>"
        )


def _remove_scratch(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except OSError as exc:
        # Leftover files in the temp directory are harmless; failing the stop over them is not.
        logger.warning("could not remove scratch directory %s: %s", path, exc)

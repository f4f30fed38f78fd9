"""The processes of a chaos run, and the hands that hurt them.

:class:`ChaosCluster` runs every server as a process of its own and acts on them only from
outside: signals, admin endpoints, ``GET /cluster``, and (as root) cuts and full disks.

Development: docs/development.md, "The chaos run".
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp
import redis as sync_redis

from discovery.config import ClusterConfig
from discovery.testing import DevCluster
from discovery.testing.netns import Host, NetworkLab
from discovery.testing.ports import LOOPBACK, free_ports
from discovery.testing.zookeeper import DEFAULT_PRE_ALLOC_KB, ZooKeeperEnsemble

from .client import ServerClient
from .commandlines import ADMIN_TOKEN, DATA_DOCS, DATA_DRAIN_GRACE, CommandLines
from .commandlines import CLUSTER_NAME as CLUSTER_NAME  # re-exported: the observer's import
from .config import REDIS_REPLICAS, SENTINEL_DOWN_AFTER_MS, ChaosConfig
from .links import Links
from .processes import Member, Processes, deprioritize
from .zkdisks import ZK_PRE_ALLOC_KB, mount_zk_disks, unmount_zk_disks

__all__ = ["DATA_DOCS", "DATA_DRAIN_GRACE", "ChaosCluster", "Member"]

ZK_SERVERS = 3


class ChaosCluster:
    """Start, signal and stop everything of one run. ``await start()``, ``await aclose()``.

    The backend (ZooKeeper and Redis) is its own; the processes are :class:`Processes`'
    (:attr:`processes`), the links :class:`Links`' (:attr:`links`) and the HTTP calls to
    the servers :class:`ServerClient`'s (:attr:`client`), each method here handing over
    to them.
    """

    def __init__(self, config: ChaosConfig, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        # Built (ip and iptables processes) in start(), off the event loop.
        self.lab: NetworkLab | None = NetworkLab() if config.partitions else None
        self._backend: DevCluster | None = None
        self.search: dict[str, Member] = {}
        self.data: dict[str, Member] = {}
        self._http: aiohttp.ClientSession | None = None
        self._client: ServerClient | None = None
        #: The ZooKeeper servers' namespaces (with partitions).
        self.zk_lab_hosts: list[Host] = []
        #: Each ZooKeeper server's data directory, a tmpfs of its own; empty where the
        #: harness cannot mount (the disk faults are then skipped).
        self.zk_disks: list[Path] = []
        self.command_lines = CommandLines(config, lambda: self.zk_hosts, lambda: self.redis_url)
        self.processes = Processes(
            workdir / "logs", self.search, self.data, self.command_lines.command, self._ready
        )
        self.links = Links(
            self.lab,
            zookeeper=self._zookeeper_clients,
            redis_ports=self.redis_ports,
            search=self.search,
            zk_hosts=lambda: self.zk_lab_hosts,
        )

    @property
    def backend(self) -> DevCluster:
        """ZooKeeper and Redis of the run (from :meth:`start` on)."""
        assert self._backend is not None, "ChaosCluster not started"
        return self._backend

    @property
    def zk_hosts(self) -> str:
        return self.backend.zk.hosts

    @property
    def redis_url(self) -> str:
        """What every search server and the observer use: the Redis server's URL, or
        with sentinels the sentinel URL (which follows failovers)."""
        return self.backend.redis_url

    @property
    def primary_url(self) -> str:
        """The URL of the Redis data server that is primary now (the only server
        without sentinels), for commands sent to it alone (FLUSHALL)."""
        return self.backend.redis.url

    def primary_client(self) -> sync_redis.Redis:
        """A blocking client of the Redis primary alone (FLUSHALL, CONFIG SET, CLIENT
        PAUSE, hostile entries): use it in a thread, as ``with ... as client`` (it
        closes on leaving the block)."""
        return sync_redis.Redis.from_url(self.primary_url, socket_timeout=2.0)

    @property
    def sentinel_mode(self) -> bool:
        return self.config.sentinel_mode

    @property
    def redis_prefix(self) -> str:
        return ClusterConfig(cluster=CLUSTER_NAME).redis_prefix

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None, "ChaosCluster not started"
        return self._http

    @property
    def client(self) -> ServerClient:
        """The HTTP calls to the servers (from :meth:`start` on)."""
        assert self._client is not None, "ChaosCluster not started"
        return self._client

    @property
    def helpers(self) -> dict[str, asyncio.subprocess.Process]:
        """Processes of hostile faults (a hostile peer, a query storm) by name."""
        return self.processes.helpers

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Start the backend, then every search and data server (not waiting for them)."""
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        config = self.config
        lab = self.lab
        if lab is not None:
            await asyncio.to_thread(lab.start)
            self.zk_lab_hosts = await asyncio.to_thread(
                lambda: [lab.add_host(f"zk{i + 1}") for i in range(ZK_SERVERS)]
            )
            self.zk_disks = await asyncio.to_thread(
                mount_zk_disks, self.workdir / "zk-disks", ZK_SERVERS
            )
        self._backend = DevCluster(
            self.workdir / "backend",
            zk_nodes=ZK_SERVERS,
            tick_time_ms=config.tick_time_ms,
            max_session_timeout_ms=60_000,
            zk_ensemble=self._ensemble,
            host=lab.gateway if lab is not None else LOOPBACK,
            sentinels=config.redis_sentinels,
            redis_replicas=REDIS_REPLICAS if config.sentinel_mode else 0,
            sentinel_down_after_ms=SENTINEL_DOWN_AFTER_MS,
        )
        await asyncio.to_thread(self._backend.start)
        self.deprioritize_zookeeper()
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        self._client = ServerClient(self._http, ADMIN_TOKEN)
        names = [f"search-{i + 1}" for i in range(config.search_servers)]
        names += [f"ds-{i:04d}" for i in range(config.data_servers)]
        hosts: dict[str, Host | None] = dict.fromkeys(names)
        if lab is not None:
            hosts.update(await asyncio.to_thread(lambda: {n: lab.add_host(n) for n in names}))
        ports = free_ports(config.search_servers + config.data_servers)
        for index in range(config.search_servers):
            name = f"search-{index + 1}"
            argv = self.command_lines.search(name)
            self.search[name] = Member(name, ports.pop(), argv, self._log(name), host=hosts[name])
        for index in range(config.data_servers):
            name = f"ds-{index:04d}"
            shard, replica = index % config.shards, index // config.shards
            argv = self.command_lines.data(name, shard, replica)
            member = Member(name, ports.pop(), argv, self._log(name), host=hosts[name])
            member.extra.update(shard=shard, replica=replica)
            self.data[name] = member
        for member in [*self.search.values(), *self.data.values()]:
            await self.spawn(member)

    async def aclose(self) -> None:
        """Stop every process (SIGCONT first: a paused process cannot exit), then the backend."""
        await self.processes.aclose()
        if self._http is not None:
            await self._http.close()
        try:
            if self._backend is not None:
                await asyncio.to_thread(self._backend.stop)
        finally:
            try:
                await asyncio.to_thread(unmount_zk_disks, self.zk_disks)
                self.zk_disks = []
            finally:
                if self.lab is not None:
                    await asyncio.to_thread(self.lab.close)

    # -- ZooKeeper's hosts and disks --------------------------------------------------

    def _ensemble(self, directory: Path) -> ZooKeeperEnsemble:
        hosts = self.zk_lab_hosts
        return ZooKeeperEnsemble(
            ZK_SERVERS,
            directory,
            tick_time_ms=self.config.tick_time_ms,
            max_session_timeout_ms=60_000,
            server_hosts=[h.address for h in hosts] if hosts else None,
            launchers=[h.wrap([]) for h in hosts] if hosts else None,
            data_dirs=self.zk_disks or None,
            pre_alloc_kb=ZK_PRE_ALLOC_KB if self.zk_disks else DEFAULT_PRE_ALLOC_KB,
        )

    def _zookeeper_clients(self) -> list[tuple[str, int]]:
        """Each ZooKeeper server's client ``(address, port)``."""
        return [
            (server.address.rsplit(":", 1)[0], server.client_port)
            for server in self.backend.zk.servers
        ]

    def deprioritize_zookeeper(self) -> None:
        """Renice the running ZooKeeper servers."""
        for server in self.backend.zk.servers:
            if server.pid is not None:
                deprioritize(server.pid)

    def start_zookeeper(self, index: int, timeout: float = 60.0, *, wait: bool = True) -> None:
        """Start ZooKeeper server ``index`` again, reniced from its first instant (the
        JVM's threads inherit it), and (with ``wait``) wait until it serves. Blocking:
        use a thread.

        Raises:
            DevClusterError: it did not come up (its log tail is in the message).
        """
        server = self.backend.zk.servers[index]
        server.start(wait=False)
        if server.pid is not None:
            deprioritize(server.pid)
        if wait:
            server.wait_ready(timeout)

    def redis_ports(self) -> list[int]:
        """Every port a Redis client of the run may use: the server's, or with sentinels
        each data server's (any may be primary next) and each sentinel's."""
        if not self.sentinel_mode:
            return [self.backend.redis.port]
        group = self.backend.redis_group
        return [*(s.port for s in group.servers), *(s.port for s in group.sentinels)]

    # -- collaborators' hooks -------------------------------------------------------

    def _log(self, name: str) -> Path:
        return self.processes.log_path(name)

    async def _ready(self, member: Member) -> bool:
        return await self.client.ready(member)

    # -- processes (:class:`Processes`) --------------------------------------------

    async def spawn(self, member: Member) -> None:
        """Start ``member``'s process (again), appending to its log."""
        await self.processes.spawn(member)

    async def spawn_helper(self, name: str, argv: list[str]) -> asyncio.subprocess.Process:
        """See :meth:`Processes.spawn_helper`."""
        return await self.processes.spawn_helper(name, argv)

    async def stop_helper(self, name: str) -> int | None:
        """See :meth:`Processes.stop_helper`."""
        return await self.processes.stop_helper(name)

    def helper_log(self, name: str) -> Path:
        return self.processes.log_path(name)

    def signal(self, member: Member, signum: int) -> None:
        """See :meth:`Processes.signal`."""
        self.processes.signal(member, signum)

    async def kill(self, member: Member) -> None:
        """``kill -9`` and reap."""
        await self.processes.kill(member)

    async def terminate(self, member: Member) -> None:
        await self.processes.terminate(member)

    async def stop_gracefully(self, member: Member, bound: float) -> float | None:
        """See :meth:`Processes.stop_gracefully`."""
        return await self.processes.stop_gracefully(member, bound)

    async def restart(self, member: Member) -> None:
        await self.processes.restart(member)

    # -- links (:class:`Links`) ----------------------------------------------------

    async def cut(self, member: Member, what: str) -> None:
        """See :meth:`Links.cut`."""
        await self.links.cut(member, what)

    async def heal(self, member: Member) -> None:
        await self.links.heal(member)

    def cut_off(self, member: Member, what: str) -> contextlib.AbstractAsyncContextManager[None]:
        """See :meth:`Links.cut_off`."""
        return self.links.cut_off(member, what)

    async def cut_zookeeper_peers(self, index: int) -> None:
        """See :meth:`Links.cut_zookeeper_peers`."""
        await self.links.cut_zookeeper_peers(index)

    async def heal_zookeeper_peers(self, index: int) -> None:
        await self.links.heal_zookeeper_peers(index)

    # -- talking to the servers (:class:`ServerClient`) -----------------------------

    async def admin(
        self, member: Member, path: str, body: object = None, *, timeout: float = 5.0
    ) -> bool:
        """POST to a data server's admin endpoint; True if 2xx within ``timeout`` s."""
        return await self.client.admin(member, path, body, timeout=timeout)

    async def view(self, member: Member) -> dict[str, Any] | None:
        """A search server's ``GET /cluster``, or None if it does not answer quickly."""
        return await self.client.view(member)

    async def metrics(self, member: Member) -> dict[str, float] | None:
        """See :meth:`ServerClient.metrics`."""
        return await self.client.metrics(member)

    async def leader(self) -> Member | None:
        """The search server that says it leads (None if none does, or several)."""
        return await self.client.leader(self.search)

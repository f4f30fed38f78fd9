"""The processes of a chaos run, and the hands that hurt them.

A 3-server ZooKeeper ensemble and Redis (:class:`~discovery.testing.DevCluster`),
search servers and data servers, each data or search server a process of its own
started from its console entry point (so each has its own ZooKeeper session and can be
killed, paused and restarted alone, as in production). The harness talks to them only
from outside: signals, the data servers' admin endpoints, the search servers'
``GET /cluster``.

With ``redis_sentinels`` (``--redis-sentinels N``), Redis is a primary with two
replicas watched by N sentinels
(:class:`~discovery.testing.sentinel.RedisSentinelGroup`); every search server and the
observer then reach it through the sentinel URL, so they follow a failover.

With ``partitions``, every data and search server and every ZooKeeper server runs in
a network namespace of its own (a :class:`~discovery.testing.netns.NetworkLab` host,
its own 198.18.x.y address), Redis (sentinels included) listens on the lab's gateway,
and :meth:`ChaosCluster.cut` drops chosen links with iptables inside one server's
namespace (:meth:`ChaosCluster.cut_zookeeper_peers` cuts one ZooKeeper server from the
others). The admin endpoints then take a bearer token, since the harness no longer
calls from loopback.

Where the harness may mount (root, as partitions need), each ZooKeeper server keeps its
data on a small tmpfs of its own (:attr:`ChaosCluster.zk_disks`), so that a fault can
fill its disk; ZooKeeper then grows its log in small steps, so a full disk refuses the
next writes rather than some megabytes later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis as sync_redis
from prometheus_client.parser import text_string_to_metric_families

from discovery.adminauth import admin_headers
from discovery.config import ClusterConfig
from discovery.testing import DevCluster
from discovery.testing.netns import Cut, Host, NetworkLab
from discovery.testing.ports import LOOPBACK, free_ports
from discovery.testing.zookeeper import DEFAULT_PRE_ALLOC_KB, ZooKeeperEnsemble

from .config import REDIS_REPLICAS, SENTINEL_DOWN_AFTER_MS, ChaosConfig

__all__ = ["DATA_DOCS", "DATA_DRAIN_GRACE", "ChaosCluster", "Member"]

log = logging.getLogger(__name__)

CLUSTER_NAME = "chaos"
#: The data servers' admin token in a run with partitions (a scratch cluster's).
ADMIN_TOKEN = "chaos-admin"
_STOP_TIMEOUT = 10.0
#: Documents generated per data server (``--docs``): a hostile query storm computes
#: its shard's most frequent terms from the same corpus.
DATA_DOCS = 300
#: Seconds a draining data server keeps answering (``--drain-grace``): the search
#: servers must stop routing to it within them.
DATA_DRAIN_GRACE = 1.0
#: The niceness of data servers and ZooKeeper. On one 2-core machine they stand in for
#: other machines: in production a data server starting up (imports, index build) or a
#: ZooKeeper JVM warming up does not take CPU from the search servers, whose deadlines
#: invariant 1 judges, nor from the client that measures them. Redis (and, with
#: sentinels, its replicas and the sentinels) keeps the default priority: it uses
#: little CPU, and the failover bound judges the sentinels' own timing.
BACKGROUND_NICENESS = 10
ZK_SERVERS = 3
#: Each ZooKeeper server's tmpfs. Its snapshots and logs grow some 50 KB a minute in a
#: run (a snapshot and a new log at every election: 0.9 MB after 18 minutes of a
#: soak), purged hourly (:mod:`discovery.testing.zookeeper`): a few MB at most.
ZK_DISK_MB = 16
#: ``preAllocSize`` on those disks (KiB): the log grows 4 KiB at a time, so a full disk
#: refuses a write within a few kilobytes of transactions.
ZK_PRE_ALLOC_KB = 4


def deprioritize(pid: int, niceness: int = BACKGROUND_NICENESS) -> None:
    """Lower ``pid``'s CPU priority: its autogroup's and every thread's niceness.

    Linux (with ``sched_autogroup_enabled``) first shares the CPU fairly between
    autogroups, one per session, and applies a thread's niceness only within its
    group; our processes each run in a session of their own, so the group's niceness
    is what counts. Threads started later inherit theirs from their parent thread.
    """
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{niceness}\n", encoding="ascii")
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return  # already gone
    for tid in tids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpriority(os.PRIO_PROCESS, tid, niceness)


@dataclass
class Member:
    """One data or search server process: how to start it and what state it is in."""

    name: str
    port: int
    argv: list[str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    paused: bool = False
    #: Answers ``GET /readyz`` since its last start: only then does the load use it, as a
    #: load balancer's health check would.
    ready: bool = False
    #: Sent SIGKILL or SIGTERM: out of the load until it is started again.
    stopping: bool = False
    restarts: int = 0
    #: Bumped by every kill, pause or restart: a query in flight across a change of it
    #: was disturbed by the harness, not by the system.
    disturbances: int = 0
    #: Bumped by every graceful stop (:meth:`ChaosCluster.stop_gracefully`): a query in
    #: flight across one is the system's to finish, and is judged.
    graceful_stops: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: Its network namespace when the run has partitions (None: the root namespace).
    host: Host | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def address(self) -> str:
        return self.host.address if self.host is not None else LOOPBACK

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


class ChaosCluster:
    """Start, signal and stop everything of one run. ``await start()``, ``await aclose()``."""

    def __init__(self, config: ChaosConfig, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        # Built (ip and iptables processes) in start(), off the event loop.
        self.lab: NetworkLab | None = NetworkLab() if config.partitions else None
        self._backend: DevCluster | None = None
        self._cuts: dict[str, list[Cut]] = {}
        self.search: dict[str, Member] = {}
        self.data: dict[str, Member] = {}
        self._http: aiohttp.ClientSession | None = None
        self._readiness: set[asyncio.Task[None]] = set()
        #: The ZooKeeper servers' namespaces (with partitions).
        self.zk_lab_hosts: list[Host] = []
        #: Each ZooKeeper server's data directory, a tmpfs of its own; empty where the
        #: harness cannot mount (the disk faults are then skipped).
        self.zk_disks: list[Path] = []
        #: Processes of hostile faults (a hostile peer, a query storm) by name.
        self.helpers: dict[str, asyncio.subprocess.Process] = {}

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
            self.zk_disks = await asyncio.to_thread(self._mount_zk_disks)
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
        names = [f"search-{i + 1}" for i in range(config.search_servers)]
        names += [f"ds-{i:04d}" for i in range(config.data_servers)]
        hosts: dict[str, Host | None] = dict.fromkeys(names)
        if lab is not None:
            hosts.update(await asyncio.to_thread(lambda: {n: lab.add_host(n) for n in names}))
        ports = free_ports(config.search_servers + config.data_servers)
        for index in range(config.search_servers):
            name = f"search-{index + 1}"
            self.search[name] = Member(
                name, ports.pop(), self._search_argv(name), self._log(name), host=hosts[name]
            )
        for index in range(config.data_servers):
            name = f"ds-{index:04d}"
            shard, replica = index % config.shards, index // config.shards
            member = Member(name, ports.pop(), [], self._log(name), host=hosts[name])
            member.argv = self._data_argv(member, shard, replica)
            member.extra.update(shard=shard, replica=replica)
            self.data[name] = member
        for member in [*self.search.values(), *self.data.values()]:
            await self.spawn(member)

    async def aclose(self) -> None:
        """Stop every process (SIGCONT first: a paused process cannot exit), then the backend."""
        members = [m for m in [*self.search.values(), *self.data.values()] if m.running]
        for member in members:
            if member.paused:
                self.signal(member, signal.SIGCONT)
        for task in list(self._readiness):
            task.cancel()
        await asyncio.gather(*self._readiness, return_exceptions=True)
        await asyncio.gather(*(self.terminate(member) for member in members))
        await asyncio.gather(*(self.stop_helper(name) for name in list(self.helpers)))
        if self._http is not None:
            await self._http.close()
        try:
            if self._backend is not None:
                await asyncio.to_thread(self._backend.stop)
        finally:
            try:
                await asyncio.to_thread(self._unmount_zk_disks)
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

    def _mount_zk_disks(self) -> list[Path]:
        """A tmpfs per ZooKeeper server; none (logged) where mounting is refused."""
        disks = [self.workdir / "zk-disks" / f"zk{i + 1}" for i in range(ZK_SERVERS)]
        mounted: list[Path] = []
        try:
            for disk in disks:
                disk.mkdir(parents=True, exist_ok=True)
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", f"size={ZK_DISK_MB}m", "tmpfs", str(disk)],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                mounted.append(disk)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else exc
            log.warning("no tmpfs for ZooKeeper's data (%s): the disk faults are skipped", detail)
            for disk in mounted:
                subprocess.run(["umount", str(disk)], check=False, capture_output=True)
            return []
        return disks

    def _unmount_zk_disks(self) -> None:
        for disk in self.zk_disks:
            result = subprocess.run(["umount", str(disk)], check=False, capture_output=True)
            if result.returncode != 0:
                log.warning("could not unmount %s: %s", disk, result.stderr.decode().strip())
        self.zk_disks = []

    # -- links -------------------------------------------------------------------

    async def cut(self, member: Member, what: str) -> None:
        """Cut ``member`` off: ``zookeeper`` (every ZooKeeper client port), ``redis``
        (the Redis port; with sentinels every data server's and every sentinel's, so
        that it can neither reach the primary nor learn of another), or ``search``
        (every search server's traffic to a data server's port).

        In a thread: each rule is an ``iptables`` process, tens of milliseconds that
        the harness's loop (which times the queries) must not spend blocked.
        """
        await asyncio.to_thread(self._cut, member, what)

    async def heal(self, member: Member) -> None:
        await asyncio.to_thread(self._heal, member)

    @contextlib.asynccontextmanager
    async def cut_off(self, member: Member, what: str) -> AsyncIterator[None]:
        """:meth:`cut` ``member`` for the block and :meth:`heal` it however the block
        ends: a fault that raised midway must not leave the next faults a cut link."""
        await self.cut(member, what)
        try:
            yield
        finally:
            await self.heal(member)

    def _cut(self, member: Member, what: str) -> None:
        lab, host = self.lab, member.host
        if lab is None or host is None:
            raise ValueError("a run without partitions has no links to cut")
        cuts = self._cuts.setdefault(member.name, [])
        if what == "zookeeper":
            for server in self.backend.zk.servers:
                address = server.address.rsplit(":", 1)[0]
                cuts.append(lab.cut(host, address=address, port=server.client_port))
        elif what == "redis":
            for port in self.redis_ports():
                cuts.append(lab.cut(host, address=lab.gateway, port=port))
        elif what == "search":
            for other in self.search.values():
                if other.host is not None:
                    cuts.append(
                        lab.cut(host, address=other.host.address, port=member.port, served=True)
                    )
        else:
            raise ValueError(f"unknown link {what!r}")

    async def cut_zookeeper_peers(self, index: int) -> None:
        """Cut ZooKeeper server ``index`` from its peers (every port both ways, its
        clients untouched); :meth:`heal_zookeeper_peers` undoes it."""
        await asyncio.to_thread(self._cut_peers, index)

    async def heal_zookeeper_peers(self, index: int) -> None:
        await asyncio.to_thread(self._heal_key, f"zk{index + 1}")

    def _cut_peers(self, index: int) -> None:
        lab, hosts = self.lab, self.zk_lab_hosts
        if lab is None or not hosts:
            raise ValueError("a run without partitions has no links to cut")
        cuts = self._cuts.setdefault(f"zk{index + 1}", [])
        for peer, other in enumerate(hosts):
            if peer != index:
                cuts.append(lab.cut(hosts[index], address=other.address))

    def redis_ports(self) -> list[int]:
        """Every port a Redis client of the run may use: the server's, or with sentinels
        each data server's (any may be primary next) and each sentinel's."""
        if not self.sentinel_mode:
            return [self.backend.redis.port]
        group = self.backend.redis_group
        return [*(s.port for s in group.servers), *(s.port for s in group.sentinels)]

    def _heal(self, member: Member) -> None:
        self._heal_key(member.name)

    def _heal_key(self, key: str) -> None:
        for cut in self._cuts.pop(key, []):
            cut.heal()

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

    # -- processes ---------------------------------------------------------------

    def _log(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def _common(self, member: Member) -> list[str]:
        config = self.config
        return [
            *("--zk", self.zk_hosts, "--redis", self.redis_url, "--cluster", CLUSTER_NAME),
            # INFO: kazoo's connection attempts are in the logs when a run fails.
            *("--session-timeout", str(config.session_timeout), "--log-level", "INFO"),
            *("--host", member.address, "--advertise", member.address),
            *(("--admin-token", ADMIN_TOKEN) if member.host is not None else ()),
        ]

    def _search_argv(self, name: str) -> list[str]:
        config = self.config
        return [
            *("-m", "search_server.cli", "--id", name),
            *("--heartbeat-interval", str(config.heartbeat_interval)),
            *("--heartbeat-ttl", str(config.heartbeat_ttl)),
            *("--reconcile-interval", "5", "--timeout-ms", str(config.deadline_ms)),
        ]

    def _data_argv(self, member: Member, shard: int, replica: int) -> list[str]:
        config = self.config
        return [
            *("-m", "data_server.cli", "--id", member.name, "--docs", str(DATA_DOCS)),
            *("--shard", str(shard), "--replica", str(replica)),
            *("--probe-interval", str(config.probe_interval)),
            *("--probe-timeout", str(config.probe_timeout), "--probe-max-latency", "0.5"),
            *("--fall", str(config.fall), "--rise", str(config.rise)),
            *("--drain-grace", f"{DATA_DRAIN_GRACE:g}"),
            # Every server is hurt a few times in a long run; damping a flapping server
            # is tested elsewhere and would only blur the bounds judged here.
            *("--flap-max", "1000"),
        ]

    async def spawn(self, member: Member) -> None:
        """Start ``member``'s process (again), appending to its log."""
        argv = [sys.executable, *member.argv, *self._common(member), "--port", str(member.port)]
        if member.host is not None:
            argv = member.host.wrap(argv)  # ip netns exec execs: same pid
        if member.name in self.data:
            argv = ["nice", "-n", str(BACKGROUND_NICENESS), *argv]  # nice execs: same pid
        with member.log_path.open("ab") as out:
            member.process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                # Its own process group: our Ctrl-C is ours, its signals are its own.
                start_new_session=True,
            )
        member.paused = False
        member.ready = False
        member.stopping = False
        if member.name in self.data:
            deprioritize(member.process.pid)
        if member.name in self.search:
            task = asyncio.create_task(self._await_ready(member), name=f"ready:{member.name}")
            self._readiness.add(task)
            task.add_done_callback(self._readiness.discard)

    async def _await_ready(self, member: Member) -> None:
        process = member.process
        while member.process is process and member.running:
            try:
                async with self.http.get(f"{member.url}/readyz") as response:
                    if response.status == 200:
                        member.ready = not member.stopping
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            # Polling a starting process: there is no event to wait for from outside.
            await asyncio.sleep(0.1)

    async def spawn_helper(self, name: str, argv: list[str]) -> asyncio.subprocess.Process:
        """Start a process of a hostile fault (``argv`` after the interpreter) in the root
        namespace, at the data servers' niceness (it stands in for another machine, as
        they do), logging to ``logs/<name>.log``."""
        log_path = self._log(name)
        command = ["nice", "-n", str(BACKGROUND_NICENESS), sys.executable, *argv]
        with log_path.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        deprioritize(process.pid)
        self.helpers[name] = process
        return process

    async def stop_helper(self, name: str) -> int | None:
        """SIGTERM a helper (SIGKILL if it does not exit in time) and reap it; its exit
        status (None if there was no such helper)."""
        process = self.helpers.pop(name, None)
        if process is None:
            return None
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                async with asyncio.timeout(_STOP_TIMEOUT):
                    await process.wait()
            except TimeoutError:
                log.warning("%s did not stop within %gs; killing it", name, _STOP_TIMEOUT)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        return process.returncode

    def helper_log(self, name: str) -> Path:
        return self._log(name)

    def signal(self, member: Member, signum: int) -> None:
        process = member.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)
        if signum in (signal.SIGSTOP, signal.SIGKILL, signal.SIGTERM):
            member.disturbances += 1
        if signum in (signal.SIGKILL, signal.SIGTERM):
            # Out of the load at once, as a load balancer takes out a server it stops:
            # until the process is reaped it still counts as running, and a query sent to
            # it meanwhile failed on a refused connection that no system could avoid (CI
            # counted one such "failed" query in a leader kill).
            member.ready = False
            member.stopping = True
        if signum == signal.SIGSTOP:
            member.paused = True
        elif signum == signal.SIGCONT:
            member.paused = False

    async def kill(self, member: Member) -> None:
        """``kill -9`` and reap."""
        self.signal(member, signal.SIGKILL)
        if member.process is not None:
            await member.process.wait()
        member.paused = False

    async def terminate(self, member: Member) -> None:
        process = member.process
        if process is None or process.returncode is not None:
            return
        self.signal(member, signal.SIGTERM)
        try:
            async with asyncio.timeout(_STOP_TIMEOUT):
                await process.wait()
        except TimeoutError:
            log.warning("%s did not stop within %gs; killing it", member.name, _STOP_TIMEOUT)
            await self.kill(member)

    async def stop_gracefully(self, member: Member, bound: float) -> float | None:
        """SIGTERM ``member`` as a deployment stops it and wait for it to exit: the
        seconds it took, or None if it was still running after ``bound`` s (it is then
        killed, which disturbs the queries in flight as any kill does).

        Unlike :meth:`signal`, this is no disturbance: the server's own shutdown (a
        search server fails its readiness and finishes the queries in flight; a data
        server drains) is what is being tested, so a query in flight across it is
        judged. New queries stop going to it at once, as a load balancer takes out a
        server it stops.
        """
        process = member.process
        if process is None or process.returncode is not None:
            return 0.0
        member.graceful_stops += 1
        member.ready = False
        member.stopping = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(bound):
                await process.wait()
        except TimeoutError:
            log.warning("%s did not stop within %gs of SIGTERM; killing it", member.name, bound)
            await self.kill(member)
            return None
        return loop.time() - started

    async def restart(self, member: Member) -> None:
        if member.running:
            await self.kill(member)
        member.restarts += 1
        await self.spawn(member)

    # -- talking to the servers -----------------------------------------------------

    async def admin(
        self, member: Member, path: str, body: object = None, *, timeout: float = 5.0
    ) -> bool:
        """POST to a data server's admin endpoint; True if 2xx within ``timeout`` s."""
        headers = admin_headers(ADMIN_TOKEN if member.host is not None else None)
        try:
            async with self.http.post(
                f"{member.url}/admin/{path}",
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                await response.read()
                return response.status < 300
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("admin %s on %s failed: %s", path, member.name, exc)
            return False

    async def view(self, member: Member) -> dict[str, Any] | None:
        """A search server's ``GET /cluster``, or None if it does not answer quickly."""
        if not member.running or member.paused:
            return None
        try:
            async with self.http.get(
                f"{member.url}/cluster", timeout=aiohttp.ClientTimeout(total=1)
            ) as response:
                if response.status != 200:
                    return None
                view: dict[str, Any] = await response.json()
                return view
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def metrics(self, member: Member) -> dict[str, float] | None:
        """A server's ``GET /metrics`` as ``{"name{label=value,...}": value}`` (labels
        sorted), or None if it does not answer."""
        if not member.running or member.paused:
            return None
        try:
            async with self.http.get(
                f"{member.url}/metrics", timeout=aiohttp.ClientTimeout(total=2)
            ) as response:
                if response.status != 200:
                    return None
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None
        return parse_metrics(text)

    async def leader(self) -> Member | None:
        """The search server that says it leads (None if none does, or several)."""
        views = await asyncio.gather(*(self.view(m) for m in self.search.values()))
        leaders = [
            self.search[view["self"]]
            for view in views
            if view is not None and view.get("is_leader") and view.get("self") in self.search
        ]
        return leaders[0] if len(leaders) == 1 else None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus' text format as ``{"name{label=value,...}": value}`` (labels sorted);
    lines it cannot read are left out."""
    samples: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    except ValueError as exc:
        log.warning("unreadable metrics: %s", exc)
    return samples

"""What is true, what is published, what each search server routes with; checked all the time.

Four views (the model, ZooKeeper, the store, each search server's ``GET /cluster``) and the
check that the store's epoch never decreases; the runner awaits :meth:`wait_converged`.

Development: docs/development.md, "The chaos run" (invariants 2 and 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from discovery.config import ClusterConfig, ZkConfig
from discovery.errors import DiscoveryError, MalformedLiveListError, StoreAccessError, StoreError
from discovery.livelist.admin import LiveListAdmin, OpenedStore
from discovery.livelist.open import open_store
from discovery.livelist.shards import within_shards
from discovery.zk.membership import MembershipWatcher
from discovery.zk.session import ZkSession

from .cluster import CLUSTER_NAME, ChaosCluster
from .memory import read_memory

if TYPE_CHECKING:
    from .watch import HostileWatch

__all__ = ["Observer", "Snapshot", "Violation"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which, when (seconds into the run), during which fault, what."""

    invariant: str
    at: float
    fault: str
    detail: str


@dataclass
class Snapshot:
    """The views at one instant."""

    at: float
    model: frozenset[str]
    zk: frozenset[str] | None
    redis: frozenset[str] | None
    redis_epoch: int | None
    search: dict[str, frozenset[str]] = field(default_factory=dict)
    leaders: list[str] = field(default_factory=list)
    #: Search servers subscribed to the events channel again (after a Redis fault).
    subscribed: set[str] = field(default_factory=set)
    #: The epoch of each search server's list (``GET /cluster``).
    epochs: dict[str, int] = field(default_factory=dict)
    #: Fields of ``P:servers`` that do not decode (0 but while a hostile fault wrote
    #: some: any other time they are a violation).
    redis_problems: int = 0
    #: The leader's last heartbeat in ``P:leader``: its own wall-clock stamp, in ms.
    heartbeat_ms: float | None = None

    def leading_since(self, wall_ms: float) -> bool:
        """One search server says it leads, and a heartbeat stamped at or after
        ``wall_ms`` is in Redis: a leader in office and publishing, able to react."""
        return (
            len(self.leaders) == 1
            and self.heartbeat_ms is not None
            and self.heartbeat_ms >= wall_ms
        )

    @property
    def search_follows_redis(self) -> bool:
        """Every search server that answers holds the epoch Redis holds: after a
        failover, each has read the list from the new primary."""
        return self.redis_epoch is not None and all(
            epoch == self.redis_epoch for epoch in self.epochs.values()
        )

    @property
    def converged(self) -> bool:
        return (
            self.zk == self.model
            and self.redis == self.model
            and bool(self.search)
            and all(view == self.model for view in self.search.values())
        )

    def describe(self) -> str:
        """What differs from the model, for a violation's detail."""
        parts = []

        def diff(name: str, seen: frozenset[str] | None) -> None:
            if seen is None:
                parts.append(f"{name}: unavailable")
            elif seen != self.model:
                missing = sorted(self.model - seen)
                extra = sorted(seen - self.model)
                parts.append(f"{name}: missing {missing} extra {extra}")

        diff("zookeeper", self.zk)
        diff("redis", self.redis)
        for name, view in sorted(self.search.items()):
            diff(name, view)
        if not self.search:
            parts.append("no search server answers")
        return "; ".join(parts) or "converged"


def _serving(servers: list[dict[str, Any]]) -> frozenset[str]:
    return frozenset(
        str(s["id"])
        for s in servers
        if s.get("enabled", True)
        and (s.get("payload") or {}).get("state", s.get("state")) == "serving"
    )


class Observer:
    """Sample the views every ``interval`` seconds and check the epoch continuously.

    ``store`` reads the published list (default: a store on the cluster's URL that
    :meth:`start` opens and :meth:`aclose` closes; one passed in stays the caller's).
    """

    def __init__(
        self,
        cluster: ChaosCluster,
        *,
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        store: LiveListAdmin | None = None,
    ) -> None:
        self._cluster = cluster
        self._interval = interval
        self._clock = clock
        self._t0 = clock()
        self.model: set[str] = set(cluster.data)
        self.fault = "setup"
        self.violations: list[Violation] = []
        self.max_epoch = 0
        self.epochs_seen: set[int] = set()
        #: Per epoch, the wall-clock milliseconds of the last write seen from it (its
        #: heartbeat's own stamp, or when one of its events arrived).
        self.last_write_ms: dict[int, float] = {}
        self.publishes = 0
        self.last: Snapshot | None = None
        self._changed = asyncio.Condition()
        self._session: ZkSession | None = None
        self._watcher: MembershipWatcher | None = None
        self._store: LiveListAdmin | None = store
        self._owned: OpenedStore | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: The invariants of the hostile fault running now (:mod:`.watch`), if any.
        self.hostile: HostileWatch | None = None

    def now(self) -> float:
        """Seconds since the observer was created (the report's time axis)."""
        return self._clock() - self._t0

    def violate(self, invariant: str, detail: str) -> None:
        violation = Violation(invariant, round(self.now(), 3), self.fault, detail)
        self.violations.append(violation)
        log.error("VIOLATION %s during %s: %s", invariant, self.fault, detail)

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        cluster = self._cluster
        # The servers' own session timeout: the observer must see ZooKeeper no later
        # than they do. kazoo waits session timeout / number of servers for a server's
        # handshake, so a longer one made the observer wait 5 s on a paused ZooKeeper
        # server that still accepted connections, twice in a row once (kazoo reshuffles
        # the servers between passes): "zookeeper: unavailable" 12.6 s into a
        # zk_leader_pause while the cluster had long recovered. A session it declares
        # lost meanwhile (a quorum loss) is replaced and the watch set again, as the
        # servers' are.
        self._session = ZkSession.from_config(
            ZkConfig(
                cluster.zk_hosts,
                session_timeout=cluster.config.session_timeout,
                connect_timeout=30.0,
            )
        )
        await self._session.start()
        # Judged as the leader judges (its --shards): a phantom shard is no member.
        self._watcher = MembershipWatcher(
            self._session, admit=within_shards(cluster.config.shards, None)
        )
        await self._watcher.start()
        # The sentinel URL in a run with sentinels: the store's client follows a failover.
        if self._store is None:
            self._owned = open_store(
                ClusterConfig(cluster=CLUSTER_NAME, redis_url=cluster.redis_url),
                read_only=True,
                timeout=1.0,
            )
            self._store = self._owned.admin
        self._tasks = [
            asyncio.create_task(self._sample_forever(), name="chaos:sample"),
            asyncio.create_task(self._follow_events(), name="chaos:events"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._on_task_done)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            # A task that crashed was logged when it did (_on_task_done); closing must
            # go on, or the run's processes would outlive it.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._watcher is not None:
            await self._watcher.aclose()
        if self._session is not None:
            await self._session.aclose()
        if self._owned is not None:
            await self._owned.aclose()

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("observer task %s crashed", task.get_name(), exc_info=task.exception())

    # -- sampling ------------------------------------------------------------------

    async def sample(self) -> Snapshot:
        """Take one snapshot of every view now (also checks the published list's epoch)."""
        at, model = self.now(), frozenset(self.model)
        zk: frozenset[str] | None = None
        if self._watcher is not None and self._session is not None and self._session.connected:
            zk = frozenset(i for i, inst in self._watcher.members.items() if inst.routable)
        redis_ids, epoch, problems, heartbeat_ms = await self._read_store()
        search: dict[str, frozenset[str]] = {}
        leaders: list[str] = []
        subscribed: set[str] = set()
        epochs: dict[str, int] = {}
        members = list(self._cluster.search.values())
        views = await asyncio.gather(*(self._cluster.view(m) for m in members))
        for member, view in zip(members, views, strict=True):
            if view is None or not view.get("version"):
                continue
            search[member.name] = _serving(view.get("servers", []))
            epochs[member.name] = int(view.get("epoch") or 0)
            if view.get("is_leader"):
                leaders.append(member.name)
            if view.get("redis_connected"):
                subscribed.add(member.name)
        snapshot = Snapshot(
            at=at,
            model=model,
            zk=zk,
            redis=redis_ids,
            redis_epoch=epoch,
            search=search,
            leaders=leaders,
            subscribed=subscribed,
            epochs=epochs,
            redis_problems=problems,
            heartbeat_ms=heartbeat_ms,
        )
        self.last = snapshot
        if (watch := self.hostile) is not None:
            for invariant, detail in watch.snapshot(snapshot):
                self.violate(invariant, detail)
            self._read_memory(watch)
        async with self._changed:
            self._changed.notify_all()
        return snapshot

    def _read_memory(self, watch: HostileWatch) -> None:
        """Each running search server's resident memory, for the hostile fault's bound."""
        for member in self._cluster.search.values():
            process = member.process
            if process is None or process.returncode is not None:
                continue
            memory = read_memory(process.pid)
            if memory is not None:
                watch.memory(member.name, process.pid, memory, peak_reset=False)

    @property
    def invalid_children(self) -> Mapping[str, str]:
        """Children of ``/data_servers`` our own watcher skips, with the reason."""
        return self._watcher.invalid if self._watcher is not None else {}

    async def _read_store(
        self,
    ) -> tuple[frozenset[str] | None, int | None, int, float | None]:
        """The routable ids of the published list, its epoch, the number of its server
        entries that do not decode and the heartbeat's stamp (ms); (None, None, 0,
        None) if unreadable."""
        assert self._store is not None
        names = self._store.names
        # What these reads may not go below: the epochs published before they were sent.
        # In a leader change they may rightly see less than max_epoch by then: the new
        # leader's heartbeat is ahead of the published list until its first publish,
        # and its change can be handled while this reply is on the way (another
        # connection, another task). Neither is a step back.
        floor = self.max_epoch
        # A hostile fault that writes malformed contents on purpose judges them itself.
        garbage_expected = self.hostile is not None and self.hostile.redis_garbage
        try:
            heartbeat, published = await self._store.read_published()
        except (StoreError, StoreAccessError):
            return None, None, 0, None
        if published.error is not None and published.error != "missing":
            if not garbage_expected:
                problem = published.error.removeprefix("invalid: ")
                self.violate("published list readable", f"{names.meta} does not parse: {problem}")
            return None, None, 0, None
        heartbeat_ms: float | None = None
        if heartbeat is not None and heartbeat.epoch is not None:
            self._check_epoch(heartbeat.epoch, names.heartbeat, floor)
            if heartbeat.at is not None:
                heartbeat_ms = float(heartbeat.at)
                self._wrote(heartbeat.epoch, heartbeat_ms)
        live = published.live
        if live is None:
            return None, None, 0, heartbeat_ms
        if published.skipped and not garbage_expected:
            self.violate(
                "published list readable", f"{names.servers}: {'; '.join(published.skipped[:3])}"
            )
        self._check_epoch(live.epoch, names.meta, floor)
        routable = frozenset(k for k, instance in live.servers.items() if instance.routable)
        return routable, live.epoch, len(published.skipped), heartbeat_ms

    def _check_epoch(self, epoch: int, where: str, floor: int | None = None) -> None:
        """``epoch``, read from ``where``, must not be below ``floor``: the highest epoch
        known to be published before that read (default: the highest seen so far)."""
        limit = self.max_epoch if floor is None else floor
        if epoch < limit:
            self.violate(
                "epoch never decreases",
                f"{where} has epoch {epoch} after epoch {limit} was published",
            )
            return
        self.epochs_seen.add(epoch)
        self.max_epoch = max(self.max_epoch, epoch)

    def _wrote(self, epoch: int, at_ms: float) -> None:
        self.last_write_ms[epoch] = max(self.last_write_ms.get(epoch, 0.0), at_ms)

    async def _sample_forever(self) -> None:
        last_crash = ""
        while True:
            started = self._clock()
            try:
                await self.sample()
            except DiscoveryError as exc:
                log.warning("observer: sampling failed: %s", exc)
            except Exception as exc:
                # Something no reader may crash on (a decoder's own exception on what a
                # hostile fault wrote): a verdict, once per kind of crash, and sampling
                # goes on so that the next steps are judged too.
                crash = f"{type(exc).__name__}: {str(exc)[:200]}"
                if crash != last_crash:
                    log.exception("observer: sampling crashed")
                    self.violate("the views can be read", crash)
                last_crash = crash
            await asyncio.sleep(max(0.0, self._interval - (self._clock() - started)))

    async def _follow_events(self) -> None:
        """Every accepted publish is one write the store reports; check each one's
        epoch, in order."""
        assert self._store is not None
        where = self._store.names.changes
        # The writes are in order: each is checked against the writes before it. Not
        # against what a sample read meanwhile: a write accepted before a newer epoch's
        # publish can reach us after a sample that saw that publish.
        stream_max = 0
        async for write in self._store.publishes():
            if isinstance(write, MalformedLiveListError):
                self.violate("published change readable", f"{where}: {write}")
                continue
            self.publishes += 1
            self._check_epoch(write.epoch, f"change from {write.leader!r}", stream_max)
            stream_max = max(stream_max, write.epoch)
            self._wrote(write.epoch, time.time() * 1000)

    # -- waiting ---------------------------------------------------------------------

    async def wait_for(self, predicate: Callable[[Snapshot], bool], timeout: float) -> Snapshot:
        """Wait until a snapshot satisfies ``predicate``; TimeoutError after ``timeout``."""
        async with asyncio.timeout(timeout), self._changed:
            while self.last is None or not predicate(self.last):
                await self._changed.wait()
            return self.last

    async def wait_converged(self, timeout: float) -> float | None:
        """Seconds until all views equal the model, or None if not within ``timeout``."""
        started = self._clock()
        try:
            await self.wait_for(lambda s: s.converged, timeout)
        except TimeoutError:
            return None
        return self._clock() - started

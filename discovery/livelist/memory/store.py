"""The in-memory live-list store: :class:`MemoryLiveStore` and its :class:`MemoryAdmin`.

Every store opened on ``memory://NAME`` with the same cluster shares one list, so a leader
and its followers in one process see each other; nothing survives the process.

Design: docs/design/live-list.md, "The live-list store".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator

from prometheus_client import CollectorRegistry

from discovery.config import ClusterConfig
from discovery.errors import ConfigError, MalformedLiveListError, StoreUnavailableError
from discovery.livelist.admin import (
    ChangeNotice,
    Heartbeat,
    Published,
    RecordNames,
    Repaired,
    StoredFence,
)
from discovery.livelist.memory.follower import MemoryFollower
from discovery.livelist.memory.publisher import MemoryPublisher
from discovery.livelist.memory.state import MAX_NUMBER, MemoryList, MemorySpace
from discovery.livelist.model import LiveList
from discovery.metrics import LiveListMetrics, PublisherMetrics
from discovery.safetext import redact_url

__all__ = ["MemoryAdmin", "MemoryLiveStore"]


class MemoryAdmin:
    """Operators' access to a :class:`~discovery.livelist.memory.state.MemoryList`
    (:class:`~discovery.livelist.admin.LiveListAdmin`); ``read_only`` refuses repairs."""

    def __init__(
        self,
        memory: MemoryList,
        prefix: str,
        *,
        read_only: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._memory = memory
        self._prefix = prefix
        self._read_only = read_only
        self._clock = clock

    @property
    def backend(self) -> str:
        return "memory"

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def names(self) -> RecordNames:
        prefix = self._prefix  # named as the Redis keys are
        return RecordNames(
            f"{prefix}:meta", f"{prefix}:servers", f"{prefix}:changes", f"{prefix}:leader"
        )

    def where(self) -> str:
        return f"memory:{self._memory.name}"

    async def ping(self) -> None:
        self._memory.meta()  # raises in an outage

    async def read_published(self) -> tuple[Heartbeat | None, Published]:
        heartbeat = self._memory.heartbeat()
        meta, servers, _seq = self._memory.snapshot()
        if meta is None:
            return heartbeat, Published(None, error="missing")
        live = LiveList(meta.epoch, meta.version, meta.leader, meta.published_at, servers)
        return heartbeat, Published(live)

    async def read_fence(self) -> StoredFence:
        return self._memory.fence()

    async def repair_fence(self, stored: StoredFence, *, epoch: int, by: str) -> Repaired | None:
        if self._read_only:
            raise ConfigError(f"the live-list store {self._prefix} is read-only: cannot repair")
        if isinstance(epoch, bool) or not 0 <= epoch <= MAX_NUMBER:
            raise ValueError(f"epoch must be in 0..{MAX_NUMBER}, got {epoch!r}")
        return self._memory.repair(
            stored,
            epoch=epoch,
            leader=f"discovery fence repair ({by})",
            published_at=int(self._clock() * 1000),
        )

    async def publishes(
        self, *, retry_after: float = 0.2
    ) -> AsyncIterator[ChangeNotice | MalformedLiveListError]:
        seq = self._memory.last_seq  # from now on
        while True:
            try:
                for entry in self._memory.entries_after(seq):
                    seq = entry.seq
                    yield ChangeNotice(entry.epoch, entry.version, entry.leader, entry.kind)
                await self._memory.wait(seq, 1.0)
            except StoreUnavailableError:
                await asyncio.sleep(retry_after)


class MemoryLiveStore:
    """One cluster's live list in memory (:class:`~discovery.livelist.LiveListStore`).

    Args:
        memory: the shared list (:meth:`from_config` finds it by name).
        prefix: the cluster's name in messages, ``discovery:{<cluster>}``.
        read_only: refuse :meth:`publisher` and repairs.
        heartbeat_ttl: the heartbeat's lifetime in seconds.
        reconcile_interval: how long a quiet follower waits before it checks its list.
        registry: where the publishers' and followers' metrics go (a fresh one if None).
        clock: wall-clock seconds for the stamps.
    """

    def __init__(
        self,
        memory: MemoryList,
        prefix: str,
        *,
        read_only: bool = False,
        heartbeat_ttl: float = 5.0,
        reconcile_interval: float = 5.0,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not heartbeat_ttl > 0:
            raise ValueError(f"heartbeat_ttl must be positive, got {heartbeat_ttl!r}")
        self._memory = memory
        self._read_only = read_only
        self._heartbeat_ttl = heartbeat_ttl
        self._reconcile_interval = reconcile_interval
        self._clock = clock
        registry = registry if registry is not None else CollectorRegistry()
        self._follower_metrics = LiveListMetrics(registry)
        self._publisher_metrics = None if read_only else PublisherMetrics(registry)
        self._admin = MemoryAdmin(memory, prefix, read_only=read_only, clock=clock)

    @classmethod
    def from_config(
        cls,
        cluster: ClusterConfig,
        *,
        space: MemorySpace | None = None,
        read_only: bool = False,
        heartbeat_ttl: float = 5.0,
        reconcile_interval: float = 5.0,
        registry: CollectorRegistry | None = None,
    ) -> MemoryLiveStore:
        """The store of ``memory://NAME`` (``cluster.store_url``) for ``cluster``, on the
        list every store of that name and cluster shares (in ``space``, by default the
        process's).

        Raises:
            ConfigError: the URL is not ``memory://NAME``.
        """
        parts = urllib.parse.urlsplit(cluster.store_url)
        name = parts.netloc
        if parts.scheme != "memory" or not name or parts.path not in ("", "/"):
            raise ConfigError(
                f"--redis / DISCOVERY_REDIS_URL: {redact_url(cluster.store_url)!r} is not "
                "memory://NAME"
            )
        memory = (space or MemorySpace.process()).get(name, cluster.redis_prefix)
        return cls(
            memory,
            cluster.redis_prefix,
            read_only=read_only,
            heartbeat_ttl=heartbeat_ttl,
            reconcile_interval=reconcile_interval,
            registry=registry,
        )

    @property
    def prefix(self) -> str:
        return self._admin.prefix

    @property
    def admin(self) -> MemoryAdmin:
        return self._admin

    def publisher(self, *, leader_id: str, epoch: int) -> MemoryPublisher:
        """A fenced writer for one term.

        Raises:
            ConfigError: the store is read-only.
        """
        if self._publisher_metrics is None:
            raise ConfigError(
                f"the live-list store {self.prefix} is read-only: this server may not publish"
            )
        return MemoryPublisher(
            self._memory,
            leader_id=leader_id,
            epoch=epoch,
            metrics=self._publisher_metrics,
            heartbeat_ttl=self._heartbeat_ttl,
            clock=self._clock,
        )

    async def read(self) -> LiveList | None:
        """The stored list now; None if nothing is published.

        Raises:
            StoreUnavailableError: in a simulated outage.
        """
        meta, servers, _seq = self._memory.snapshot()
        if meta is None:
            return None
        return LiveList(meta.epoch, meta.version, meta.leader, meta.published_at, servers)

    def follower(self) -> MemoryFollower:
        """A new follower (start it, or ``async with``)."""
        return MemoryFollower(
            self._memory,
            metrics=self._follower_metrics,
            reconcile_interval=self._reconcile_interval,
            clock=self._clock,
        )

    # -- simulating a backend ----------------------------------------------------------------

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """The list is unavailable to every store that shares it inside the block."""
        self._memory.set_available(False)
        try:
            yield
        finally:
            self._memory.set_available(True)

    def trim(self, keep: int) -> None:
        """Drop all but the newest ``keep`` changes (followers behind load again)."""
        self._memory.trim(keep)

    async def aclose(self) -> None:
        """Nothing to release: the list stays for the other stores that share it."""

    async def __aenter__(self) -> MemoryLiveStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

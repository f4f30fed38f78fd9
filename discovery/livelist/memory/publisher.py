"""The fenced writer of one term on an in-memory list: :class:`MemoryPublisher`.

It keeps the rules of :class:`~discovery.livelist.redis.LivePublisher`; an outage raises
:class:`~discovery.errors.StoreUnavailableError`.

Design: docs/design/live-list.md, "The live-list store".
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping

from discovery.errors import FencedError
from discovery.instance import ServiceInstance
from discovery.livelist.memory.state import MAX_NUMBER, MemoryList, Reply
from discovery.metrics import PublisherMetrics

__all__ = ["MemoryPublisher"]

log = logging.getLogger(__name__)


class MemoryPublisher:
    """Writes ``memory`` for the leader ``leader_id`` of ``epoch``; ``heartbeat_ttl`` is
    the heartbeat's lifetime in seconds, ``clock`` wall seconds for the stamps. Calls
    are serialised; results and versions go to ``metrics``."""

    def __init__(
        self,
        memory: MemoryList,
        *,
        leader_id: str,
        epoch: int,
        metrics: PublisherMetrics,
        heartbeat_ttl: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(leader_id, str) or not leader_id:
            raise ValueError(f"leader_id must be a non-empty string, got {leader_id!r}")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_NUMBER:
            raise ValueError(f"epoch must be an integer in 0..{MAX_NUMBER}, got {epoch!r}")
        self._memory = memory
        self._leader_id = leader_id
        self._epoch = epoch
        self._metrics = metrics
        self._ttl = heartbeat_ttl
        self._clock = clock
        self._writer = uuid.uuid4().hex
        self._attempted = 0  # the highest version tried; never reused
        self._version = 0
        self._trusted = False  # a delta may follow our last write
        self._fenced: FencedError | None = None
        self._lock = asyncio.Lock()
        metrics.epoch.set(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def version(self) -> int:
        """The last version written (0 before the first publish)."""
        return self._version

    @property
    def leader_id(self) -> str:
        return self._leader_id

    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    async def publish_full(self, servers: Mapping[str, ServiceInstance]) -> int:
        """Replace the list with ``servers`` as the next version; return it."""
        async with self._lock:
            return self._write("full", servers, servers, {})

    async def publish_change(
        self,
        servers: Mapping[str, ServiceInstance],
        *,
        added: Mapping[str, ServiceInstance],
        changed: Mapping[str, ServiceInstance],
        removed: Mapping[str, str],
    ) -> int:
        """Write the next version as a delta, or in full if no delta can follow."""
        async with self._lock:
            if self._trusted:
                upserts = {**added, **changed}
                version = self._write("delta", servers, upserts, removed)
                if version:
                    return version
            return self._write("full", servers, servers, {})

    async def heartbeat(self) -> bool:
        """Refresh the heartbeat; True if the stored list is our last write."""
        async with self._lock:
            self._refuse_if_fenced("heartbeat", self._attempted)
            reply = self._run("heartbeat", self._attempted, {}, {})
            self._metrics.publishes.labels(kind="heartbeat", result="ok").inc()
            current = reply.status == "current"
            if not current:
                self._trusted = False
            return current

    def _write(
        self,
        mode: str,
        servers: Mapping[str, ServiceInstance],
        upserts: Mapping[str, ServiceInstance],
        removes: Mapping[str, str],
    ) -> int:
        """One write; the version written, or 0 for a delta the list refused (diverged)."""
        for key, instance in upserts.items():
            if key != instance.id:
                raise ValueError(f"servers[{key!r}] holds the instance {instance.id!r}")
        self._refuse_if_fenced(mode, self._attempted + 1)
        version = self._attempted = self._attempted + 1
        self._trusted = False
        reply = self._run(mode, version, upserts, removes)
        if reply.status == "diverged":
            self._metrics.publishes.labels(kind=mode, result="diverged").inc()
            log.warning(
                "memory store %s holds epoch %d version %d, not our version %d of epoch %d: "
                "publishing the whole list",
                self._memory.name,
                *reply.stored,
                self._version,
                self._epoch,
            )
            return 0
        self._version, self._trusted = version, True
        self._metrics.publishes.labels(kind=mode, result="ok").inc()
        self._metrics.version.set(version)
        self._metrics.servers.set(len(servers))
        return version

    def _run(
        self,
        mode: str,
        version: int,
        upserts: Mapping[str, ServiceInstance],
        removes: Mapping[str, str],
    ) -> Reply:
        try:
            reply = self._memory.write(
                mode=mode,
                epoch=self._epoch,
                version=version,
                prev=self._version,
                writer=self._writer,
                leader=self._leader_id,
                published_at=int(self._clock() * 1000),
                upserts=[upserts[k] for k in sorted(upserts)],
                removes={k: str(removes[k]) for k in sorted(removes)},
                heartbeat_ttl=self._ttl,
            )
        except Exception:
            self._metrics.publishes.labels(kind=mode, result="error").inc()
            raise
        if reply.status == "fenced":
            self._fenced = FencedError(
                epoch=self._epoch,
                version=version,
                stored_epoch=reply.stored[0],
                stored_version=reply.stored[1],
                reason=reply.detail,
            )
            self._metrics.publishes.labels(kind=mode, result="fenced").inc()
            log.error("memory store %s: %s", self._memory.name, self._fenced)
            raise self._fenced
        return reply

    def _refuse_if_fenced(self, kind: str, version: int) -> None:
        if self._fenced is not None:
            self._metrics.publishes.labels(kind=kind, result="fenced").inc()
            raise FencedError(
                epoch=self._epoch,
                version=version,
                stored_epoch=self._fenced.stored_epoch,
                stored_version=self._fenced.stored_version,
                reason=self._fenced.reason,
            )

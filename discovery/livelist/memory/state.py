"""The shared state of an in-memory live list: :class:`MemoryList` and :class:`MemorySpace`.

A :class:`MemoryList` holds what Redis holds for one cluster and applies the same fence to
every write, each method one atomic step under a lock (stores on several event loops may
share it). :meth:`MemoryList.set_available` simulates an outage: every call then raises
:class:`~discovery.errors.StoreUnavailableError`, and nothing is lost.

Design: docs/design/live-list.md, "The live-list store".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import immutables

from discovery.errors import StoreUnavailableError
from discovery.instance import ServiceInstance
from discovery.livelist.admin import Heartbeat, Meta, Repaired, StoredFence

__all__ = ["DEFAULT_STREAM_LENGTH", "MAX_NUMBER", "Entry", "MemoryList", "MemorySpace", "Reply"]

#: Changes kept (the Redis store's default): a follower further behind loads again.
DEFAULT_STREAM_LENGTH: Final = 10_000
#: The largest epoch or version, as in Redis (a ZooKeeper zxid is a Java long).
MAX_NUMBER: Final = 2**63 - 1


@dataclass(frozen=True)
class Entry:
    """One accepted publish in the change stream; ``seq`` orders them (from 1).

    A ``delta`` turns version ``prev`` of ``epoch`` into ``version``; a ``full`` entry
    carries no instances (load the list). ``fence`` is the meta record's generation
    when it was written."""

    seq: int
    epoch: int
    version: int
    prev: int
    kind: str
    leader: str
    published_at: int
    upserts: tuple[ServiceInstance, ...] = ()
    removes: tuple[tuple[str, str], ...] = ()
    fence: int = 0

    @property
    def position(self) -> tuple[int, int]:
        return (self.epoch, self.version)


@dataclass(frozen=True)
class Reply:
    """What :meth:`MemoryList.write` did, as the Redis script answers: ``status``
    (``published``, ``fenced``, ``diverged``, ``current``, ``stale``, ``missing``),
    ``detail`` (for ``fenced``: ``epoch`` or ``version``) and the stored position."""

    status: str
    detail: str
    stored: tuple[int, int]


def _raw(meta: Meta | None) -> tuple[bytes | None, bytes | None, bytes | None]:
    if meta is None:
        return (None, None, None)
    return (str(meta.epoch).encode(), str(meta.version).encode(), str(meta.fence).encode())


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class MemoryList:
    """One cluster's list in memory (see the module docstring). ``stream_length``
    bounds the change stream; ``monotonic`` times the heartbeat's TTL."""

    def __init__(
        self,
        name: str,
        *,
        stream_length: int = DEFAULT_STREAM_LENGTH,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if stream_length < 1:
            raise ValueError(f"stream_length must be >= 1, got {stream_length!r}")
        self.name = name
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._servers: immutables.Map[str, ServiceInstance] = immutables.Map()
        self._meta: Meta | None = None
        self._heartbeat: tuple[Heartbeat, float] | None = None
        self._entries: deque[Entry] = deque(maxlen=stream_length)
        self._seq = 0
        self._available = True
        self._waiters: set[asyncio.Future[None]] = set()

    # -- availability ------------------------------------------------------------------

    @property
    def available(self) -> bool:
        return self._available

    def set_available(self, available: bool) -> None:
        """Start (False) or end (True) a simulated outage; waiting followers notice at once."""
        with self._lock:
            self._available = available
            self._wake()

    def _check(self) -> None:
        if not self._available:
            raise StoreUnavailableError(
                f"the memory store {self.name} is unavailable (a simulated outage)"
            )

    # -- writes --------------------------------------------------------------------------

    def write(
        self,
        *,
        mode: str,
        epoch: int,
        version: int,
        prev: int,
        writer: str,
        leader: str,
        published_at: int,
        upserts: Iterable[ServiceInstance] = (),
        removes: Mapping[str, str] | None = None,
        heartbeat_ttl: float,
    ) -> Reply:
        """One fenced write: ``mode`` is ``full``, ``delta`` or ``heartbeat``.

        Refused (``fenced``, nothing written) for an epoch below the stored one, or in
        the stored epoch a version not above it (a heartbeat: below it, or equal and by
        another writer); a retried write of ours is ``published`` without writing
        again. A heartbeat writes nothing without a meta record (``missing``), else
        says whether that record is ``writer``'s last write (``current``, ``stale``).
        A delta writes nothing unless the stored record is ``writer``'s version
        ``prev`` of ``epoch`` (``diverged``). Raises StoreUnavailableError in an outage.
        """
        removes = removes or {}
        with self._lock:
            self._check()
            stored = self._meta
            ours = stored is not None and stored.writer == writer
            position = stored.position if stored is not None else (0, 0)
            if stored is not None:
                if epoch < stored.epoch:
                    return Reply("fenced", "epoch", position)
                if epoch == stored.epoch:
                    if mode != "heartbeat":
                        if version == stored.version and ours:
                            return Reply("published", "duplicate", position)
                        if version <= stored.version:
                            return Reply("fenced", "version", position)
                    elif version < stored.version or (
                        version == stored.version and stored.writer and not ours
                    ):
                        return Reply("fenced", "version", position)
            beat = Heartbeat(leader, epoch, version, published_at, None)
            expires = self._monotonic() + heartbeat_ttl
            if mode == "heartbeat":
                if stored is None:
                    return Reply("missing", "meta", position)
                self._heartbeat = (beat, expires)
                current = ours and (epoch, version) == stored.position
                return Reply("current" if current else "stale", "ok", position)
            if mode == "delta" and not (ours and position == (epoch, prev)):
                return Reply("diverged", "meta", position)
            upserted = tuple(upserts)
            with (self._servers if mode == "delta" else immutables.Map()).mutate() as servers:
                for instance in upserted:
                    servers[instance.id] = instance
                for instance_id in removes:
                    servers.pop(instance_id, None)
                self._servers = servers.finish()
            fence = stored.fence if stored is not None else 0
            self._meta = Meta(
                epoch, version, leader, published_at, len(self._servers), writer, fence
            )
            self._heartbeat = (beat, expires)
            self._append(
                epoch,
                version,
                prev if mode == "delta" else 0,
                mode,
                leader,
                published_at,
                upserted if mode == "delta" else (),
                tuple(removes.items()),
                fence,
            )
            return Reply("published", "ok", (epoch, version))

    def repair(
        self, stored: StoredFence, *, epoch: int, leader: str, published_at: int
    ) -> Repaired | None:
        """Reset the fence to ``epoch`` version 1 with the next generation, if the meta
        record still holds what ``stored`` read (else None: nothing written). The
        servers are kept; a ``full`` entry stamped with the new generation is appended.
        """
        with self._lock:
            self._check()
            if _raw(self._meta) != stored.raw:
                return None
            generation = stored.generation + 1 if stored.generation < MAX_NUMBER else 1
            count = len(self._servers)
            self._meta = Meta(epoch, 1, leader, published_at, count, "", generation)
            self._append(epoch, 1, 0, "full", leader, published_at, (), (), generation)
            return Repaired(epoch, generation, count)

    def trim(self, keep: int) -> None:
        """Drop all but the newest ``keep`` changes, as a bounded stream does."""
        with self._lock:
            while len(self._entries) > keep:
                self._entries.popleft()

    def _append(
        self,
        epoch: int,
        version: int,
        prev: int,
        kind: str,
        leader: str,
        published_at: int,
        upserts: tuple[ServiceInstance, ...],
        removes: tuple[tuple[str, str], ...],
        fence: int,
    ) -> None:
        # Called with the lock held.
        self._seq += 1
        self._entries.append(
            Entry(
                self._seq, epoch, version, prev, kind, leader, published_at, upserts, removes, fence
            )
        )
        self._wake()

    # -- reads ---------------------------------------------------------------------------

    def snapshot(self) -> tuple[Meta | None, immutables.Map[str, ServiceInstance], int]:
        """The meta record (None: nothing published), the servers and the last change's
        ``seq``, at one instant."""
        with self._lock:
            self._check()
            return self._meta, self._servers, self._seq

    def meta(self) -> Meta | None:
        with self._lock:
            self._check()
            return self._meta

    def entries_after(self, seq: int, limit: int = 500) -> list[Entry]:
        """The changes kept after ``seq``, oldest first, at most ``limit``."""
        with self._lock:
            self._check()
            # The changes kept have consecutive seqs ending at the last one: the newer
            # ones are the tail, read from the right (a follower is near the end).
            newer = min(self._seq - seq, len(self._entries))
            if newer <= 0:
                return []
            tail = list(itertools.islice(reversed(self._entries), newer))
            tail.reverse()
            return tail[:limit]

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the newest change (0 before the first)."""
        return self._seq

    def heartbeat(self) -> Heartbeat | None:
        """The leader's heartbeat with its remaining TTL, None if it ran out or never was."""
        with self._lock:
            self._check()
            if self._heartbeat is None:
                return None
            beat, expires = self._heartbeat
            left = expires - self._monotonic()
            if left <= 0:
                return None
            return Heartbeat(beat.leader, beat.epoch, beat.version, beat.at, int(left * 1000))

    def fence(self) -> StoredFence:
        """The meta record as a fence check reads it."""
        with self._lock:
            self._check()
            return StoredFence(_raw(self._meta), self._meta)

    # -- waiting -------------------------------------------------------------------------

    async def wait(self, seq: int, timeout: float) -> None:
        """Return once a change after ``seq`` exists or availability changed, or after
        ``timeout`` seconds."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._seq > seq or not self._available:
                return
            self._waiters.add(future)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, timeout)
        finally:
            with self._lock:
                self._waiters.discard(future)

    def _wake(self) -> None:
        # Called with the lock held; a waiter may be on another thread's loop.
        for future in self._waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                future.get_loop().call_soon_threadsafe(_resolve, future)
        self._waiters.clear()


class MemorySpace:
    """Named :class:`MemoryList`\\ s: every store opened on one name and cluster prefix
    shares one. :meth:`process` is the space of ``memory://NAME`` URLs, one per process
    (as SQLite's shared-cache memory databases); pass a space of your own to keep
    lists apart."""

    _process: MemorySpace | None = None
    _process_lock = threading.Lock()

    def __init__(self) -> None:
        self._lists: dict[tuple[str, str], MemoryList] = {}
        self._lock = threading.Lock()

    @classmethod
    def process(cls) -> MemorySpace:
        """The process's space, made on first use."""
        with cls._process_lock:
            if cls._process is None:
                cls._process = cls()
            return cls._process

    def get(
        self, name: str, prefix: str, *, stream_length: int = DEFAULT_STREAM_LENGTH
    ) -> MemoryList:
        """The list of ``name`` and ``prefix``, made on first use (with ``stream_length``)."""
        with self._lock:
            key = (name, prefix)
            if key not in self._lists:
                self._lists[key] = MemoryList(f"{name}/{prefix}", stream_length=stream_length)
            return self._lists[key]

    def forget(self, name: str) -> None:
        """Drop every list of ``name`` (stores still open keep theirs)."""
        with self._lock:
            for key in [key for key in self._lists if key[0] == name]:
                del self._lists[key]

"""Operators' access to a live-list store: what is published, and the fence.

:class:`LiveListAdmin` is what ``discovery status``, ``discovery fence`` and the chaos
observer read instead of a backend's keys, never on the routing path; its records are the
same for every backend. :class:`OpenedStore` is a store with its admin.

Design: docs/design/live-list.md, "The live-list store".
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, Self, runtime_checkable

from discovery.errors import MalformedLiveListError
from discovery.livelist.model import LiveList, LiveListStore

__all__ = [
    "ChangeNotice",
    "Heartbeat",
    "LiveListAdmin",
    "Meta",
    "OpenedStore",
    "Published",
    "RecordNames",
    "Repaired",
    "StoredFence",
]


@dataclass(frozen=True)
class Meta:
    """Which list the store holds, and who wrote it (Redis: ``P:meta``)."""

    epoch: int
    version: int
    leader: str
    published_at: int
    count: int
    writer: str = ""
    """An opaque token of the publisher object that wrote last (it makes a retried
    write recognisable); empty if unknown."""
    fence: int = 0
    """The fence's generation (``discovery fence repair`` changes it; absent: 0)."""

    @property
    def position(self) -> tuple[int, int]:
        return (self.epoch, self.version)


@dataclass(frozen=True)
class Heartbeat:
    """The leader's heartbeat (Redis: ``P:leader``); ``error`` if it could not be decoded.
    ``ttl_ms`` is what is left of its lifetime (None: no expiry)."""

    leader: str | None
    epoch: int | None
    version: int | None
    at: int | None
    ttl_ms: int | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "leader": self.leader,
            "epoch": self.epoch,
            "version": self.version,
            "at": self.at,
            "ttl_ms": self.ttl_ms,
            "error": self.error,
        }


@dataclass(frozen=True)
class Published:
    """The published live list as an operator reads it: ``live`` is None when it is
    absent or unreadable (``error`` says which: ``missing``, or ``invalid: <why>``);
    ``skipped`` lists server entries a reader would skip."""

    live: LiveList | None
    error: str | None = None
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoredFence:
    """The fence as read for a check: ``raw`` is the stored ``epoch``, ``version`` and
    generation as the store holds them (a repair writes nothing unless they are still
    these), ``meta`` the decoded record (None if missing or malformed, ``problem``
    saying which), ``unreadable_generation`` the generation found beside a malformed
    record (0 if none)."""

    raw: tuple[bytes | None, bytes | None, bytes | None]
    meta: Meta | None
    problem: str | None = None
    unreadable_generation: int = 0

    @property
    def missing(self) -> bool:
        return self.meta is None and self.problem is None

    @property
    def generation(self) -> int:
        """The fence generation stored (0 if absent or unreadable)."""
        return self.meta.fence if self.meta is not None else self.unreadable_generation


@dataclass(frozen=True)
class Repaired:
    """What a fence repair wrote: the new ``epoch`` (version 1), the new fence
    ``generation``, and the ``count`` of servers the list holds."""

    epoch: int
    generation: int
    count: int


@dataclass(frozen=True)
class RecordNames:
    """How a store names its records in operators' messages (Redis: the key names)."""

    meta: str
    servers: str
    changes: str
    heartbeat: str


@dataclass(frozen=True)
class ChangeNotice:
    """One accepted write, as :meth:`LiveListAdmin.publishes` reports it."""

    epoch: int
    version: int
    leader: str
    kind: str
    """``full`` or ``delta``."""


@runtime_checkable
class LiveListAdmin(Protocol):
    """Read what a store publishes and repair its fence (see the module docstring).

    Reads need the reading role's rights; :meth:`repair_fence` the publishing role's.
    Failures raise :class:`~discovery.errors.StoreError`
    (:class:`~discovery.errors.StoreUnavailableError` when the store cannot be reached)
    or :class:`~discovery.errors.StoreAccessError` when it refused our credentials.
    """

    @property
    def backend(self) -> str:
        """What the store is, for messages: ``Redis``, ``memory``."""
        ...

    @property
    def prefix(self) -> str:
        """The cluster's list in the store: ``discovery:{<cluster>}``."""
        ...

    @property
    def names(self) -> RecordNames: ...

    def where(self) -> str:
        """Where the store is, without credentials (``host:port/db``, ``sentinel:<name>/db``)."""
        ...

    async def ping(self) -> None:
        """One round trip with the reading credentials: raises if they cannot be used."""
        ...

    async def read_published(self) -> tuple[Heartbeat | None, Published]:
        """The leader's heartbeat (None if there is none) and the published list, read at
        one instant. What cannot be decoded is reported in them, never raised."""
        ...

    async def read_fence(self) -> StoredFence:
        """The fence now, for :meth:`repair_fence` (a malformed one is reported in it)."""
        ...

    async def repair_fence(self, stored: StoredFence, *, epoch: int, by: str) -> Repaired | None:
        """Reset the fence to ``epoch`` (version 1) with a new generation, atomically, if
        it still holds what ``stored`` read; None if it changed meanwhile (nothing was
        written). ``by`` names who repaired, in the record's ``leader``.

        Raises:
            ValueError: ``epoch`` is out of bounds.
            ConfigError: the store was opened read-only.
        """
        ...

    def publishes(
        self, *, retry_after: float = 0.2
    ) -> AsyncIterator[ChangeNotice | MalformedLiveListError]:
        """Every write accepted from now on, in order, or the error of one that cannot
        be decoded. Through an outage it waits and goes on where it stopped (trying
        again every ``retry_after`` seconds); it ends only when its consumer stops."""
        ...


@runtime_checkable
class OpenedStore(LiveListStore, Protocol):
    """A store as :func:`~discovery.livelist.open_store` opens it: the list's store, its
    :attr:`admin`, and ``async with`` to close what it opened."""

    @property
    def admin(self) -> LiveListAdmin: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

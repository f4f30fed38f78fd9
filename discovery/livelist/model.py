"""The live-list store seam: the :class:`LiveList` value and the protocols a backend implements.

A store gives a fenced publisher per leadership term, reads the stored list, and builds
followers. A write the backend refuses for a newer epoch or version raises
:class:`~discovery.errors.FencedError`; a follower never moves backwards in
``(epoch, version)`` and keeps its list while the backend is unreachable.

Design: docs/design/live-list.md, "The live-list store".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Protocol, Self, runtime_checkable

import immutables

from discovery.instance import ServiceInstance

__all__ = [
    "LiveList",
    "LiveListChange",
    "LiveListFollower",
    "LiveListPublisher",
    "LiveListStore",
]

_EMPTY_SERVERS: immutables.Map[str, ServiceInstance] = immutables.Map()


@dataclass(frozen=True)
class LiveList:
    """One version of the live list. ``servers`` maps ids to instances (read-only).

    ``published_at`` is the leader's wall clock in milliseconds. Draining and disabled
    servers are listed; :attr:`routable` gives the ones to send queries to.

    ``servers`` is an immutable map (a HAMT, :class:`immutables.Map`), so the next
    version is made from this one in time and memory proportional to the change
    (:meth:`apply`), sharing everything else: a change to one of 50,000 servers does
    not copy the other 49,999.
    """

    epoch: int
    version: int
    leader: str
    published_at: int
    servers: Mapping[str, ServiceInstance] = field(
        default_factory=lambda: _EMPTY_SERVERS, hash=False
    )

    EMPTY: ClassVar[LiveList]
    """Nothing published yet: epoch 0, version 0, no servers."""

    def __post_init__(self) -> None:
        # A private immutable copy (none needed if it already is one): the caller's
        # mapping cannot change the list later.
        if not isinstance(self.servers, immutables.Map):
            object.__setattr__(self, "servers", immutables.Map(self.servers))

    def apply(
        self,
        *,
        epoch: int,
        version: int,
        leader: str,
        published_at: int,
        upserts: Iterable[ServiceInstance] = (),
        removes: Iterable[str] = (),
    ) -> LiveList:
        """The next list: this one with ``removes`` taken out and ``upserts`` put in.

        O(changed): the map of servers is shared with this list, not copied.
        """
        servers = self.servers
        assert isinstance(servers, immutables.Map)
        with servers.mutate() as mutation:
            for instance_id in removes:
                mutation.pop(instance_id, None)
            for instance in upserts:
                mutation[instance.id] = instance
            changed = mutation.finish()
        return LiveList(epoch, version, leader, published_at, changed)

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, version)``: lists are ordered by it."""
        return (self.epoch, self.version)

    @property
    def routable(self) -> list[ServiceInstance]:
        """The servers to route to (enabled and serving), sorted by id."""
        return [self.servers[k] for k in sorted(self.servers) if self.servers[k].routable]


LiveList.EMPTY = LiveList(epoch=0, version=0, leader="", published_at=0)


@dataclass(frozen=True)
class LiveListChange:
    """One step of a follower's list, as :meth:`LiveListFollower.changes` reports it.

    ``previous`` and ``current`` are the lists before and after. ``added`` and
    ``changed`` map ids to the new instances, ``removed`` maps each removed id to the
    reason the leader gave (for a server that vanished from ZooKeeper, what it last
    said, e.g. ``"draining"``, else that its node was deleted). ``reload`` is true
    when the whole list was loaded again (a follower's first item, a new epoch, a
    gap, a full publish); the three maps are then computed against ``previous``.
    """

    previous: LiveList
    current: LiveList
    added: Mapping[str, ServiceInstance] = field(default_factory=lambda: _EMPTY_SERVERS)
    changed: Mapping[str, ServiceInstance] = field(default_factory=lambda: _EMPTY_SERVERS)
    removed: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    reload: bool = False

    @property
    def empty(self) -> bool:
        """True if no server was added, changed or removed (e.g. a reload that found
        the list it already had)."""
        return not (self.added or self.changed or self.removed)


@runtime_checkable
class LiveListPublisher(Protocol):
    """The fenced writer of one leadership term (one epoch).

    Versions start at 1 with the first publish and never repeat within the epoch. Calls
    are serialised by the implementation. Every method raises
    :class:`~discovery.errors.FencedError` once a newer epoch or version is stored (the
    caller must stop leading, unless no leader can hold the stored epoch:
    :mod:`discovery.zk.epochs`; it then asks a new publisher of its term later),
    :class:`~discovery.errors.StoreError` when the backend
    failed for now (the caller keeps its view and publishes in full later), and
    :class:`~discovery.errors.StoreAccessError` when it refused our credentials, which
    retrying cannot fix.
    """

    @property
    def epoch(self) -> int:
        """The term's epoch: the czxid of the leader's election node."""
        ...

    @property
    def version(self) -> int:
        """The last version written (0 before the first publish)."""
        ...

    @property
    def fenced(self) -> bool:
        """True once a write was refused; every later call raises ``FencedError``."""
        ...

    async def publish_full(self, servers: Mapping[str, ServiceInstance]) -> int:
        """Write ``servers`` (id → instance) as the next version; readers reload it."""
        ...

    async def publish_change(
        self,
        servers: Mapping[str, ServiceInstance],
        *,
        added: Mapping[str, ServiceInstance],
        changed: Mapping[str, ServiceInstance],
        removed: Mapping[str, str],
    ) -> int:
        """Write the next version as a change against the last one written.

        ``servers`` is the whole view after the change; ``removed`` maps each removed
        id to its reason. Without a trusted previous write this is a full publish.
        """
        ...

    async def heartbeat(self) -> bool:
        """Say the leader is alive; return False if the stored list is not our last write
        (lost by the backend, or never written), so the caller publishes in full."""
        ...


@runtime_checkable
class LiveListFollower(Protocol):
    """A local copy of the live list, kept current in background tasks.

    ``async with follower:`` loads the stored list (the snapshot) and follows its
    changes until closed. Starting never fails because the backend is down: the
    follower starts with :attr:`LiveList.EMPTY` and keeps trying; nothing the backend
    holds (a malformed record) stops it. The list never moves backwards in
    ``(epoch, version)``, except after an operator repaired the backend's fence (a new
    fence generation, :mod:`discovery.livelist.redis.fence`).
    """

    @property
    def current(self) -> LiveList:
        """The list to route with: the newest version seen (``LiveList.EMPTY`` at first)."""
        ...

    @property
    def connected(self) -> bool:
        """True while changes arrive as they happen."""
        ...

    @property
    def applied_at(self) -> float | None:
        """When (wall seconds) the current list was installed here; None before."""
        ...

    def age(self) -> float:
        """Seconds since the list was last confirmed current against the backend."""
        ...

    async def wait_until(self, predicate: Callable[[LiveList], bool], timeout: float) -> LiveList:
        """Wait until ``predicate(current)`` holds; ``TimeoutError`` after ``timeout``."""
        ...

    def changes(self) -> AsyncIterator[LiveListChange]:
        """Every step of the list from now on, in order, as :class:`LiveListChange`.

        The first item is the list held now, all of it ``added`` (``reload`` true).
        Items queue while the consumer is busy (none is dropped); the iterator ends
        when the follower closes. Iterators are independent of each other.
        """
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class LiveListStore(Protocol):
    """One cluster's live list in some backend (see the module docstring).

    The store owns whatever connections it opened itself; :meth:`aclose` releases
    them.
    """

    def publisher(self, *, leader_id: str, epoch: int) -> LiveListPublisher:
        """A fenced writer for one leadership term; make a new one for every term."""
        ...

    async def read(self) -> LiveList | None:
        """The stored list now (None if nothing is stored), read once, consistently.

        Raises :class:`~discovery.errors.StoreError` if it cannot be read now; a stored
        list that cannot be decoded raises
        :class:`~discovery.errors.MalformedLiveListError`.
        """
        ...

    def follower(self) -> LiveListFollower:
        """A new, not yet started follower of the stored list."""
        ...

    async def aclose(self) -> None: ...

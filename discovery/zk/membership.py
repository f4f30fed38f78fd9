"""An up-to-date, decoded view of a membership directory such as ``/data_servers``.

:class:`MembershipWatcher` keeps one *persistent recursive* watch on the directory
(ZooKeeper 3.6+ ``addWatch``, :mod:`discovery.zk.watch`): the server names each child
created, changed or deleted, so a change costs one read of that child, never a
re-list of all of them (at 50,000 data servers a re-list is 2 MB and tens of
milliseconds of CPU on both sides). On a server without ``addWatch`` (or with
``persistent_watch=False``) it falls back to one child watch on the directory and one
data watch per child, re-listing the names on every child event. Watch callbacks only
mark what is dirty and wake a single refresh task on the event loop; the task
refreshes at most once per short coalescing window (the first change after a quiet
spell at once, so a burst of 100 registrations costs two refreshes, not 100), reads
only the children that are new or whose data changed, and hands a
:class:`MembershipChange` (snapshot plus added / removed / changed) to subscribers.
The view is an immutable map (:class:`immutables.Map`): each change set makes the
next view from the last in time proportional to the change, sharing the rest, so a
change to one of 50,000 members costs what it costs with 500 (with the fallback,
plus the re-list of the children's names that a child watch requires).

A full read (start, reconnect, resync) reads every child. With the persistent watch,
whenever more than a handful of children are to be read, it uses ZooKeeper's
``multiRead`` (:func:`discovery.zk.multiread.read_many`: up to 500 children per request; on
a local ZooKeeper 50,000 children take about 0.4 s to read instead of 15 s with one
``get`` each, and 0.7 s more to decode). The child-watch fallback needs a data watch
on each child, which only a ``get`` can set, so it reads them one by one.

Failure and session behaviour:

* A child that is not a valid ServiceInstance (bad JSON, wrong fields, over the
  size bound, an ``id`` that differs from its znode name, or a persistent node whose
  document says it is an ephemeral registration: see :func:`decode_child`) is
  skipped, listed in :attr:`MembershipChange.invalid` and counted once per version;
  it never stops the watcher and never hides the other children. Skipped children
  are logged one by one up to :data:`LOGGED_SKIPS` per refresh, then summed up in one
  line (the counter stays exact), so 50,000 of them cost one screen of log, not
  50,000 lines.
* Nothing a writer of ``/data_servers`` puts there costs the watcher more than linear
  time: the skipped children are kept in an immutable map like the members, so a
  change set costs what changed whatever the number of invalid children, and a full
  read of malformed children costs what as many valid ones cost (copying the invalid
  set once per skipped child, as the watcher once did, is quadratic: about 10 s of
  blocked event loop at 50,000; ``bench/bench_invalid_children.py``). A full read
  yields to the event loop every 500 children decoded and every 2,000 applied.
* While the connection is SUSPENDED the last view is kept (it is still our best
  knowledge; readers can see :attr:`MembershipWatcher.stale`). On every reconnect,
  and after a session expiry, the whole directory is re-read, so changes made while
  we were away are seen even if a watch was lost with the session (with the
  persistent watch: once it is back on the server, at its ``resync`` event).
* A refresh that fails is retried at the next reconnect, or after a short pause if
  the connection is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

import immutables
from prometheus_client import CollectorRegistry

from discovery.errors import (
    InvalidInstanceError,
    PayloadTooLargeError,
    ZkError,
    ZkNoNodeError,
    ZkUnsupportedError,
)
from discovery.instance import MAX_INSTANCE_BYTES, ServiceInstance
from discovery.metrics import MembershipMetrics
from discovery.zk.multiread import read_many
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import NodeStat, SessionEvent, SessionState, WatchEvent, ZkSession
from discovery.zk.watch import SessionRecursiveWatch

__all__ = [
    "LOGGED_SKIPS",
    "PERSISTENT_DYNAMIC",
    "MembershipChange",
    "MembershipSubscription",
    "MembershipWatcher",
    "decode_child",
]

log = logging.getLogger(__name__)

_RETRY_INTERVAL = 1.0
# More children than this to read at once (persistent watch only) go by multiRead.
_BULK_READ_MIN = 16
# Children decoded between two yields to the loop in a bulk read (~7 ms of decoding).
_DECODE_SLICE = 500
# Children applied to the view between two yields to the loop (~5 ms): applying 50,000
# at once held the loop (which may be serving queries beside the leader) for 200 ms.
_APPLY_SLICE = 2000

#: Skipped children logged one by one in one refresh; the rest go in one summary line.
LOGGED_SKIPS: Final = 10

#: The reason prefix (and metric label) of a persistent node whose document says it is
#: an ephemeral registration.
PERSISTENT_DYNAMIC: Final = "persistent_dynamic"

# Curator's service types that it registers as EPHEMERAL (_SEQUENTIAL) nodes; PERMANENT
# and STATIC are written as persistent nodes on purpose.
_EPHEMERAL_SERVICE_TYPES: Final = frozenset({"DYNAMIC", "DYNAMIC_SEQUENTIAL"})

# A child as read: the instance or why it was skipped, and its stat; None: gone.
_Read = tuple[ServiceInstance | None, str | None, NodeStat]

_EMPTY: Mapping[str, ServiceInstance] = MappingProxyType({})
_NO_INVALID: immutables.Map[str, str] = immutables.Map()


def decode_child(
    child: str, data: bytes, stat: NodeStat, *, max_bytes: int = MAX_INSTANCE_BYTES
) -> ServiceInstance | str:
    """Decode one child of a membership directory: the instance, or why it is skipped.

    The reason starts with a short word, used as the metric label: ``too_large``,
    ``malformed`` (not a valid ServiceInstance), ``id_mismatch`` (the document's ``id``
    is not the znode's name) or :data:`PERSISTENT_DYNAMIC`: the document's
    ``serviceType`` is ``DYNAMIC`` or ``DYNAMIC_SEQUENTIAL``, which Curator (and our
    :class:`~discovery.zk.registration.Registration`) only ever write as an ephemeral
    node, but the node has no owning session (``ephemeralOwner`` 0). Such a node
    would outlive whatever wrote it, so a server that is gone, or anyone allowed to
    create a node, could stand in for a live registration for ever; it is refused.
    Curator's ``PERMANENT`` and ``STATIC`` documents are persistent by design and
    decode as usual. Never raises for bad data: that is what the reason is for.
    """
    try:
        instance = ServiceInstance.from_json(data, max_bytes=max_bytes)
    except PayloadTooLargeError as exc:
        return f"too_large: {exc}"
    except InvalidInstanceError as exc:
        return f"malformed: {exc}"
    if instance.id != child:
        return f"id_mismatch: znode {child!r} holds id {instance.id!r}"
    if stat.ephemeral_owner == 0 and instance.service_type in _EPHEMERAL_SERVICE_TYPES:
        return (
            f"{PERSISTENT_DYNAMIC}: serviceType {instance.service_type} is an ephemeral "
            "registration but the node is persistent (no owning session); a persistent "
            "registration says PERMANENT or STATIC"
        )
    return instance


@dataclass(frozen=True)
class MembershipChange:
    """One change set. ``members`` is the whole view after the change.

    ``added``, ``removed`` and ``changed`` map instance ids to instances (for
    ``removed``, the last version we saw); ``invalid`` maps the ids of children
    currently skipped to the reason. ``members`` and ``invalid`` are immutable maps
    shared with the watcher: the next change set's share all but what changed (a
    change set whose invalid children did not change holds the very same ``invalid``).
    ``resync`` is true when the change came from a full re-read (start, reconnect,
    session expiry) or is a new subscriber's first.
    """

    generation: int
    members: Mapping[str, ServiceInstance]
    added: Mapping[str, ServiceInstance] = field(default_factory=lambda: _EMPTY)
    removed: Mapping[str, ServiceInstance] = field(default_factory=lambda: _EMPTY)
    changed: Mapping[str, ServiceInstance] = field(default_factory=lambda: _EMPTY)
    invalid: Mapping[str, str] = field(default_factory=lambda: _NO_INVALID)
    resync: bool = False

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


class MembershipSubscription:
    """An async iterator of :class:`MembershipChange`; ends when the watcher closes.

    The first item is the current view with every member in ``added``; then every
    change set in order (none is dropped: a slow consumer sees them queued).
    """

    def __init__(self, unsubscribe: Callable[[MembershipSubscription], None]) -> None:
        self._unsubscribe = unsubscribe
        self._queue: asyncio.Queue[MembershipChange | None] = asyncio.Queue()

    def put(self, change: MembershipChange) -> None:
        """Queue ``change`` for the consumer (the watcher's side; never blocks)."""
        self._queue.put_nowait(change)

    def __aiter__(self) -> AsyncIterator[MembershipChange]:
        return self

    async def __anext__(self) -> MembershipChange:
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    def close(self) -> None:
        self._unsubscribe(self)
        self._queue.put_nowait(None)


class MembershipWatcher:
    """Watch ``path`` and keep its children decoded as :class:`ServiceInstance`.

    ``async with MembershipWatcher(session) as watcher:`` reads the directory once
    (creating it if missing), then follows it in a background task until closed.
    ``admit`` is a deployment's own rule on top of the contract's: it says why a
    valid registration is to be skipped (a reason starting with its metric label,
    ``not_allowed: ...``), or None; such a child is skipped and counted like a
    malformed one.
    """

    def __init__(
        self,
        session: ZkSession,
        path: str = DATA_SERVERS_PATH,
        *,
        coalesce_window: float = 0.05,
        max_bytes: int = MAX_INSTANCE_BYTES,
        read_concurrency: int = 256,
        persistent_watch: bool = True,
        registry: CollectorRegistry | None = None,
        metrics: MembershipMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        admit: Callable[[ServiceInstance], str | None] | None = None,
    ) -> None:
        self._session = session
        self._admit = admit
        # True while the persistent recursive watch is in use (falls back when the
        # server lacks addWatch, or the watch fails).
        self._persistent = persistent_watch
        self._recursive: SessionRecursiveWatch | None = None
        self.path = path.rstrip("/") or "/"
        self._window = coalesce_window
        self._max_bytes = max_bytes
        self._read_slots = asyncio.Semaphore(read_concurrency)
        self._clock = clock
        # ``metrics`` lets an owner that creates watchers repeatedly (a leader, once per
        # term) keep one set of metrics on its registry.
        self._metrics = metrics or MembershipMetrics(
            registry if registry is not None else CollectorRegistry()
        )
        # An immutable map (HAMT): each view shares all but what changed with the last.
        self._members: immutables.Map[str, ServiceInstance] = immutables.Map()
        # Immutable too, for the same reason: a writer can make tens of thousands of
        # children invalid, and a copy per change (or per skipped child) is quadratic.
        self._invalid: immutables.Map[str, str] = _NO_INVALID
        self._counted_invalid: dict[str, int] = {}  # child -> mzxid already counted
        self._children: set[str] = set()
        self._generation = 0
        self._full = True
        self._children_dirty = True
        self._dirty_nodes: set[str] = set()
        self._wake = asyncio.Event()
        self._changed = asyncio.Condition()
        self._subscribers: set[MembershipSubscription] = set()
        self._task: asyncio.Task[None] | None = None
        self._refreshed_at: float | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Read the directory once and start following it.

        Raises:
            ZkError: the first read failed (not connected, not allowed).
        """
        self._session.add_listener(self._on_session_event)
        try:
            await self._session.ensure_path(self.path)
            if self._persistent:
                await self._start_recursive()
            await self._refresh_once()
        except BaseException:
            self._session.remove_listener(self._on_session_event)
            await self._stop_recursive()
            raise
        self._task = asyncio.create_task(self._run(), name=f"membership:{self.path}")
        self._task.add_done_callback(self._on_task_done)

    async def _start_recursive(self) -> None:
        # Added before the first read: a change after that read is then reported.
        watch = SessionRecursiveWatch(self._session, self.path, self._on_recursive_event)
        try:
            await watch.start()
        except ZkUnsupportedError as exc:
            log.warning(
                "%s: the ZooKeeper server has no persistent watches (%s); re-listing the "
                "children on every change instead",
                self.path,
                exc,
            )
            self._persistent = False
            return
        self._recursive = watch

    async def _stop_recursive(self) -> None:
        watch, self._recursive = self._recursive, None
        if watch is not None:
            await watch.aclose()

    @property
    def persistent(self) -> bool:
        """True while following with a persistent recursive watch (else re-listing)."""
        return self._persistent

    async def aclose(self) -> None:
        """Stop following; subscriptions end."""
        self._session.remove_listener(self._on_session_event)
        await self._stop_recursive()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for subscription in list(self._subscribers):
            subscription.close()

    async def __aenter__(self) -> MembershipWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the view ----------------------------------------------------------------

    @property
    def members(self) -> Mapping[str, ServiceInstance]:
        """The current valid members by id (read-only)."""
        return self._members

    @property
    def invalid(self) -> Mapping[str, str]:
        """Children currently skipped, with the reason (read-only)."""
        return self._invalid

    @property
    def generation(self) -> int:
        """Increases by one with every change set."""
        return self._generation

    @property
    def stale(self) -> bool:
        """True while the connection is not up, so the view may be out of date."""
        return not self._session.connected

    def subscribe(self) -> MembershipSubscription:
        """Receive the current view, then every change (see :class:`MembershipSubscription`)."""
        subscription = MembershipSubscription(self._subscribers.discard)
        if self._generation:
            subscription.put(
                MembershipChange(
                    self._generation,
                    self._members,
                    added=self._members,
                    invalid=self._invalid,
                    resync=True,
                )
            )
        self._subscribers.add(subscription)
        return subscription

    async def wait_until(
        self, predicate: Callable[[Mapping[str, ServiceInstance]], bool], timeout: float
    ) -> Mapping[str, ServiceInstance]:
        """Wait until ``predicate(members)`` holds; returns the members then.

        Raises:
            TimeoutError: it did not hold within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self._members))
            return self._members

    # -- watch and session callbacks (on the loop) ----------------------------

    def _on_session_event(self, event: SessionEvent) -> None:
        # With the persistent watch, its resync event (once it is back on the server)
        # asks for the re-read instead: a read before it could miss a change.
        if event.state is SessionState.CONNECTED and not self._persistent:
            # Re-read everything: after an expiry our watches are gone, and after a
            # long disconnect a full read is the simplest proof of being current.
            self._full = True
            self._wake.set()

    def _on_recursive_event(self, event: WatchEvent) -> None:
        if event.kind == "resync":
            self._full = True
        elif event.kind == "failed":
            log.warning("%s: the persistent watch failed; re-listing the children", self.path)
            self._persistent = False
            self._full = True
        elif event.path.rsplit("/", 1)[0] == self.path:
            # A child created, changed or deleted: read it (a deleted one reads as gone).
            self._dirty_nodes.add(event.path.rsplit("/", 1)[-1])
        elif event.path == self.path:
            self._full = True  # the directory itself was deleted or created
        else:
            return  # deeper nodes are not members
        self._wake.set()

    def _on_children_event(self, event: WatchEvent) -> None:
        self._children_dirty = True
        self._wake.set()

    def _on_node_event(self, event: WatchEvent) -> None:
        child = event.path.rsplit("/", 1)[-1]
        if event.kind in ("changed", "deleted", "created"):
            self._dirty_nodes.add(child)
            self._wake.set()

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("membership watcher of %s crashed", self.path, exc_info=task.exception())

    # -- refreshing -----------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_refresh = -math.inf
        while True:
            await self._wake.wait()
            # Coalescing, leading edge: a change after a quiet spell is read at once
            # (a lone removal reaches the leader without added delay); changes that
            # follow within the window wait for its end and are read together, so a
            # burst of 100 registrations still costs one read per window.
            delay = last_refresh + self._window - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self._wake.clear()
            if not self._session.connected:
                continue  # the CONNECTED event wakes us with a full re-read
            last_refresh = loop.time()
            try:
                await self._refresh_once()
            except ZkError as exc:
                log.warning("refreshing %s failed, retrying: %s", self.path, exc)
                self._full = True
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_RETRY_INTERVAL):
                        await self._wake.wait()
                self._wake.set()

    async def _refresh_once(self) -> None:
        full, children_dirty, dirty = self._full, self._children_dirty, self._dirty_nodes
        self._full, self._children_dirty, self._dirty_nodes = False, False, set()
        try:
            await self._refresh(full, children_dirty or full, dirty)
        except BaseException:
            # Nothing of this round was applied: do it all again next time.
            self._full = True
            raise

    async def _refresh(self, full: bool, relist: bool, dirty: set[str]) -> None:
        started = self._clock()
        if relist:
            children = set(await self._list_children())
            new = children - self._children
            gone = self._children - children
        else:
            # Updated in place below (a copy would cost O(members) per change). The
            # persistent watch names new children; the child watch relists for them.
            children, gone = self._children, set()
            new = dirty - children if self._persistent else set()
        to_read = sorted(children if full else new | (dirty & children))
        reads: list[_Read | None]
        if self._persistent and len(to_read) > _BULK_READ_MIN:
            reads = await self._read_bulk(to_read)
        else:
            reads = await asyncio.gather(*(self._read(child) for child in to_read))

        # Only what was listed away or read is looked at: O(changed), not O(members),
        # and the next views (members and invalid) share everything else with these.
        old = self._members
        old_invalid = self._invalid
        added: dict[str, ServiceInstance] = {}
        removed: dict[str, ServiceInstance] = {}
        changed: dict[str, ServiceInstance] = {}
        invalid_changed = False
        skips = _Skips(self.path, self._metrics)
        try:
            with old.mutate() as members, old_invalid.mutate() as invalid:
                if full:
                    gone = set(old) - children
                    gone |= {child for child in old_invalid if child not in children}
                for index, child in enumerate(gone):
                    if index and index % _APPLY_SLICE == 0:
                        await asyncio.sleep(0)  # see _APPLY_SLICE
                    instance = members.pop(child, None)
                    if instance is not None:
                        removed[child] = instance
                    if invalid.pop(child, None) is not None:
                        invalid_changed = True
                    self._counted_invalid.pop(child, None)
                for index, (child, result) in enumerate(zip(to_read, reads, strict=True)):
                    if index and index % _APPLY_SLICE == 0:
                        await asyncio.sleep(0)
                    before = old.get(child)
                    if result is None:
                        # Deleted (since listed): a watch has fired or will fire for it.
                        children.discard(child)
                        if before is not None:
                            members.pop(child, None)
                            removed[child] = before
                        if invalid.pop(child, None) is not None:
                            invalid_changed = True
                        self._counted_invalid.pop(child, None)
                        continue
                    instance, reason, stat = result
                    children.add(child)
                    if instance is not None:
                        members[child] = instance
                        if before is None:
                            added[child] = instance
                        elif before != instance:
                            changed[child] = instance
                        if invalid.pop(child, None) is not None:
                            invalid_changed = True
                            self._counted_invalid.pop(child, None)
                        continue
                    if before is not None:
                        members.pop(child, None)
                        removed[child] = before
                    if reason is not None:
                        if invalid.get(child) != reason:
                            invalid[child] = reason
                            invalid_changed = True
                        if self._counted_invalid.get(child) != stat.mzxid:
                            self._counted_invalid[child] = stat.mzxid
                            skips.skipped(child, reason)
                view = members.finish()
                # An unchanged invalid set stays the same object: change sets share it.
                invalid_view = invalid.finish() if invalid_changed else old_invalid
        finally:
            # Even when interrupted: what _counted_invalid now holds is counted.
            skips.close()
        self._children = children
        if full:
            self._metrics.resyncs.inc()
        self._metrics.refresh_seconds.observe(self._clock() - started)
        if added or removed or changed or invalid_changed or self._generation == 0:
            await self._publish(view, added, removed, changed, invalid_view, resync=full)

    async def _list_children(self) -> list[str]:
        try:
            return await self._session.get_children(self.path, watch=self._children_watch())
        except ZkNoNodeError:
            # Someone deleted the directory; it comes back with the next registration.
            await self._session.ensure_path(self.path)
            return await self._session.get_children(self.path, watch=self._children_watch())

    def _children_watch(self) -> Callable[[WatchEvent], None] | None:
        return None if self._persistent else self._on_children_event

    async def _read(self, child: str) -> _Read | None:
        """Read and decode one child; None if it no longer exists."""
        async with self._read_slots:
            try:
                data, stat = await self._session.get(
                    f"{self.path}/{child}",
                    watch=None if self._persistent else self._on_node_event,
                )
            except ZkNoNodeError:
                return None
        return self._decode(child, data, stat)

    async def _read_bulk(self, children: list[str]) -> list[_Read | None]:
        """Read and decode many children by multiRead, in order; None for those gone.

        Sets no data watch (multiRead cannot): for the persistent-watch mode only.
        """
        raw = await read_many(self._session, [f"{self.path}/{child}" for child in children])
        reads: list[_Read | None] = []
        for index, (child, entry) in enumerate(zip(children, raw, strict=True)):
            if index and index % _DECODE_SLICE == 0:
                await asyncio.sleep(0)  # 50,000 children take ~0.7 s to decode
            reads.append(None if entry is None else self._decode(child, *entry))
        return reads

    def _decode(self, child: str, data: bytes, stat: NodeStat) -> _Read:
        """Decode one child's data; the instance, or None and why it is skipped."""
        decoded = decode_child(child, data, stat, max_bytes=self._max_bytes)
        if isinstance(decoded, str):
            return None, decoded, stat
        if self._admit is not None and (refused := self._admit(decoded)) is not None:
            return None, refused, stat
        return decoded, None, stat

    async def _publish(
        self,
        members: immutables.Map[str, ServiceInstance],
        added: dict[str, ServiceInstance],
        removed: dict[str, ServiceInstance],
        changed: dict[str, ServiceInstance],
        invalid: immutables.Map[str, str],
        *,
        resync: bool,
    ) -> None:
        self._generation += 1
        self._members = members
        self._invalid = invalid
        change = MembershipChange(
            generation=self._generation,
            members=self._members,
            added=MappingProxyType(added),
            removed=MappingProxyType(removed),
            changed=MappingProxyType(changed),
            invalid=invalid,
            resync=resync,
        )
        self._metrics.members.set(len(members))
        self._metrics.invalid.set(len(invalid))
        self._metrics.updates.inc()
        if added or removed or changed:
            log.info(
                "%s: %d members (+%d -%d ~%d, %d invalid)",
                self.path,
                len(members),
                len(added),
                len(removed),
                len(changed),
                len(invalid),
            )
        for subscription in list(self._subscribers):
            subscription.put(change)
        async with self._changed:
            self._changed.notify_all()


class _Skips:
    """The children skipped in one refresh: counted by reason (the metric is increased
    once per reason, at :meth:`close`) and logged, the first :data:`LOGGED_SKIPS` one by
    one, then in one line summing up the rest.

    A writer of the directory can create any number of bad children; a log line (or a
    labelled metric look-up, a third of the bookkeeping's time) for each would cost
    more than the rest of their bookkeeping.
    """

    def __init__(self, path: str, metrics: MembershipMetrics) -> None:
        self._path = path
        self._metrics = metrics
        self._by_reason: Counter[str] = Counter()
        self._logged = 0

    def skipped(self, child: str, reason: str) -> None:
        self._by_reason[reason.split(":", 1)[0]] += 1
        if self._logged < LOGGED_SKIPS:
            self._logged += 1
            log.warning("skipping %s/%s: %s", self._path, child, reason)

    def close(self) -> None:
        for label, count in self._by_reason.items():
            self._metrics.skipped_total.labels(reason=label).inc(count)
        total = sum(self._by_reason.values())
        if total > self._logged:
            log.warning(
                "%s: %d more children skipped in this refresh than logged above "
                "(%d in all: %s); `discovery status` lists every one with its reason",
                self._path,
                total - self._logged,
                total,
                ", ".join(f"{label} {count}" for label, count in sorted(self._by_reason.items())),
            )

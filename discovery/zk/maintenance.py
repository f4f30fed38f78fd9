"""Operators' maintenance markers (``/maintenance/<id>``) and the leader's overlay of them.

:class:`MaintenanceMarker` is the document; its :meth:`~MaintenanceMarker.parse` never
raises (an unreadable marker still keeps its server out). :func:`apply_marker`,
:func:`overlay` and :class:`MaintenanceView` lay markers over a membership view.
:class:`MaintenanceWatcher` follows them for the leader: callbacks on the loop, markers
kept while SUSPENDED and all read again on every CONNECTED.

Design: docs/design/live-list.md, "Operator maintenance".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import immutables
from prometheus_client import CollectorRegistry

from discovery.errors import InvalidInstanceError, InvalidMarkerError, ZkError, ZkNoNodeError
from discovery.instance import InstanceState, ServiceInstance, validate_instance_id
from discovery.metrics import MaintenanceMetrics
from discovery.zk.paths import MAINTENANCE_PATH
from discovery.zk.session import NodeStat, SessionEvent, SessionState, WatchEvent, ZkSession

__all__ = [
    "MAX_MARKER_BYTES",
    "MAX_REASON_LENGTH",
    "MaintenanceMarker",
    "MaintenanceView",
    "MaintenanceWatcher",
    "apply_marker",
    "overlay",
    "read_markers",
]

log = logging.getLogger(__name__)

#: Upper bound, in bytes, of a marker document (as for a ServiceInstance).
MAX_MARKER_BYTES: Final = 64 * 1024
#: Longest reason, in characters: it is published with every upsert of the server.
MAX_REASON_LENGTH: Final = 500
#: Longest ``by`` (who set the marker), in characters.
MAX_BY_LENGTH: Final = 200

_RETRY_INTERVAL = 1.0
# A problem quoted in a published reason or a log line is cut beyond this.
_MAX_PROBLEM = 160


def _reason_problem(reason: object) -> str | None:
    """Why ``reason`` cannot be a marker's reason, or None if it can."""
    if not isinstance(reason, str):
        return f"reason must be a string, got {type(reason).__name__}"
    if not reason.strip():
        return "reason must not be blank"
    if len(reason) > MAX_REASON_LENGTH:
        return f"reason is {len(reason)} characters, more than {MAX_REASON_LENGTH}"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in reason):
        return "reason must be one line of printable text (no control characters)"
    try:
        reason.encode("utf-8")
    except UnicodeEncodeError:
        return "reason is not valid Unicode text"
    return None


def _short(text: str) -> str:
    return text if len(text) <= _MAX_PROBLEM else text[: _MAX_PROBLEM - 3] + "..."


@dataclass(frozen=True)
class MaintenanceMarker:
    """One ``/maintenance/<instance_id>`` marker.

    ``reason`` is what the leader publishes; ``set_at`` (ms since the epoch) and ``by``
    say when and by whom it was set (None if the document does not say). ``problem``
    is None for a readable marker; for an unreadable one it says why, and ``reason``
    then says the marker is unreadable (the server is still in maintenance).
    """

    instance_id: str
    reason: str
    set_at: int | None = None
    by: str | None = None
    problem: str | None = None

    @property
    def readable(self) -> bool:
        return self.problem is None

    @classmethod
    def create(
        cls,
        instance_id: str,
        reason: str,
        *,
        by: str | None = None,
        set_at: int | None = None,
    ) -> MaintenanceMarker:
        """A marker to write; ``set_at`` defaults to now.

        Raises:
            InvalidMarkerError: ``instance_id`` is not an instance id, ``reason`` is
                blank, longer than :data:`MAX_REASON_LENGTH`, or not one line of text,
                or ``by`` is too long. The message names the argument (``id``,
                ``reason``, ``by``).
        """
        try:
            validate_instance_id(instance_id)
        except InvalidInstanceError as exc:
            raise InvalidMarkerError(str(exc).removeprefix("invalid ServiceInstance: ")) from None
        problem = _reason_problem(reason)
        if problem is not None:
            raise InvalidMarkerError(problem)
        if by is not None and (len(by) > MAX_BY_LENGTH or _reason_problem(by) is not None):
            raise InvalidMarkerError(
                f"by must be one line of at most {MAX_BY_LENGTH} printable characters"
            )
        if set_at is None:
            set_at = int(time.time() * 1000)
        return cls(instance_id, reason, set_at, by)

    @classmethod
    def parse(cls, instance_id: str, data: bytes) -> MaintenanceMarker:
        """Decode the data of ``/maintenance/<instance_id>``; never raises.

        A document that cannot be used gives a marker with ``problem`` set and a
        reason saying the marker is unreadable: the server stays in maintenance.
        Unknown keys are ignored (a newer writer's fields).
        """

        def unreadable(problem: str) -> MaintenanceMarker:
            problem = _short(problem)
            return cls(instance_id, f"maintenance marker unreadable: {problem}", problem=problem)

        try:
            validate_instance_id(instance_id)
        except InvalidInstanceError:
            return unreadable("bad_name: the znode name is not an instance id")
        if len(data) > MAX_MARKER_BYTES:
            return unreadable(f"too_large: {len(data)} bytes, more than {MAX_MARKER_BYTES}")
        try:
            document: Any = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return unreadable(f"malformed: not a JSON document ({type(exc).__name__})")
        if not isinstance(document, dict):
            return unreadable("malformed: not a JSON object")
        reason = document.get("reason")
        problem = _reason_problem(reason)
        if problem is not None:
            return unreadable(f"malformed: {problem}")
        set_at = document.get("set_at")
        if set_at is not None and (
            isinstance(set_at, bool) or not isinstance(set_at, int) or not 0 <= set_at < 2**63
        ):
            return unreadable("malformed: set_at must be milliseconds since the epoch")
        by = document.get("by")
        if by is not None and (
            not isinstance(by, str) or len(by) > MAX_BY_LENGTH or _reason_problem(by) is not None
        ):
            return unreadable(f"malformed: by must be a string of at most {MAX_BY_LENGTH}")
        assert isinstance(reason, str)
        return cls(instance_id, reason, set_at, by)

    def to_json(self) -> bytes:
        """The document to store (``reason``, ``set_at``, ``by``)."""
        document = {"reason": self.reason, "set_at": self.set_at, "by": self.by}
        return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def to_dict(self) -> dict[str, Any]:
        """For JSON output: ``id``, ``reason``, ``set_at``, ``by``, ``readable``, ``problem``."""
        return {
            "id": self.instance_id,
            "reason": self.reason,
            "set_at": self.set_at,
            "by": self.by,
            "readable": self.readable,
            "problem": self.problem,
        }


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# -- the overlay ---------------------------------------------------------------------------


def apply_marker(instance: ServiceInstance, marker: MaintenanceMarker) -> ServiceInstance:
    """``instance`` as the leader publishes it under ``marker``: state ``maintenance``,
    the marker's reason, ``enabled: false``. Everything else stays as registered."""
    try:
        return instance.with_state(InstanceState.MAINTENANCE, marker.reason)
    except InvalidInstanceError:  # pragma: no cover - parse() validated the reason
        return instance.with_state(InstanceState.MAINTENANCE, "maintenance")


def overlay(
    members: Mapping[str, ServiceInstance], markers: Mapping[str, MaintenanceMarker]
) -> Mapping[str, ServiceInstance]:
    """``members`` with every marker of a member applied, in O(markers).

    An :class:`immutables.Map` gives a map sharing everything else with it; any other
    mapping is copied. Markers of ids that are not members change nothing.
    """
    changed = {k: apply_marker(members[k], m) for k, m in markers.items() if k in members}
    if not changed:
        return members
    if isinstance(members, immutables.Map):
        return members.update(changed)
    return {**members, **changed}


class MaintenanceView(Mapping[str, ServiceInstance]):
    """``members`` with ``markers`` applied lazily: building it costs nothing, looking
    an id up applies its marker (if any), counting is ``len(members)``.

    Both mappings must not change afterwards (the watchers' views are immutable).
    """

    __slots__ = ("_markers", "_members")

    def __init__(
        self, members: Mapping[str, ServiceInstance], markers: Mapping[str, MaintenanceMarker]
    ) -> None:
        self._members = members
        self._markers = markers

    def __getitem__(self, key: str) -> ServiceInstance:
        instance = self._members[key]
        marker = self._markers.get(key)
        return instance if marker is None else apply_marker(instance, marker)

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, key: object) -> bool:
        return key in self._members


# -- reading ---------------------------------------------------------------------------------


async def read_markers(
    session: ZkSession, path: str = MAINTENANCE_PATH
) -> dict[str, MaintenanceMarker]:
    """Every marker under ``path`` by id, read once (none if ``path`` does not exist).

    Raises:
        ZkError: ZooKeeper could not be read.
    """
    try:
        children = await session.get_children(path)
    except ZkNoNodeError:
        return {}

    async def read(child: str) -> MaintenanceMarker | None:
        try:
            data, _stat = await session.get(f"{path}/{child}")
        except ZkNoNodeError:
            return None  # cleared meanwhile
        return MaintenanceMarker.parse(child, data)

    markers = await asyncio.gather(*(read(child) for child in children))
    return {m.instance_id: m for m in markers if m is not None}


class MaintenanceWatcher:
    """Follow the markers under ``path`` (docs/design/live-list.md, "Operator maintenance").

    ``async with MaintenanceWatcher(session, on_change=...) as watcher:`` reads the
    markers once, then follows them in a background task until closed. :attr:`markers`
    is the current, immutable view; ``on_change(ids)`` is called on the event loop
    with the ids whose marker appeared, changed or went, after :attr:`markers` shows it.
    """

    def __init__(
        self,
        session: ZkSession,
        path: str = MAINTENANCE_PATH,
        *,
        on_change: Callable[[frozenset[str]], None] | None = None,
        metrics: MaintenanceMetrics | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._session = session
        self.path = path.rstrip("/") or "/"
        self._on_change = on_change
        # ``metrics`` lets an owner that creates watchers repeatedly (a leader, once per
        # term) keep one set on its registry.
        self._metrics = metrics or MaintenanceMetrics(
            registry if registry is not None else CollectorRegistry()
        )
        self._markers: immutables.Map[str, MaintenanceMarker] = immutables.Map()
        self._children: set[str] = set()
        self._counted: dict[str, int] = {}  # child -> mzxid of the unreadable version counted
        self._full = True
        self._children_dirty = True
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._generation = 0

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Read the markers once and start following them.

        Raises:
            ZkError: the first read failed (not connected, not allowed to read).
        """
        self._session.add_listener(self._on_session_event)
        try:
            await self._refresh_once()
        except BaseException:
            self._session.remove_listener(self._on_session_event)
            raise
        self._task = asyncio.create_task(self._run(), name=f"maintenance:{self.path}")
        self._task.add_done_callback(self._on_task_done)

    async def aclose(self) -> None:
        """Stop following (the watches left in ZooKeeper then fire into nothing)."""
        self._session.remove_listener(self._on_session_event)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def __aenter__(self) -> MaintenanceWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the view --------------------------------------------------------------------

    @property
    def markers(self) -> Mapping[str, MaintenanceMarker]:
        """The current markers by instance id (immutable; unreadable ones included)."""
        return self._markers

    @property
    def generation(self) -> int:
        """Increases with every change of :attr:`markers`."""
        return self._generation

    async def wait_until(
        self, predicate: Callable[[Mapping[str, MaintenanceMarker]], bool], timeout: float
    ) -> Mapping[str, MaintenanceMarker]:
        """Wait until ``predicate(markers)`` holds; returns the markers then.

        Raises:
            TimeoutError: it did not hold within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self._markers))
            return self._markers

    # -- callbacks (on the loop) ------------------------------------------------------

    def _on_session_event(self, event: SessionEvent) -> None:
        if event.state is SessionState.CONNECTED:
            # After an expiry our watches are gone; after a disconnect a change may
            # have been missed. Markers are few: read them all again.
            self._full = True
            self._wake.set()

    def _on_directory_event(self, event: WatchEvent) -> None:
        # A marker set or cleared (child), or the directory created or deleted.
        self._children_dirty = True
        self._wake.set()

    def _on_marker_event(self, event: WatchEvent) -> None:
        if event.kind in ("changed", "deleted", "created"):
            self._dirty.add(event.path.rsplit("/", 1)[-1])
            self._wake.set()

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("maintenance watcher of %s crashed", self.path, exc_info=task.exception())

    # -- refreshing ---------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._session.connected:
                continue  # the CONNECTED event wakes us with a full re-read
            try:
                await self._refresh_once()
            except ZkError as exc:
                log.warning(
                    "reading the maintenance markers in %s failed, retrying: %s", self.path, exc
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_RETRY_INTERVAL):
                        await self._wake.wait()
                self._wake.set()

    async def _refresh_once(self) -> None:
        full, relist, dirty = self._full, self._children_dirty or self._full, self._dirty
        self._full, self._children_dirty, self._dirty = False, False, set()
        try:
            await self._refresh(full, relist, dirty)
        except BaseException:
            self._full = True  # nothing of this round was applied: all of it next time
            raise

    async def _refresh(self, full: bool, relist: bool, dirty: set[str]) -> None:
        children = set(await self._list()) if relist else set(self._children)
        # Everything after a reconnect; else what is new, and what a data watch named.
        to_read = children if full else (children - self._children) | (dirty & children)
        reads = await asyncio.gather(*(self._read(child) for child in sorted(to_read)))
        old = self._markers
        changed: set[str] = set()
        with old.mutate() as markers:
            for child in set(old) - children:
                del markers[child]
                self._counted.pop(child, None)
                changed.add(child)
            for child, read in zip(sorted(to_read), reads, strict=True):
                if read is None:  # cleared since listed: its watch has fired or will
                    children.discard(child)
                    if child in markers:
                        del markers[child]
                        changed.add(child)
                    self._counted.pop(child, None)
                    continue
                marker, stat = read
                if not marker.readable and self._counted.get(child) != stat.mzxid:
                    self._counted[child] = stat.mzxid
                    # The problem's first word is a fixed token: bad_name, too_large,
                    # malformed (never text from the marker).
                    token = (marker.problem or "").split(":", 1)[0]
                    self._metrics.unreadable_total.labels(reason=token).inc()
                    log.warning(
                        "maintenance marker %s/%s is unreadable (%s); %s stays in "
                        "maintenance until the marker is cleared or set again",
                        self.path,
                        child,
                        marker.problem,
                        child,
                    )
                if markers.get(child) != marker:
                    markers[child] = marker
                    changed.add(child)
            view = markers.finish()
        self._children = children
        if full:
            self._metrics.resyncs.inc()
        self._metrics.markers.set(len(view))
        self._metrics.unreadable.set(sum(1 for m in view.values() if not m.readable))
        if not changed:
            return
        self._markers = view
        self._generation += 1
        for instance_id in sorted(changed):
            now = view.get(instance_id)
            if now is None:
                log.info("maintenance cleared for %s", instance_id)
            else:
                log.info("maintenance set for %s: %s (by %s)", instance_id, now.reason, now.by)
        if self._on_change is not None:
            self._on_change(frozenset(changed))
        async with self._changed:
            self._changed.notify_all()

    async def _list(self) -> list[str]:
        """The markers' names, leaving a child watch; none (and an existence watch) while
        the directory does not exist: it is created by the first ``maint set``."""
        while True:
            try:
                return await self._session.get_children(self.path, watch=self._on_directory_event)
            except ZkNoNodeError:
                pass
            if await self._session.exists(self.path, watch=self._on_directory_event) is None:
                return []
            # Created between the two calls: list it.

    async def _read(self, child: str) -> tuple[MaintenanceMarker, NodeStat] | None:
        try:
            data, stat = await self._session.get(
                f"{self.path}/{child}", watch=self._on_marker_event
            )
        except ZkNoNodeError:
            return None
        return MaintenanceMarker.parse(child, data), stat

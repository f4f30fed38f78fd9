"""Persistent recursive watches (ZooKeeper 3.6+ ``addWatch``) for kazoo, which lacks them.

A watch reports every node created, changed or deleted under a path, with its path:
:class:`PersistentRecursiveWatch` on one kazoo client (on kazoo's callback thread),
:class:`SessionRecursiveWatch` on a :class:`~discovery.zk.session.ZkSession` (on the
loop, across its client replacements). After every reconnection the callback gets
``resync`` (events may have been missed: re-read); ``failed`` if it cannot be re-added.

Design: docs/design/zookeeper.md, "The persistent watch and kazoo".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import Exists, GetData, Watch
from kazoo.protocol.states import Callback, EventType, KazooState, WatchedEvent

from discovery.errors import ZkConnectionError, ZkError, ZkUnsupportedError
from discovery.zk import _kazoo
from discovery.zk.session import (
    SessionEvent,
    SessionState,
    WatchEvent,
    ZkSession,
    translate_kazoo_error,
)

__all__ = [
    "ADD_WATCH_PERSISTENT",
    "ADD_WATCH_PERSISTENT_RECURSIVE",
    "CHANGED",
    "CREATED",
    "DELETED",
    "FAILED",
    "RESYNC",
    "WATCHER_TYPE_ANY",
    "AddWatch",
    "PersistentRecursiveWatch",
    "RemoveWatches",
    "SessionRecursiveWatch",
    "ZkUnsupportedError",
]

log = logging.getLogger(__name__)

#: ``addWatch`` modes (``org.apache.zookeeper.AddWatchMode``).
ADD_WATCH_PERSISTENT: Final = 0
ADD_WATCH_PERSISTENT_RECURSIVE: Final = 1
#: ``removeWatches`` watcher type that ZooKeeper 3.6-3.8 accept for persistent watches
#: (``Any``: every watch this connection holds on the path; the types ``Persistent`` (4)
#: and ``PersistentRecursive`` (5) are refused with MARSHALLINGERROR before 3.9).
WATCHER_TYPE_ANY: Final = 3

#: The kinds a callback receives, with the (unchrooted) path.
CREATED: Final = "created"
DELETED: Final = "deleted"
CHANGED: Final = "changed"
#: Events may have been missed (reconnection, new session, watch replaced): re-read.
RESYNC: Final = "resync"
#: The watch is gone for good (the server refused ``addWatch``); it delivers no more.
FAILED: Final = "failed"

_OP_ADD_WATCH = 106
_OP_REMOVE_WATCHES = 18
_KINDS = {1: CREATED, 2: DELETED, 3: CHANGED}  # wire event types; 4 (children) is not ours
_INT = struct.Struct("!i")
_NO_NODE = kz.NoNodeError.code


def _string(value: str) -> bytes:
    encoded = value.encode("utf-8")
    return _INT.pack(len(encoded)) + encoded


@dataclass(frozen=True)
class AddWatch:
    """The ``addWatch`` request (opcode 106), in kazoo's request protocol.

    kazoo sends any object with ``type`` and ``serialize()`` through ``client._call``
    and completes the async result with ``deserialize(buffer, offset)``; the answer
    has no body. ``path`` is the server-side (chrooted) path. The class has no
    ``watcher`` attribute on purpose: kazoo would register it as a one-shot watcher.
    """

    path: str
    mode: int = ADD_WATCH_PERSISTENT_RECURSIVE
    type: ClassVar[int] = _OP_ADD_WATCH

    def serialize(self) -> bytes:
        return _string(self.path) + _INT.pack(self.mode)

    @classmethod
    def deserialize(cls, buffer: bytes, offset: int) -> None:
        return None


@dataclass(frozen=True)
class RemoveWatches:
    """The ``removeWatches`` request (opcode 18): path and watcher type; no body back.

    Answered NOWATCHER (kazoo's ``NoWatcherError``) when the connection holds none.
    """

    path: str
    watcher_type: int = WATCHER_TYPE_ANY
    type: ClassVar[int] = _OP_REMOVE_WATCHES

    def serialize(self) -> bytes:
        return _string(self.path) + _INT.pack(self.watcher_type)

    @classmethod
    def deserialize(cls, buffer: bytes, offset: int) -> None:
        return None


@dataclass(frozen=True)
class _OwnedAddWatch(AddWatch):
    """An ``addWatch`` sent by a watch; the hook tells it when the answer arrives."""

    owner: PersistentRecursiveWatch | None = field(default=None, compare=False)
    resync: bool = field(default=False, compare=False)


class _Hook:
    """What one kazoo client's connection runs for our watches (one per client).

    Installed on the client's connection by :func:`discovery.zk._kazoo.shadow_readers`
    (kazoo's internals stay there); both readers run on the connection thread and call
    kazoo's own first. ``_roots`` (chrooted path -> prefix and watches) is
    replaced, never mutated, so the connection thread reads it without a lock.
    """

    _hooks: ClassVar[weakref.WeakKeyDictionary[Any, _Hook]] = weakref.WeakKeyDictionary()
    _hooks_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, client: KazooClient) -> None:
        self._client = client
        self._connection = _kazoo.connection(client)
        self._roots: dict[str, tuple[str, tuple[PersistentRecursiveWatch, ...]]] = {}
        self._original_event: Callable[[bytes, int], None] | None = None
        self._original_response: Callable[[Any, bytes, int], Any] | None = None
        self._installed = False

    @classmethod
    def add(cls, client: KazooClient, watch: PersistentRecursiveWatch) -> _Hook:
        with cls._hooks_lock:
            hook = cls._hooks.get(client)
            if hook is None:
                hook = cls._hooks[client] = _Hook(client)
            hook._install()
            _, watches = hook._roots.get(watch.server_path, ("", ()))
            prefix = watch.server_path.rstrip("/") + "/"  # "/" for the root itself
            hook._roots = {**hook._roots, watch.server_path: (prefix, (*watches, watch))}
            return hook

    def remove(self, watch: PersistentRecursiveWatch) -> bool:
        """Forget ``watch``; True if another watch of this client still needs its path."""
        with self._hooks_lock:
            roots = dict(self._roots)
            prefix, watches = roots.pop(watch.server_path, ("", ()))
            rest = tuple(w for w in watches if w is not watch)
            if rest:
                roots[watch.server_path] = (prefix, rest)
            self._roots = roots
            if not roots:
                self._uninstall()
            return bool(rest)

    def _install(self) -> None:
        if self._installed:
            return
        self._original_event, self._original_response = _kazoo.shadow_readers(
            self._connection, self._read_watch_event, self._read_response
        )
        self._installed = True

    def _uninstall(self) -> None:
        # Only if nobody shadowed the readers after us; else we stay in their chain,
        # delivering nothing, and are not installed a second time.
        if self._installed and _kazoo.restore_readers(
            self._connection, self._read_watch_event, self._read_response
        ):
            self._installed = False

    # -- on kazoo's connection thread ---------------------------------------------

    def _read_watch_event(self, buffer: bytes, offset: int) -> None:
        assert self._original_event is not None
        self._original_event(buffer, offset)  # kazoo's one-shot watchers, as always
        roots = self._roots
        if not roots:
            return
        try:
            event, _ = Watch.deserialize(buffer, offset)
            kind = _KINDS.get(event.type)
            client = self._client
            if kind is None or _kazoo.is_stopped(client):
                return
            path: str = event.path
            for root, (prefix, watches) in roots.items():
                if path == root or path.startswith(prefix):
                    relative = client.unchroot(path)
                    for watch in watches:
                        watch.on_event(kind, relative)
        except Exception:
            log.exception("delivering a ZooKeeper watch event to persistent watches failed")

    def _read_response(self, header: Any, buffer: bytes, offset: int) -> Any:
        assert self._original_response is not None
        request = _kazoo.oldest_pending_request(self._client)
        result = self._original_response(header, buffer, offset)
        if request is not None and self._roots:
            try:
                self._after_response(request, header.err)
            except Exception:
                log.exception("checking a ZooKeeper answer for persistent watches failed")
        return result

    def _after_response(self, request: Any, err: int) -> None:
        if isinstance(request, _OwnedAddWatch):
            if err == 0 and request.owner is not None:
                self._orphaned_child_watchers(request.path)
                request.owner.on_added(request.resync)
            return
        if not isinstance(request, Exists | GetData) or getattr(request, "watcher", None) is None:
            return
        registered = err == 0 or (err == _NO_NODE and isinstance(request, Exists))
        entry = self._roots.get(request.path)
        if registered and entry is not None:
            # ZooKeeper < 3.9 keeps one mode per path: this one-shot watch replaced ours.
            for watch in entry[1]:
                watch.on_replaced("a one-shot watch set on the watched path replaced it")

    def _orphaned_child_watchers(self, path: str) -> None:
        client = self._client
        watchers = _kazoo.pop_child_watchers(client, path)
        if not watchers:
            return
        log.info(
            "ZooKeeper: addWatch on %s replaces %d one-shot child watch(es) of the same "
            "client (ZooKeeper < 3.9); firing them now so their owners re-list",
            path,
            len(watchers),
        )
        event = WatchedEvent(EventType.CHILD, _kazoo.client_state(client), client.unchroot(path))
        for watcher in watchers:
            client.handler.dispatch_callback(Callback("watch", watcher, (event,)))


_NEW, _STARTING, _ACTIVE, _FAILED, _STOPPED = "new", "starting", "active", "failed", "stopped"
# Events are delivered while starting too: the first may be read before start() returns.
_DELIVERING = frozenset({_STARTING, _ACTIVE})


class PersistentRecursiveWatch:
    """A persistent recursive watch on ``path`` and its whole subtree, on one kazoo client.

    ``callback(kind, path)`` runs on kazoo's callback thread, the thread of every kazoo
    watch function, in the order ZooKeeper sent the events: ``kind`` is
    :data:`CREATED`, :data:`DELETED` or :data:`CHANGED` for ``path`` (relative to the
    client's chroot) or a descendant, :data:`RESYNC` (``path`` is the watched path)
    after events may have been missed, and :data:`FAILED` once if the watch could not
    be re-established. The callback must not block (it delays every other kazoo
    watch); a caller on asyncio hands the event over with ``call_soon_threadsafe``.
    Exceptions it raises are logged.

    The watched node need not exist (its creation is reported). The watch survives
    reconnections and session expiries of the client, re-adding itself on every
    CONNECTED (then :data:`RESYNC`), until :meth:`stop`. See docs/design/zookeeper.md,
    "The persistent watch and kazoo", for why and for the one-shot watches it
    interacts with.
    """

    def __init__(
        self, client: KazooClient, path: str, callback: Callable[[str, str], None]
    ) -> None:
        if not path.startswith("/"):
            raise ValueError(f"the watched path must be absolute, got {path!r}")
        self._client = client
        self._path = path
        self._server_path: str = _kazoo.prefix_root(client.chroot or "", path)
        self._callback = callback
        self._lock = threading.Lock()
        self._state = _NEW
        self._connections = 0  # CONNECTED events seen since start()
        self._hook: _Hook | None = None
        self._resyncs = 0
        self._events = 0

    @property
    def client(self) -> KazooClient:
        return self._client

    @property
    def path(self) -> str:
        """The watched path, as given (relative to the client's chroot)."""
        return self._path

    @property
    def server_path(self) -> str:
        """The watched path as the server knows it (with the chroot)."""
        return self._server_path

    @property
    def active(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop` (or a failure)."""
        return self._state == _ACTIVE

    @property
    def resyncs(self) -> int:
        """How many :data:`RESYNC` events were delivered."""
        return self._resyncs

    @property
    def events(self) -> int:
        """How many created/deleted/changed events were delivered."""
        return self._events

    def start(self, timeout: float = 10.0) -> None:
        """Add the watch on the server; blocks, so never call it on kazoo's threads.

        Waits for the client to be connected and retries through connection losses
        until ``timeout`` seconds have passed.

        Raises:
            ZkUnsupportedError: the server does not implement ``addWatch`` (< 3.6).
            ZkConnectionError: not established within ``timeout``.
            ZkError: any other refusal (translated from kazoo).
            RuntimeError: started before.
        """
        with self._lock:
            if self._state != _NEW:
                raise RuntimeError(f"persistent watch on {self._path} is {self._state}")
            self._state = _STARTING
        client = self._client
        self._hook = _Hook.add(client, self)
        client.add_listener(self._on_state)
        deadline = time.monotonic() + timeout
        losses = 0
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not _kazoo.wait_live(client, remaining):
                    hint = (
                        f"; the connection was lost {losses} time(s) in answer to addWatch "
                        "(a ZooKeeper before 3.6 closes it)"
                        if losses
                        else ""
                    )
                    raise ZkConnectionError(
                        f"persistent watch on {self._path} not established within "
                        f"{timeout:g}s{hint}"
                    )
                with self._lock:
                    connections = self._connections
                result = client.handler.async_result()
                _kazoo.submit(client, _OwnedAddWatch(self._server_path, owner=self), result)
                try:
                    result.get(timeout=max(0.0, deadline - time.monotonic()))
                except (kz.ConnectionLoss, kz.SessionExpiredError) as exc:
                    if isinstance(exc, kz.ConnectionClosedError):
                        raise translate_kazoo_error(exc) from exc
                    losses += 1
                    continue
                except KazooTimeoutError:
                    continue  # the deadline check above raises
                break
        except kz.UnimplementedError as exc:
            self._abandon()
            raise ZkUnsupportedError(
                f"ZooKeeper at {client.hosts} does not implement addWatch (persistent "
                "watches need ZooKeeper 3.6 or later)"
            ) from exc
        except kz.KazooException as exc:
            self._abandon()
            raise translate_kazoo_error(exc) from exc
        except BaseException:
            self._abandon()
            raise
        with self._lock:
            self._state = _ACTIVE
            reconnected = self._connections != connections
        log.debug("persistent recursive watch on %s added", self._server_path)
        if reconnected:
            # The connection went and came back after our addWatch: the server forgot it.
            self._readd("the connection was re-established while starting")

    def stop(self, timeout: float = 5.0, *, remove: bool = True) -> None:
        """Stop delivering and remove the watch from the server; idempotent, blocking.

        Events already queued on kazoo's callback thread are dropped. The server-side
        watch is removed (``removeWatches``, type *any*, waiting up to ``timeout``)
        unless ``remove`` is false, another watch of this client needs the same path,
        or kazoo holds one-shot watches on it that the removal would cancel too; then
        the server's watch stays until the connection ends, and its events are
        ignored. Failures of the removal are logged, never raised.
        """
        with self._lock:
            previous, self._state = self._state, _STOPPED
        if previous in (_NEW, _STOPPED):
            return
        client = self._client
        client.remove_listener(self._on_state)
        shared = self._hook.remove(self) if self._hook is not None else False
        if not remove or previous != _ACTIVE or shared or not client.connected:
            return
        if self._kazoo_watches_path():
            log.info(
                "not removing the persistent watch on %s from the server: kazoo holds "
                "one-shot watches on that path, which the removal would cancel",
                self._server_path,
            )
            return
        result = client.handler.async_result()
        _kazoo.submit(client, RemoveWatches(self._server_path), result)
        try:
            result.get(timeout=timeout)
        except (kz.NoWatcherError, kz.ConnectionLoss, kz.SessionExpiredError):
            pass  # gone with the connection already
        except (kz.KazooException, KazooTimeoutError) as exc:
            log.warning("removing the persistent watch on %s: %r", self._server_path, exc)

    def __enter__(self) -> PersistentRecursiveWatch:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<PersistentRecursiveWatch {self._server_path} {self._state}>"

    # -- internals ------------------------------------------------------------------

    def _abandon(self) -> None:
        with self._lock:
            self._state = _FAILED
        self._client.remove_listener(self._on_state)
        if self._hook is not None:
            self._hook.remove(self)

    def _kazoo_watches_path(self) -> bool:
        client = self._client
        path = self._server_path
        if _kazoo.has_one_shot_watch(client, path):
            return True
        in_flight = _kazoo.in_flight_requests(client)
        return any(
            getattr(r, "path", None) == path and getattr(r, "watcher", None) for r in in_flight
        )

    def _on_state(self, state: str) -> None:
        """kazoo state listener (connection thread): re-add after every CONNECTED."""
        if state != KazooState.CONNECTED:
            return
        with self._lock:
            self._connections += 1
            active = self._state == _ACTIVE
        if active:
            # No ZooKeeper request from inside kazoo's connection listener: the re-add
            # is handed to kazoo's callback thread, which queues it (never waiting).
            self._client.handler.dispatch_callback(Callback("watch", self._readd, ("reconnected",)))

    def _readd(self, why: str) -> None:
        """Send ``addWatch`` again (any thread; never blocks); RESYNC follows success."""
        if self._state != _ACTIVE:
            return
        log.info("re-adding the persistent watch on %s: %s", self._server_path, why)
        result = self._client.handler.async_result()
        result.rawlink(self._readd_done)
        _kazoo.submit(
            self._client, _OwnedAddWatch(self._server_path, owner=self, resync=True), result
        )

    def _readd_done(self, result: Any) -> None:
        """Completion thread: only failures matter here (success is seen by the hook)."""
        try:
            result.get_nowait()
        except (kz.ConnectionLoss, kz.SessionExpiredError):
            return  # the next CONNECTED re-adds it
        except Exception as exc:
            with self._lock:
                if self._state != _ACTIVE:
                    return
                self._state = _FAILED
            self._client.remove_listener(self._on_state)
            if self._hook is not None:
                self._hook.remove(self)
            log.error(
                "the persistent watch on %s could not be re-added and is gone: %r",
                self._server_path,
                exc,
            )
            self._client.handler.dispatch_callback(
                Callback("watch", self._deliver_final, (FAILED,))
            )

    # -- told by the client's hook (_Hook), on kazoo's connection thread --------------

    def on_added(self, resync: bool) -> None:
        """The server answered our ``addWatch`` with success: RESYNC follows if asked."""
        if resync:
            self._client.handler.dispatch_callback(
                Callback("watch", self._deliver_final, (RESYNC,))
            )

    def on_event(self, kind: str, path: str) -> None:
        """An event on the watched subtree: delivered on kazoo's callback thread."""
        self._client.handler.dispatch_callback(Callback("watch", self._deliver, (kind, path)))

    def on_replaced(self, why: str) -> None:
        """A one-shot watch on the watched path replaced ours (ZooKeeper < 3.9): re-add."""
        self._readd(why)

    # -- on kazoo's callback thread ---------------------------------------------------

    def _deliver(self, kind: str, path: str) -> None:
        if self._state not in _DELIVERING:
            return
        self._events += 1
        self._call(kind, path)

    def _deliver_final(self, kind: str) -> None:
        if kind == RESYNC:
            if self._state != _ACTIVE:
                return
            self._resyncs += 1
        elif self._state != _FAILED:
            return
        self._call(kind, self._path)

    def _call(self, kind: str, path: str) -> None:
        try:
            self._callback(kind, path)
        except Exception:
            log.exception("persistent watch callback on %s failed (%s %s)", self._path, kind, path)


class SessionRecursiveWatch:
    """A persistent recursive watch on ``path`` of a :class:`~discovery.zk.session.ZkSession`.

    ``callback(event)`` runs on the event loop with a :class:`~discovery.zk.session.WatchEvent`
    whose ``kind`` is ``created``, ``deleted``, ``changed`` (``path`` relative to the
    session's chroot), ``resync`` (re-read: events may have been missed) or ``failed``
    (the watch is gone; fall back to re-listing). It must not block.

    The session may replace its kazoo client (watchdog, :meth:`ZkSession.restart`):
    at the CONNECTED event of a replacement the watch moves to the new client and
    reports ``resync`` once it is established there. A move that fails for lack of a
    connection is tried again at the next CONNECTED; one refused as unsupported
    reports ``failed``, and the watch delivers nothing more.
    """

    def __init__(
        self,
        session: ZkSession,
        path: str,
        callback: Callable[[WatchEvent], None],
        *,
        start_timeout: float = 10.0,
    ) -> None:
        self._session = session
        self._path = path
        self._callback = callback
        self._start_timeout = start_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: PersistentRecursiveWatch | None = None
        self._moving: asyncio.Task[None] | None = None
        self._closed = False
        self._failed = False

    @property
    def path(self) -> str:
        return self._path

    @property
    def active(self) -> bool:
        """True while the watch is established on the session's current client."""
        watch = self._watch
        return watch is not None and watch.active and watch.client is self._session.client

    async def start(self) -> None:
        """Establish the watch on the session's current client.

        Raises:
            ZkUnsupportedError: the server does not implement ``addWatch``.
            ZkError: not established (see :meth:`PersistentRecursiveWatch.start`).
        """
        self._loop = asyncio.get_running_loop()
        await self._bind(self._session.client, resync=False)
        self._session.add_listener(self._on_session_event)
        # The session may have replaced its client while we were binding.
        self._on_session_event(SessionEvent(self._session.state, self._session.session_id))

    async def aclose(self) -> None:
        """Stop the watch (removing it from the server); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._session.remove_listener(self._on_session_event)
        if self._moving is not None:
            self._moving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._moving
        watch, self._watch = self._watch, None
        if watch is not None:
            await asyncio.to_thread(watch.stop, 5.0, remove=watch.client is self._session.client)

    async def __aenter__(self) -> SessionRecursiveWatch:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _bind(self, client: KazooClient, *, resync: bool) -> None:
        watch = PersistentRecursiveWatch(
            client, self._path, lambda kind, path: self._from_thread(client, kind, path)
        )
        try:
            await asyncio.to_thread(watch.start, self._start_timeout)
        except asyncio.CancelledError:
            await asyncio.to_thread(watch.stop, remove=False)
            raise
        if self._closed:
            await asyncio.to_thread(watch.stop)
            return
        old, self._watch = self._watch, watch
        if old is not None:
            # The old client is being retired by the session: forget its watch locally.
            await asyncio.to_thread(old.stop, remove=False)
        if resync:
            self._notify(RESYNC, self._path)

    def _from_thread(self, client: KazooClient, kind: str, path: str) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
            loop.call_soon_threadsafe(self._deliver, client, kind, path)

    def _deliver(self, client: KazooClient, kind: str, path: str) -> None:
        watch = self._watch
        if watch is None or watch.client is not client:
            return  # from a client the session has replaced
        self._notify(kind, path)

    def _notify(self, kind: str, path: str) -> None:
        if self._closed or self._failed:
            return
        if kind == FAILED:
            self._failed = True
        try:
            self._callback(WatchEvent(kind, path))
        except Exception:
            log.exception("watch callback on %s failed (%s %s)", self._path, kind, path)

    def _on_session_event(self, event: SessionEvent) -> None:
        if event.state is not SessionState.CONNECTED or self._closed or self._failed:
            return
        watch = self._watch
        if watch is not None and watch.client is self._session.client:
            return  # the watch re-adds itself on its own client
        if self._moving is None or self._moving.done():
            self._moving = asyncio.create_task(self._move(), name=f"zkwatch-move:{self._path}")

    async def _move(self) -> None:
        try:
            await self._bind(self._session.client, resync=True)
        except ZkUnsupportedError as exc:
            log.error("persistent watch on %s: %s", self._path, exc)
            self._notify(FAILED, self._path)
        except ZkError as exc:
            log.warning(
                "moving the persistent watch on %s to a new ZooKeeper client failed, "
                "retrying at the next connection: %s",
                self._path,
                exc,
            )

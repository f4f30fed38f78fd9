"""kazoo's asynchronous results and watches, brought onto the event loop.

Both come over by ``call_soon_threadsafe``: the loop never blocks on kazoo.

Design: docs/design/zookeeper.md, "The session: kazoo's threads and the loop".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo import exceptions as kz
from kazoo.protocol.states import EventType, WatchedEvent

from discovery.errors import ZkAuthError, ZkConnectionError, ZkError
from discovery.metrics import SessionMetrics
from discovery.zk.connection import ZkConnection
from discovery.zk.identity import AclIdentity
from discovery.zk.translate import translate_kazoo_error

__all__ = ["KazooBridge", "WatchEvent"]

log = logging.getLogger(__name__)

_EVENT_KINDS = {
    EventType.CREATED: "created",
    EventType.DELETED: "deleted",
    EventType.CHANGED: "changed",
    EventType.CHILD: "child",
}

# Writes a session answers with a reply kazoo cannot read belong to a broken session.
_WRITES = frozenset({"create_async", "set_async", "delete_async"})


@dataclass(frozen=True)
class WatchEvent:
    """A fired ZooKeeper watch, delivered on the event loop.

    ``kind`` is one of ``created``, ``deleted``, ``changed``, ``child`` or ``none``
    (a session event kazoo passes to watchers); a persistent recursive watch
    (:mod:`discovery.zk.watch`) also reports ``resync`` (events may have been missed:
    re-read) and ``failed`` (the watch is gone).
    """

    kind: str
    path: str


class _KazooInternalError(Exception):
    """An operation's result could not be read: an error in kazoo, not from ZooKeeper."""


class _LoopWatch:
    """A kazoo watcher that runs an asyncio-side callback on the loop.

    Equal when it wraps the same callback, because kazoo keeps watchers in a set per
    path: re-arming a watch that has not fired yet must not add a second watcher.
    """

    __slots__ = ("_callback", "_post")

    def __init__(
        self,
        callback: Callable[[WatchEvent], None],
        post: Callable[..., None],
    ) -> None:
        self._callback = callback
        self._post = post

    def __call__(self, event: WatchedEvent) -> None:
        kind = _EVENT_KINDS.get(event.type, "none")
        self._post(self._callback, WatchEvent(kind, event.path or ""))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _LoopWatch) and other._callback == self._callback

    def __hash__(self) -> int:
        return hash(self._callback)


class KazooBridge:
    """Runs kazoo's asynchronous calls and watches for the loop, on ``connection``.

    Every call raises a :class:`~discovery.errors.ZkError` on failure, counted in
    ``metrics`` by error class; one waiting longer than ``operation_timeout`` raises
    :class:`~discovery.errors.ZkConnectionError`. A SESSIONEXPIRED answer, or a write
    answered with a reply kazoo cannot read, is reported to the connection, which
    replaces the client.
    """

    def __init__(
        self,
        connection: ZkConnection,
        *,
        identity: AclIdentity,
        metrics: SessionMetrics,
        operation_timeout: float,
    ) -> None:
        self._connection = connection
        self._identity = identity
        self._metrics = metrics
        self._operation_timeout = operation_timeout

    def watcher(
        self, watch: Callable[[WatchEvent], None] | None
    ) -> Callable[[WatchedEvent], None] | None:
        """The kazoo watcher that runs ``watch`` on the loop (None for None)."""
        return None if watch is None else _LoopWatch(watch, self._connection.post)

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a kazoo ``*_async`` method and await its result on the loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        post = self._connection.post

        def settle(value: Any, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        def on_done(result: Any) -> None:
            # kazoo's callback thread.
            try:
                value = result.get_nowait()
            except kz.KazooException as exc:
                post(settle, None, exc)
            except Exception as exc:
                # kazoo's own completion code failed (seen: a create answered while the
                # connection was being replaced, whose path kazoo could not un-chroot).
                # Whatever it was, the operation did not complete: callers retry a
                # ZkError, while anything else would kill the recipe that awaits it.
                log.warning(
                    "ZooKeeper %s: kazoo failed in %s: %r", self._connection.hosts, method, exc
                )
                post(settle, None, _KazooInternalError(repr(exc)))
            else:
                post(settle, value, None)

        try:
            method(*args, **kwargs).rawlink(on_done)
            async with asyncio.timeout(self._operation_timeout):
                return await future
        except TimeoutError:
            self._metrics.operation_errors.labels(error="timeout").inc()
            raise ZkConnectionError(
                f"ZooKeeper operation {method.__name__}{args[:1]} timed out after "
                f"{self._operation_timeout:g}s (state {self._connection.state.value})"
            ) from None
        except _KazooInternalError as exc:
            self._metrics.operation_errors.labels(error="ZkError").inc()
            if method.__name__ in _WRITES:
                self._connection.report_expired(
                    getattr(method, "__self__", None), "answers writes with nonsense"
                )
            raise ZkError(
                f"ZooKeeper operation {method.__name__}{args[:1]} failed inside kazoo: {exc}"
            ) from None
        except kz.KazooException as exc:
            error = translate_kazoo_error(exc)
            if isinstance(exc, kz.SessionExpiredError) and not isinstance(
                exc, kz.ConnectionClosedError
            ):
                # A bound kazoo method; a transaction's commit is bound to the transaction.
                owner = getattr(method, "__self__", None)
                self._connection.report_expired(getattr(owner, "client", owner))
            if isinstance(error, ZkAuthError) and args:
                error = ZkAuthError(self._identity.refusal(method.__name__, args[0], error))
            self._metrics.operation_errors.labels(error=type(error).__name__).inc()
            raise error from exc

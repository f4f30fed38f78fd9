"""Closing a ZooKeeper session from outside it: the one a connection gave up on.

Design: docs/design/zookeeper.md, "The session watchdog: a session can never hang".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from discovery.errors import ZkError
from discovery.metrics import SessionMetrics
from discovery.zk.kazoolog import mask_kazoo_secrets
from discovery.zk.tls import KazooTls, client_options

__all__ = ["AbandonedSessions", "close_session"]

log = logging.getLogger(__name__)


def close_session(
    hosts: str,
    session_id: int,
    password: bytes,
    timeout: float,
    *,
    tls: KazooTls | None = None,
) -> None:
    """Attach to session ``session_id`` on ``hosts`` and close it. Blocking: run it in a
    thread (``asyncio.to_thread``), never on the event loop.

    ``hosts`` may name a chroot; it is ignored, since closing needs none. ``tls``: the
    TLS settings of the session's own client (an ensemble that speaks only TLS
    would refuse a plaintext one).

    Raises:
        ZkError: the session could not be attached to (unreachable, or already gone).
    """
    # No chroot: kazoo would check it with a read, a round trip during which the victim
    # can reconnect and take its session back.
    servers = hosts.split("/", 1)[0]
    mask_kazoo_secrets()  # its connect packet carries the session's password
    intruder = KazooClient(
        hosts=servers,
        client_id=(session_id, password),
        timeout=timeout,
        **client_options(tls),
    )
    try:
        try:
            intruder.start(timeout=timeout)
        except (kz.KazooException, KazooTimeoutError) as exc:
            raise ZkError(f"could not attach to session 0x{session_id:x}: {exc!r}") from exc
        if intruder.client_id is None or intruder.client_id[0] != session_id:
            raise ZkError(f"could not attach to session 0x{session_id:x} (already expired?)")
    finally:
        # stop() sends closeSession for the shared session: the server expires it.
        intruder.stop()
        intruder.close()


class AbandonedSessions:
    """The session a connection gave up on, closed once a new one is connected.

    Loop-side only. One close at a time, in a task; a close that fails (the session
    expired meanwhile, or ZooKeeper is unreachable again) is logged and counted, never
    retried: the session then ends by itself. After :meth:`aclose` nothing is closed.
    ``hosts`` and ``tls`` give the connection's servers and TLS settings at the time.
    """

    def __init__(
        self,
        *,
        hosts: Callable[[], str],
        timeout: float,
        metrics: SessionMetrics,
        tls: Callable[[], KazooTls | None],
    ) -> None:
        self._hosts = hosts
        self._tls = tls
        self._timeout = timeout
        self._metrics = metrics
        # The connected session's id and password: kazoo tells them only while live.
        self._credentials: tuple[int, bytes] | None = None
        # The session given up on, to be closed once a new one is connected.
        self._abandoned: tuple[int, bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        # The session connected now, if any: the next abandoned one waits for it.
        self._live: int | None = None
        self._connected = False
        self._closed = False

    def connected(self, client_id: tuple[int, bytes] | None, session_id: int | None) -> None:
        """Session ``session_id`` is connected (``client_id``: the client's id and
        password): remember them, and close the abandoned session if there is one."""
        self._connected, self._live = True, session_id
        if client_id is not None and client_id[0] == session_id:
            self._credentials = client_id
        self._close_abandoned(session_id)

    def disconnected(self) -> None:
        """The connection is down (or closed): no closing until the next :meth:`connected`."""
        self._connected = False

    def abandon(self) -> None:
        """The connection gives up its session (declared lost by us, not necessarily by
        the ensemble): close it once a new session is connected."""
        if self._credentials is not None:
            # After a quorum outage the ensemble keeps it, and its ephemeral nodes (an
            # election node, a registration), for a whole session timeout.
            self._abandoned, self._credentials = self._credentials, None

    async def aclose(self) -> None:
        """Cancel a close under way; close nothing from now on."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _close_abandoned(self, current: int | None) -> None:
        # The new session is connected, so the ensemble has a quorum: the abandoned
        # one's ephemeral nodes go at once, and the next leader need not wait for them.
        abandoned = self._abandoned
        if abandoned is None or abandoned[0] == current or self._closed:
            return
        if self._task is not None and not self._task.done():
            return  # one at a time: the next is taken when this one is done
        self._abandoned = None
        task = asyncio.create_task(
            self._close(*abandoned), name=f"zk-close-abandoned:{self._hosts()}"
        )
        task.add_done_callback(self._on_closed)
        self._task = task

    def _on_closed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("closing an abandoned ZooKeeper session failed", exc_info=task.exception())
        if self._connected:
            self._close_abandoned(self._live)

    async def _close(self, session_id: int, password: bytes) -> None:
        hosts = self._hosts()
        try:
            await asyncio.to_thread(
                close_session, hosts, session_id, password, self._timeout, tls=self._tls()
            )
        except ZkError as exc:
            # Expired meanwhile, or unreachable again: either way it ends by itself.
            self._metrics.abandoned_closes.labels(result="failed").inc()
            log.info("ZooKeeper %s: session 0x%x not closed: %s", hosts, session_id, exc)
        else:
            self._metrics.abandoned_closes.labels(result="closed").inc()
            log.info(
                "ZooKeeper %s: closed session 0x%x, which we had declared lost; its "
                "ephemeral nodes are gone",
                hosts,
                session_id,
            )

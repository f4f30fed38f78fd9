"""A ZooKeeper connection's lifecycle, its state on the loop, and its watchdog.

A session whose connection has not come back ``lost_after`` seconds after a disconnect
is declared LOST on the client side, and the kazoo client replaced by a fresh one.

Design: docs/design/zookeeper.md, "The session watchdog: a session can never hang".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from discovery.errors import ZkConnectionError
from discovery.metrics import SessionMetrics
from discovery.zk.abandon import AbandonedSessions
from discovery.zk.clients import KazooClients
from discovery.zk.states import SessionEvent, SessionEvents, SessionState
from discovery.zk.tls import check_handshake
from discovery.zk.translate import translate_kazoo_error
from discovery.zk.watchdog import Watchdog

__all__ = ["ZkConnection"]

log = logging.getLogger(__name__)


class ZkConnection:
    """One kazoo client (replaced as needed) and the state of its session, on the loop.

    kazoo reconnects on its own, and after an expiry it opens a new session, which
    subscribers of ``events`` see as a CONNECTED event with ``new_session=True``. This
    class opens a new session in a fresh client (from ``client_factory``) in two cases:
    on request (:meth:`restart`), and when the watchdog fires (LOST at once, then
    CONNECTED with ``new_session``). A session given up that way is closed from
    outside once a new one is connected (:class:`~discovery.zk.abandon.AbandonedSessions`).
    """

    def __init__(
        self,
        client: KazooClient,
        *,
        events: SessionEvents,
        metrics: SessionMetrics,
        lost_after: float,
        connect_timeout: float,
        client_factory: Callable[[], KazooClient] | None = None,
    ) -> None:
        self._clients = KazooClients(client, factory=client_factory, report=self._report)
        self._events = events
        self._metrics = metrics
        self._lost_after = lost_after
        self._connect_timeout = connect_timeout
        self._abandoned = AbandonedSessions(
            hosts=lambda: self.hosts,
            timeout=lost_after,
            metrics=metrics,
            tls=lambda: self._clients.tls,
        )
        # Armed while disconnected, fired lost_after later.
        self._watchdog = Watchdog(
            lost_after,
            on_fire=self._on_watchdog,
            rebuild=self._rebuild,
            still_down=lambda: not self._closing and self._state is not SessionState.CONNECTED,
        )
        # Serialises restart() and aclose(): both stop the kazoo client.
        self._lifecycle = asyncio.Lock()
        self._restarting = False
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = SessionState.CONNECTING
        self._session_id: int | None = None
        self._last_session_id: int | None = None
        self._connected = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Connect, waiting up to ``connect_timeout``.

        With TLS, a handshake is tried first, one server after another until one
        completes (for up to half the timeout; :func:`~discovery.zk.tls.check_handshake`),
        so that a certificate that will never be accepted fails at once, not at the
        timeout.

        Raises:
            ZkConnectionError: no server answered in time (the client is stopped), or
                every server that answered refused the TLS handshake.
            ZkAuthError: the credentials were refused.
        """
        self._loop = asyncio.get_running_loop()
        deadline = self._loop.time() + self._connect_timeout
        await check_handshake(self._clients.current, self._connect_timeout / 2)
        self._clients.listen()
        over = " over TLS" if self._clients.tls is not None else ""
        try:
            await asyncio.to_thread(
                self._clients.current.start, max(deadline - self._loop.time(), 0.001)
            )
        except KazooTimeoutError:
            raise ZkConnectionError(
                f"no ZooKeeper server at {self.hosts!r} answered{over} within "
                f"{self._connect_timeout:g}s"
            ) from None
        except kz.KazooException as exc:
            raise translate_kazoo_error(exc) from exc
        # The listener's CONNECTED event may still be in the loop's queue.
        await self.wait_connected(self._connect_timeout)

    async def aclose(self) -> None:
        """Close the session (subscribers receive a final CLOSED). Idempotent."""
        if self._closing:
            return
        self._closing = True
        self._watchdog.disarm()
        await self._abandoned.aclose()
        await self._watchdog.aclose()
        async with self._lifecycle:
            await self._clients.aclose()
        self._set_state(SessionState.CLOSED, self._session_id)
        await self._clients.join_retired()

    async def restart(self) -> None:
        """End the current session and open a new one (in a fresh kazoo client).

        Ending a session is the one way to remove an ephemeral node without the right
        to delete it: ZooKeeper deletes the session's ephemeral nodes as it closes the
        session, with no ACL check (a delete needs DELETE on the *parent*, which a
        data server is not given). Everything else tied to the session goes too:
        watches fire with a session event, other ephemeral nodes vanish, so only a
        session with a single user (the data-server agent's) should be restarted.

        Subscribers see LOST, then CONNECTED with ``new_session``. Returns once the new
        session is connected.

        Raises:
            ZkConnectionError: the session is closed or closing, or no new session was
                established within ``connect_timeout``; the old session is ended all
                the same (if the close request got through, otherwise it expires), and
                the client keeps trying to connect in the background.
        """
        if self._closing or self._loop is None:
            raise ZkConnectionError("the ZooKeeper session is closed")
        events = self._events.subscribe()
        try:
            async with self._lifecycle:
                if self._closing:
                    raise ZkConnectionError("the ZooKeeper session is closed")
                old = self._session_id
                log.info("ZooKeeper %s: ending session 0x%x to start anew", self.hosts, old or 0)
                self._restarting = True
                try:
                    # stop() sends closeSession: the server removes our ephemeral nodes.
                    await self._clients.stop()
                    self._set_state(SessionState.LOST, self._session_id)
                finally:
                    self._restarting = False
                await self._replace_client("restart", stopped=True)
            async with asyncio.timeout(self._connect_timeout):
                async for event in events:
                    if event.state is SessionState.CONNECTED and event.new_session:
                        return
            raise ZkConnectionError("the ZooKeeper session was closed while restarting")
        except TimeoutError:
            raise ZkConnectionError(
                f"no new ZooKeeper session at {self.hosts!r} within {self._connect_timeout:g}s"
            ) from None
        finally:
            events.close()

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until the connection is up.

        Raises:
            ZkConnectionError: not connected within ``timeout`` seconds, or closed.
        """
        if self._state is SessionState.CLOSED:
            raise ZkConnectionError("the ZooKeeper session is closed")
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        except TimeoutError:
            raise ZkConnectionError(f"not connected to ZooKeeper after {timeout:g}s") from None

    # -- state -------------------------------------------------------------------

    @property
    def client(self) -> KazooClient:
        """The current kazoo client (replaced with each new session this class opens)."""
        return self._clients.current

    @property
    def hosts(self) -> str:
        """The connection string, with the chroot if any (``h1:p1,h2:p2/chroot``)."""
        return self._clients.hosts

    @property
    def lost_after(self) -> float:
        """Seconds after a disconnect at which the watchdog declares the session lost."""
        return self._lost_after

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def session_id(self) -> int | None:
        """The id of the current (or last) session, as in a znode's ``ephemeralOwner``."""
        return self._session_id

    def post(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop; from any thread. Dropped before
        :meth:`start` and once the loop is closed (nobody is left to tell)."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback, *args)

    def report_expired(
        self, client: KazooClient | None, why: str = "expired on the server"
    ) -> None:
        """ZooKeeper answered SESSIONEXPIRED to ``client``: the session is gone. On the
        loop only; ignored for a replaced client, and when not connected (kazoo reports
        the expiry itself then).

        A client can stay CONNECTED to a session the ensemble has closed: a
        reconnection racing the session's close is accepted by a server that then
        keeps answering its pings and reads (seen on every few dozen forced expiries
        next to a server restart). kazoo never leaves that state by itself, and no
        watch fires for the ephemeral nodes that went with the session. A write is
        refused with SESSIONEXPIRED, so that is where we learn it: the session is
        declared LOST and the client replaced, as the watchdog would. (A create
        on such a session has also been seen to "succeed" with no path, which kazoo
        cannot read: that counts the same, ``why`` says which.)
        """
        if client is not None and client is not self._clients.current:
            return  # an answer from a client already replaced
        if self._closing or self._state is not SessionState.CONNECTED:
            return
        if self._watchdog.rebuilding:
            return
        log.warning(
            "ZooKeeper %s: session 0x%x is connected but %s; replacing the client",
            self.hosts,
            self._session_id or 0,
            why,
        )
        self._metrics.watchdog_expiries.inc()
        self._set_state(SessionState.LOST, self._session_id)
        self._watchdog.disarm()
        self._watchdog.start_rebuild(f"zk-rebuild:{self.hosts}")

    # -- state changes -------------------------------------------------------------

    def _report(self, client: KazooClient, state: SessionState, session_id: int | None) -> None:
        # kazoo's connection thread: hand over, nothing else.
        self.post(self._on_client_state, client, state, session_id)

    def _on_client_state(
        self, client: KazooClient, state: SessionState, session_id: int | None
    ) -> None:
        # A replaced client may still report (its LOST as it stops, say): not ours.
        if client is self._clients.current:
            self._set_state(state, session_id)

    def _set_state(self, state: SessionState, session_id: int | None) -> None:
        if self._state is SessionState.CLOSED:
            return
        if state is SessionState.LOST and self._closing:
            # kazoo reports LOST when we stop it ourselves; that is CLOSED, sent by aclose.
            return
        new_session = state is SessionState.CONNECTED and session_id != self._last_session_id
        if state is SessionState.CONNECTED:
            self._last_session_id = session_id
            self._connected.set()
            self._watchdog.reset()
            self._abandoned.connected(self._clients.current.client_id, session_id)
        else:
            self._connected.clear()
            self._abandoned.disconnected()
            if state in (SessionState.SUSPENDED, SessionState.LOST) and not self._closing:
                self._watchdog.arm()
        if state is self._state and not new_session:
            return
        self._state = state
        if session_id is not None:
            self._session_id = session_id
        # A session we end ourselves is news, not trouble.
        quiet = state in (SessionState.CONNECTED, SessionState.CLOSED) or self._restarting
        level = logging.INFO if quiet else logging.WARNING
        log.log(
            level,
            "ZooKeeper %s: %s (session 0x%x%s)",
            self.hosts,
            state.value,
            self._session_id or 0,
            ", new" if new_session else "",
        )
        self._metrics.connected.set(1 if state is SessionState.CONNECTED else 0)
        self._metrics.state_changes.labels(state=state.value).inc()
        if new_session:
            self._metrics.sessions.inc()
        self._events.publish(SessionEvent(state, self._session_id, new_session))

    # -- the watchdog's side ------------------------------------------------------------

    def _on_watchdog(self) -> None:
        if self._closing or self._state is SessionState.CONNECTED:
            return
        if self._watchdog.rebuilding:
            return  # a restart or an earlier rebuild is under way
        if self._state is SessionState.SUSPENDED:
            log.warning(
                "ZooKeeper %s: no reconnection %.3gs after the disconnect; session 0x%x is "
                "presumed expired (client-side expiry)",
                self.hosts,
                self._lost_after,
                self._session_id or 0,
            )
            self._metrics.watchdog_expiries.inc()
            self._set_state(SessionState.LOST, self._session_id)
        else:
            log.warning(
                "ZooKeeper %s: no new session %.3gs after losing the last one; "
                "replacing the client",
                self.hosts,
                self._lost_after,
            )
        self._watchdog.start_rebuild(f"zk-rebuild:{self.hosts}")

    async def _rebuild(self) -> None:
        async with self._lifecycle:
            if self._closing or self._state is SessionState.CONNECTED:
                return
            await self._replace_client("watchdog", stopped=False)

    async def _replace_client(self, reason: str, *, stopped: bool) -> None:
        """Start a new session in a fresh kazoo client; ``_lifecycle`` held. ``stopped``:
        the old client has been stopped already (its session closed)."""
        self._metrics.client_rebuilds.labels(reason=reason).inc()
        if not stopped:
            self._abandoned.abandon()
        await self._clients.replace(stopped=stopped)

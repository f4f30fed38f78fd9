"""One ZooKeeper session, owned by one kazoo client, used from asyncio.

kazoo is threaded: its connection thread reports state changes to listeners and its
callback thread runs watch functions and completes asynchronous results. This module
is the bridge between those threads and the event loop for every ZooKeeper operation,
watch and state change (the other two bridges of the project are the election's
thread, :mod:`discovery.zk.election`, and the agent's own loop,
:mod:`discovery.agent.loopthread`):

* state changes are handed to the loop with ``loop.call_soon_threadsafe`` and fanned
  out to :meth:`ZkSession.subscribe` subscribers as :class:`SessionEvent` values; the
  listener itself does no ZooKeeper work (kazoo forbids it there);
* operations use kazoo's ``*_async`` methods, whose results are bridged to asyncio
  futures, so no blocking kazoo call ever runs on the loop;
* watch callbacks passed to operations run on the loop, never on kazoo's thread;
* kazoo exceptions are translated into the :mod:`discovery.errors` tree here.

Session semantics follow kazoo (and Curator): SUSPENDED means the connection dropped
but the session, its ephemeral nodes and watches may still be alive; LOST means the
session expired (or the client stopped), its ephemeral nodes are gone, and kazoo will
establish a new session by itself. A CONNECTED event whose ``new_session`` is true
tells recipes to re-create what they own.

kazoo has no client-side expiry: a client whose reconnection stalls (python-zk/kazoo
#577, #567; about one in 35 forced expiries in our chaos runs) stays SUSPENDED forever,
and a data server whose client hangs that way is never registered again. So a session
keeps a **watchdog**, after ZooKeeper's own client (ZOOKEEPER-4508) and Curator (LOST
after a session timeout of SUSPENDED): when the connection has not come back within
``lost_after`` (by default the session timeout) of a disconnect, the session is
declared LOST on the client side, and the kazoo client is replaced by a fresh one,
which opens a new session. By then the server has expired the session anyway (it last
heard from us no later than the disconnect), so the declaration is the truth whenever
the ensemble has a quorum; recipes react to it as to any expiry (a leader resigns, a
registration re-creates its node in the new session, replacing the old node by its
``ephemeralOwner`` if the server has not removed it yet).

Access control (``ZkConfig.auth``, digest scheme): the session authenticates as the
configured identity and, in addition, as an *owner* identity invented for this object
(a random user and password that never leave the process). Persistent nodes we create
get "all rights for the configured identity, read for everyone"; ephemeral nodes get
"all rights for the owner identity, read for everyone", so no other process, not even
one holding the same credentials, can rewrite them. Deleting a node is a right on its
*parent* in ZooKeeper; see :mod:`discovery.zk.acl` for the tree that makes use of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import posixpath
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import (
    ACL,
    OPEN_ACL_UNSAFE,
    READ_ACL_UNSAFE,
    Permissions,
    make_digest_acl,
    make_digest_acl_credential,
)
from prometheus_client import CollectorRegistry

from discovery.config import ZkConfig
from discovery.errors import (
    ZkAuthError,
    ZkBadVersionError,
    ZkConnectionError,
    ZkError,
    ZkNodeExistsError,
    ZkNoNodeError,
    ZkSessionExpiredError,
)
from discovery.metrics import SessionMetrics
from discovery.zk import _kazoo

__all__ = [
    "NodeStat",
    "SessionEvent",
    "SessionState",
    "SessionSubscription",
    "WatchEvent",
    "ZkSession",
    "close_session",
    "translate_kazoo_error",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


class SessionState(enum.Enum):
    """Connection state of a :class:`ZkSession` as seen on the event loop."""

    CONNECTING = "connecting"
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"
    CLOSED = "closed"


@dataclass(frozen=True)
class SessionEvent:
    """A state change. ``new_session`` is true on the first CONNECTED of each session."""

    state: SessionState
    session_id: int | None
    new_session: bool = False


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


@dataclass(frozen=True)
class NodeStat:
    """The parts of a znode's stat that recipes use."""

    version: int
    ephemeral_owner: int
    czxid: int
    mzxid: int
    num_children: int
    #: The zxid of the last change to the node's children (a create or delete).
    pzxid: int

    @classmethod
    def from_kazoo(cls, stat: ZnodeStat) -> NodeStat:
        return cls(
            version=stat.version,
            ephemeral_owner=stat.ephemeralOwner,
            czxid=stat.czxid,
            mzxid=stat.mzxid,
            num_children=stat.numChildren,
            pzxid=stat.pzxid,
        )


_IMPOSSIBLE_VERSION = 2**31 - 1
# The watchdog backs off to this while ZooKeeper stays unreachable.
_WATCHDOG_MAX_DELAY = 60.0
# How long aclose waits for each replaced client to finish stopping.
_RETIRE_JOIN = 15.0

_KAZOO_STATES = {
    KazooState.CONNECTED: SessionState.CONNECTED,
    KazooState.SUSPENDED: SessionState.SUSPENDED,
    KazooState.LOST: SessionState.LOST,
}

_EVENT_KINDS = {
    EventType.CREATED: "created",
    EventType.DELETED: "deleted",
    EventType.CHANGED: "changed",
    EventType.CHILD: "child",
}


def translate_kazoo_error(exc: BaseException) -> ZkError:
    """Map a kazoo exception onto our error tree (the caller chains the original)."""
    message = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, kz.NoNodeError):
        return ZkNoNodeError(message)
    if isinstance(exc, kz.NodeExistsError):
        return ZkNodeExistsError(message)
    if isinstance(exc, kz.BadVersionError):
        return ZkBadVersionError(message)
    if isinstance(exc, kz.SessionExpiredError):
        return ZkSessionExpiredError(message)
    if isinstance(exc, kz.NoAuthError | kz.AuthFailedError):
        return ZkAuthError(message)
    if isinstance(
        exc,
        kz.ConnectionLoss
        | kz.ConnectionClosedError
        | kz.OperationTimeoutError
        | kz.SessionMovedError
        | KazooTimeoutError
        | TimeoutError,
    ):
        return ZkConnectionError(message)
    return ZkError(message)


# Writes a session answers with a reply kazoo cannot read belong to a broken session.
_WRITES = frozenset({"create_async", "set_async", "delete_async"})


def close_session(hosts: str, session_id: int, password: bytes, timeout: float) -> None:
    """Attach to session ``session_id`` on ``hosts`` and close it. Blocking: run it in a
    thread (``asyncio.to_thread``), never on the event loop.

    ``hosts`` may name a chroot; it is ignored, since closing needs none.

    Raises:
        ZkError: the session could not be attached to (unreachable, or already gone).
    """
    # No chroot: kazoo would check it with a read, a round trip during which the victim
    # can reconnect and take its session back.
    servers = hosts.split("/", 1)[0]
    intruder = KazooClient(hosts=servers, client_id=(session_id, password), timeout=timeout)
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


class _ClientListener:
    """The state listener of one kazoo client: hands each change to the loop.

    Runs on kazoo's connection thread, so it does no ZooKeeper work, only the
    hand-off; the loop side ignores it once its client has been replaced.
    """

    __slots__ = ("_client", "_session")

    def __init__(self, session: ZkSession, client: KazooClient) -> None:
        self._session = session
        self._client = client

    def __call__(self, state: str) -> None:
        mapped = _KAZOO_STATES.get(state)
        if mapped is None:
            return
        client_id = self._client.client_id
        session_id = client_id[0] if client_id else None
        self._session._post(self._session._on_client_state, self._client, mapped, session_id)


class SessionSubscription:
    """An async iterator of :class:`SessionEvent`; ends after the CLOSED event.

    Events are queued, never dropped, so a recipe sees every LOST even if it was busy.
    """

    def __init__(self, session: ZkSession) -> None:
        self._session = session
        self._queue: asyncio.Queue[SessionEvent | None] = asyncio.Queue()
        self._done = False

    def _put(self, event: SessionEvent) -> None:
        self._queue.put_nowait(event)

    def __aiter__(self) -> AsyncIterator[SessionEvent]:
        return self

    async def __anext__(self) -> SessionEvent:
        if self._done:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        if event.state is SessionState.CLOSED:
            self._done = True
        return event

    def close(self) -> None:
        """Stop receiving events; a consumer waiting in ``async for`` ends."""
        self._session._subscribers.discard(self)
        self._done = True
        self._queue.put_nowait(None)


class ZkSession:
    """An asyncio facade over one :class:`kazoo.client.KazooClient`.

    Create it with :meth:`from_config` (or pass a client you built), ``await start()``
    (or ``async with``), then use the operations. All operations raise subclasses of
    :class:`~discovery.errors.ZkError`; a dropped connection or an operation that
    waited longer than ``operation_timeout`` raises
    :class:`~discovery.errors.ZkConnectionError`.

    kazoo reconnects on its own, and after an expiry it opens a new session, which
    subscribers see as a CONNECTED event with ``new_session=True``. The session is
    re-created by this class in two cases: on request (:meth:`restart`), and by the
    watchdog, when the connection has not come back ``lost_after`` seconds after a
    disconnect (subscribers see LOST at once, then CONNECTED with ``new_session``).
    Both replace the kazoo client with one from ``client_factory`` (the same client is
    stopped and started again when there is none), so :attr:`client` may change: read
    it when needed, never keep it.
    """

    def __init__(
        self,
        client: KazooClient,
        *,
        operation_timeout: float = 10.0,
        connect_timeout: float = 30.0,
        registry: CollectorRegistry | None = None,
        acl: list[ACL] | None = None,
        ephemeral_acl: list[ACL] | None = None,
        identities: Sequence[str] = (),
        client_factory: Callable[[], KazooClient] | None = None,
        lost_after: float | None = None,
    ) -> None:
        self._client = client
        self._client_factory = client_factory
        requested = _kazoo.requested_session_timeout(client)
        self._lost_after = lost_after if lost_after is not None else requested
        # The watchdog: armed while disconnected, fired lost_after later.
        self._watchdog: asyncio.TimerHandle | None = None
        self._rebuild_task: asyncio.Task[None] | None = None
        # Consecutive rebuilds without a connection in between: backs the watchdog off
        # while ZooKeeper is unreachable, so clients are not churned every few seconds.
        self._rebuilds_in_a_row = 0
        # Threads stopping replaced clients (touched on the loop only).
        self._retiring: list[threading.Thread] = []
        # The session the watchdog gave up on (id, password), to be closed once a new
        # one is connected, and the task closing it.
        self._abandoned: tuple[int, bytes] | None = None
        # The connected session's id and password: kazoo tells them only while live.
        self._credentials: tuple[int, bytes] | None = None
        self._closing_abandoned: asyncio.Task[None] | None = None
        self._listener: _ClientListener | None = None
        self._operation_timeout = operation_timeout
        self._connect_timeout = connect_timeout
        self._metrics = SessionMetrics(registry if registry is not None else CollectorRegistry())
        #: ACL of persistent nodes we create (None: kazoo's default, open to all).
        self.acl = acl
        #: ACL of ephemeral nodes we create (None: the same as ``acl``).
        self.ephemeral_acl = ephemeral_acl
        self._identities = tuple(identities)
        # Serialises restart() and aclose(): both stop the kazoo client.
        self._lifecycle = asyncio.Lock()
        self._restarting = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = SessionState.CONNECTING
        self._session_id: int | None = None
        self._last_session_id: int | None = None
        self._subscribers: set[SessionSubscription] = set()
        self._listeners: list[Callable[[SessionEvent], None]] = []
        self._connected = asyncio.Event()
        self._closing = False

    @classmethod
    def from_config(
        cls, config: ZkConfig, *, registry: CollectorRegistry | None = None
    ) -> ZkSession:
        """Build a session and its kazoo client from ``config``.

        The client retries connecting forever (with backoff to 2 s between attempts),
        so a ZooKeeper restart or a partition never leaves it given up; ``start`` bounds
        only the first connection.

        With ``config.auth`` the session authenticates with the digest scheme. ZooKeeper
        accepts any digest credentials when they are presented (a wrong password is
        only a different identity), so a wrong password shows up as refused operations;
        :func:`discovery.zk.acl.check_access` turns that into a clear start-up error.
        """
        auth_data: list[tuple[str, str]] = []
        acl: list[ACL] | None = None
        ephemeral_acl: list[ACL] | None = None
        identities: list[str] = []
        if config.auth is not None:
            user, password = config.auth.split(":", 1)
            auth_data.append(("digest", config.auth))
            identities.append(make_digest_acl_credential(user, password))
            # Writable only by us, readable by everyone: Java readers (Curator) and
            # operators can still list the cluster without our credentials.
            acl = [make_digest_acl(user, password, all=True), *READ_ACL_UNSAFE]
            # Our ephemeral nodes belong to this process alone: data servers may share
            # one credential, and one of them must not be able to rewrite another's
            # node. The password never leaves the process, and kazoo presents it again
            # on every reconnect and in every new session of this client.
            owner = f"{user}.{secrets.token_hex(6)}"
            owner_password = secrets.token_urlsafe(24)
            auth_data.append(("digest", f"{owner}:{owner_password}"))
            ephemeral_acl = [make_digest_acl(owner, owner_password, all=True), *READ_ACL_UNSAFE]

        def build() -> KazooClient:
            # The same credentials, owner identity included, in every client: a session
            # that replaces an expired one still owns the ephemeral nodes' ACL.
            return KazooClient(
                hosts=config.hosts,
                timeout=config.session_timeout,
                connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=2.0),
                auth_data=auth_data or None,
                default_acl=acl or OPEN_ACL_UNSAFE,
            )

        return cls(
            build(),
            client_factory=build,
            lost_after=config.session_timeout,
            operation_timeout=config.effective_operation_timeout,
            connect_timeout=config.connect_timeout,
            registry=registry,
            acl=acl,
            ephemeral_acl=ephemeral_acl,
            identities=identities,
        )

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Connect, waiting up to ``connect_timeout``.

        Raises:
            ZkConnectionError: no server answered in time (the client is stopped).
            ZkAuthError: the credentials were refused.
        """
        self._loop = asyncio.get_running_loop()
        self._listen(self._client)
        try:
            await asyncio.to_thread(self._client.start, self._connect_timeout)
        except KazooTimeoutError:
            raise ZkConnectionError(
                f"no ZooKeeper server at {self.hosts!r} answered within {self._connect_timeout:g}s"
            ) from None
        except kz.KazooException as exc:
            raise translate_kazoo_error(exc) from exc
        # The listener's CONNECTED event may still be in the loop's queue.
        await self.wait_connected(self._connect_timeout)

    async def aclose(self) -> None:
        """Close the session: ZooKeeper deletes our ephemeral nodes at once.

        Subscribers receive a final CLOSED event. Safe to call more than once.
        """
        if self._closing:
            return
        self._closing = True
        self._disarm_watchdog()
        for task in (self._rebuild_task, self._closing_abandoned):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        async with self._lifecycle:
            await asyncio.to_thread(self._client.stop)
            await asyncio.to_thread(self._client.close)
        self._unlisten(self._client)
        self._set_state(SessionState.CLOSED, self._session_id)
        # Clients replaced earlier stop in threads of their own; a stuck one is left to
        # the interpreter (daemon threads) rather than hang our close.
        for thread in self._retiring:
            await asyncio.to_thread(thread.join, _RETIRE_JOIN)

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
        events = self.subscribe()
        try:
            async with self._lifecycle:
                if self._closing:
                    raise ZkConnectionError("the ZooKeeper session is closed")
                old = self._session_id
                log.info("ZooKeeper %s: ending session 0x%x to start anew", self.hosts, old or 0)
                self._restarting = True
                try:
                    # stop() sends closeSession: the server removes our ephemeral nodes.
                    await asyncio.to_thread(self._client.stop)
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

    async def __aenter__(self) -> ZkSession:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- state -------------------------------------------------------------------

    @property
    def client(self) -> KazooClient:
        """The kazoo client, for kazoo recipes. Never call its blocking methods on the loop."""
        return self._client

    @property
    def hosts(self) -> str:
        """The connection string, with the chroot if any (``h1:p1,h2:p2/chroot``)."""
        servers = ",".join(f"{host}:{port}" for host, port in self._client.hosts)
        return servers + (self._client.chroot or "")

    @property
    def session_timeout(self) -> float:
        """Seconds the server keeps the session without hearing from us (as requested;
        the watchdog's bound too)."""
        return self._lost_after

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def connected(self) -> bool:
        return self._state is SessionState.CONNECTED

    @property
    def identities(self) -> tuple[str, ...]:
        """The configured digest identities, as ``user:base64(sha1(user:password))``.

        The per-process owner identity is not listed: nothing outside this object
        ever needs to name it.
        """
        return self._identities

    @property
    def session_id(self) -> int | None:
        """The id of the current (or last) session, as in a znode's ``ephemeralOwner``."""
        return self._session_id

    def subscribe(self) -> SessionSubscription:
        """Receive every state change from now on (see :class:`SessionSubscription`)."""
        subscription = SessionSubscription(self)
        if self._state is SessionState.CLOSED:
            subscription._put(SessionEvent(SessionState.CLOSED, self._session_id))
        else:
            self._subscribers.add(subscription)
        return subscription

    def add_listener(self, listener: Callable[[SessionEvent], None]) -> None:
        """Call ``listener(event)`` on the loop at every state change.

        Listeners run synchronously inside the state change: they must not block and
        should only record the event or wake a task (unlike kazoo's own listeners,
        they may touch loop objects).
        """
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[SessionEvent], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

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

    # -- kazoo clients and the watchdog ----------------------------------------------

    def _listen(self, client: KazooClient) -> None:
        listener = _ClientListener(self, client)
        self._listener = listener
        client.add_listener(listener)

    def _unlisten(self, client: KazooClient) -> None:
        if self._listener is not None:
            client.remove_listener(self._listener)

    def _on_client_state(
        self, client: KazooClient, state: SessionState, session_id: int | None
    ) -> None:
        # A replaced client may still report (its LOST as it stops, say): not ours.
        if client is self._client:
            self._set_state(state, session_id)

    def _arm_watchdog(self) -> None:
        if self._watchdog is not None or self._loop is None or self._closing:
            return
        delay = min(self._lost_after * 2**self._rebuilds_in_a_row, _WATCHDOG_MAX_DELAY)
        delay = max(delay, self._lost_after)
        self._watchdog = self._loop.call_later(delay, self._on_watchdog)

    def _disarm_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _on_watchdog(self) -> None:
        self._watchdog = None
        if self._closing or self._state is SessionState.CONNECTED:
            return
        if self._rebuild_task is not None and not self._rebuild_task.done():
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
        self._start_rebuild()

    def _start_rebuild(self) -> None:
        self._rebuilds_in_a_row += 1
        self._rebuild_task = asyncio.create_task(self._rebuild(), name=f"zk-rebuild:{self.hosts}")
        self._rebuild_task.add_done_callback(self._on_rebuild_done)

    def _on_rebuild_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("replacing the ZooKeeper client failed", exc_info=task.exception())
        # Still not connected (or the rebuild failed): try again later, backed off.
        if self._state is not SessionState.CONNECTED:
            self._arm_watchdog()

    async def _rebuild(self) -> None:
        async with self._lifecycle:
            if self._closing or self._state is SessionState.CONNECTED:
                return
            await self._replace_client("watchdog", stopped=False)

    async def _replace_client(self, reason: str, *, stopped: bool) -> None:
        """Start a new session in a fresh kazoo client (the old one is retired).

        Without a ``client_factory`` the same client is stopped, closed and started
        again. Called with ``_lifecycle`` held. ``stopped``: the old client has been
        stopped already (its session closed).
        """
        old = self._client
        self._metrics.client_rebuilds.labels(reason=reason).inc()
        if not stopped and self._credentials is not None:
            # Declared lost by us, not necessarily by the ensemble: after a quorum
            # outage the ensemble keeps it, and its ephemeral nodes (an election node,
            # a registration), for a whole session timeout once the quorum is back.
            self._abandoned, self._credentials = self._credentials, None
        if self._client_factory is None:
            if not stopped:
                await asyncio.to_thread(old.stop)
            # close() as well: a client started again without it keeps bytes in its
            # wake-up socket pair until they clog it (python-zk/kazoo #577).
            await asyncio.to_thread(old.close)
            await asyncio.to_thread(old.start_async)
            return
        new = self._client_factory()
        self._unlisten(old)
        self._client = new
        self._listen(new)
        self._retire(old)
        # Not start(): on a timeout it would stop and close the client for good; the
        # watchdog is what bounds the wait.
        await asyncio.to_thread(new.start_async)

    def report_expired(
        self, client: KazooClient | None, why: str = "expired on the server"
    ) -> None:
        """ZooKeeper answered SESSIONEXPIRED to ``client``: the session is gone.

        Operations of this class report it themselves; code that uses :attr:`client`
        directly (kazoo recipes, in threads of their own) calls this on the loop,
        through ``loop.call_soon_threadsafe``.

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
        if client is not None and client is not self._client:
            return  # an answer from a client already replaced
        if self._closing or self._state is not SessionState.CONNECTED:
            return  # kazoo reports the expiry itself when it is not connected
        if self._rebuild_task is not None and not self._rebuild_task.done():
            return
        log.warning(
            "ZooKeeper %s: session 0x%x is connected but %s; replacing the client",
            self.hosts,
            self._session_id or 0,
            why,
        )
        self._metrics.watchdog_expiries.inc()
        self._set_state(SessionState.LOST, self._session_id)
        self._disarm_watchdog()
        self._start_rebuild()

    def _close_abandoned(self, current: int | None) -> None:
        """Close the session the watchdog abandoned, now that a new one is connected
        (so the ensemble has a quorum): its ephemeral nodes go at once instead of a
        session timeout later, and the next leader need not wait for them."""
        abandoned = self._abandoned
        if abandoned is None or abandoned[0] == current or self._closing:
            return
        if self._closing_abandoned is not None and not self._closing_abandoned.done():
            return  # one at a time: the next is taken when this one is done
        self._abandoned = None
        task = asyncio.create_task(
            self._close_abandoned_session(*abandoned), name=f"zk-close-abandoned:{self.hosts}"
        )
        task.add_done_callback(self._on_abandoned_closed)
        self._closing_abandoned = task

    def _on_abandoned_closed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("closing an abandoned ZooKeeper session failed", exc_info=task.exception())
        if self._state is SessionState.CONNECTED:
            self._close_abandoned(self._session_id)

    async def _close_abandoned_session(self, session_id: int, password: bytes) -> None:
        try:
            await asyncio.to_thread(
                close_session, self.hosts, session_id, password, self._lost_after
            )
        except ZkError as exc:
            # Expired meanwhile, or unreachable again: either way it ends by itself.
            self._metrics.abandoned_closes.labels(result="failed").inc()
            log.info("ZooKeeper %s: session 0x%x not closed: %s", self.hosts, session_id, exc)
        else:
            self._metrics.abandoned_closes.labels(result="closed").inc()
            log.info(
                "ZooKeeper %s: closed session 0x%x, which we had declared lost; its "
                "ephemeral nodes are gone",
                self.hosts,
                session_id,
            )

    def _retire(self, client: KazooClient) -> None:
        """Stop and close a replaced client in a daemon thread of its own.

        A hung connection thread cannot block us: stop() waits for it (kazoo gives
        it ten seconds or more), and we never wait for stop().
        """

        def retire() -> None:
            try:
                client.stop()
                client.close()
            except Exception as exc:  # a stuck client may refuse to stop cleanly
                log.warning("stopping a replaced ZooKeeper client: %s", exc)

        thread = threading.Thread(target=retire, name="zk-retire", daemon=True)
        self._retiring = [t for t in self._retiring if t.is_alive()]
        self._retiring.append(thread)
        thread.start()

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop; from any thread."""
        loop = self._loop
        if loop is None:
            return
        # A late event from kazoo's thread after the loop closed has nobody to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback, *args)

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
            self._disarm_watchdog()
            self._rebuilds_in_a_row = 0
            credentials = self._client.client_id
            if credentials is not None and credentials[0] == session_id:
                self._credentials = credentials
            self._close_abandoned(session_id)
        else:
            self._connected.clear()
            if state in (SessionState.SUSPENDED, SessionState.LOST):
                self._arm_watchdog()
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
        event = SessionEvent(state, self._session_id, new_session)
        for subscriber in list(self._subscribers):
            subscriber._put(event)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("session listener %r failed", listener)
        if state is SessionState.CLOSED:
            self._subscribers.clear()

    # -- operations --------------------------------------------------------------

    def _watcher(self, watch: Callable[[WatchEvent], None] | None) -> _LoopWatch | None:
        return None if watch is None else _LoopWatch(watch, self._post)

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a kazoo ``*_async`` method and await its result on the loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

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
                self._post(settle, None, exc)
            except Exception as exc:
                # kazoo's own completion code failed (seen: a create answered while the
                # connection was being replaced, whose path kazoo could not un-chroot).
                # Whatever it was, the operation did not complete: callers retry a
                # ZkError, while anything else would kill the recipe that awaits it.
                log.warning("ZooKeeper %s: kazoo failed in %s: %r", self.hosts, method, exc)
                self._post(settle, None, _KazooInternalError(repr(exc)))
            else:
                self._post(settle, value, None)

        try:
            method(*args, **kwargs).rawlink(on_done)
            async with asyncio.timeout(self._operation_timeout):
                return await future
        except TimeoutError:
            self._metrics.operation_errors.labels(error="timeout").inc()
            raise ZkConnectionError(
                f"ZooKeeper operation {method.__name__}{args[:1]} timed out after "
                f"{self._operation_timeout:g}s (state {self._state.value})"
            ) from None
        except _KazooInternalError as exc:
            self._metrics.operation_errors.labels(error="ZkError").inc()
            if method.__name__ in _WRITES:
                self.report_expired(
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
                self.report_expired(getattr(owner, "client", owner))
            if isinstance(error, ZkAuthError) and args:
                error = ZkAuthError(self._refusal(method.__name__, args[0], error))
            self._metrics.operation_errors.labels(error=type(error).__name__).inc()
            raise error from exc

    def _refusal(self, method: str, path: object, error: ZkError) -> str:
        operation = method.removesuffix("_async")
        # ZooKeeper checks a create or delete against the parent's ACL, not the node's.
        where = " (a right on its parent)" if operation in ("create", "delete") else ""
        users = ", ".join(repr(i.split(":", 1)[0]) for i in self._identities)
        who = f"identity {users}" if users else "an unauthenticated session"
        return f"ZooKeeper refused {operation} of {path}{where} for {who}: {error}"

    async def create(
        self,
        path: str,
        value: bytes = b"",
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
        acl: Sequence[ACL] | None = None,
    ) -> str:
        """Create a znode; returns its path (with the sequence suffix, if any).

        The node gets ``acl`` if given, else :attr:`ephemeral_acl` (ephemeral nodes)
        or :attr:`acl`. Parents created by ``makepath`` always get :attr:`acl`.
        """
        node_acl = list(acl) if acl is not None else None
        if node_acl is None:
            node_acl = self.ephemeral_acl if ephemeral and self.ephemeral_acl else self.acl
        if not makepath or node_acl == self.acl:
            return await self._create(path, value, node_acl, ephemeral, sequence, makepath)
        # kazoo would give missing parents the node's own ACL: a directory owned by one
        # process's owner identity would be closed to every other process.
        try:
            return await self._create(path, value, node_acl, ephemeral, sequence, False)
        except ZkNoNodeError:
            await self.ensure_path(posixpath.dirname(path) or "/")
        return await self._create(path, value, node_acl, ephemeral, sequence, False)

    async def _create(
        self,
        path: str,
        value: bytes,
        acl: list[ACL] | None,
        ephemeral: bool,
        sequence: bool,
        makepath: bool,
    ) -> str:
        result: str = await self._call(
            self._client.create_async,
            path,
            value,
            acl=acl,
            ephemeral=ephemeral,
            sequence=sequence,
            makepath=makepath,
        )
        return result

    async def get(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> tuple[bytes, NodeStat]:
        """Read a znode's data and stat, optionally leaving a data watch."""
        data, stat = await self._call(self._client.get_async, path, watch=self._watcher(watch))
        return bytes(data or b""), NodeStat.from_kazoo(stat)

    async def get_children(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> list[str]:
        """List a znode's children, optionally leaving a child watch."""
        children: list[str] = await self._call(
            self._client.get_children_async, path, watch=self._watcher(watch)
        )
        return list(children)

    async def exists(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> NodeStat | None:
        """Stat a znode (None if absent), optionally leaving an existence watch."""
        stat = await self._call(self._client.exists_async, path, watch=self._watcher(watch))
        return None if stat is None else NodeStat.from_kazoo(stat)

    async def sync(self, path: str) -> None:
        """Have the server we are connected to catch up with the ensemble's leader, so
        that the reads that follow see every write committed before this call."""
        await self._call(self._client.sync_async, path)

    async def set(self, path: str, value: bytes, *, version: int = -1) -> NodeStat:
        """Replace a znode's data; with ``version`` only if it still has that version."""
        stat = await self._call(self._client.set_async, path, value, version)
        return NodeStat.from_kazoo(stat)

    async def delete(self, path: str, *, version: int = -1) -> None:
        """Delete a znode; with ``version`` only if it still has that version."""
        await self._call(self._client.delete_async, path, version)

    async def ensure_path(self, path: str, *, acl: Sequence[ACL] | None = None) -> None:
        """Create ``path`` and its parents as persistent nodes if they are missing.

        Missing nodes get ``acl`` (default :attr:`acl`); existing ones are left as
        they are, so this needs no right on them beyond reading.
        """
        await self._call(
            self._client.ensure_path_async, path, list(acl) if acl is not None else self.acl
        )

    async def get_acls(self, path: str) -> list[ACL]:
        """Read a znode's ACL (ZooKeeper requires READ or ADMIN on it)."""
        acls, _stat = await self._call(self._client.get_acls_async, path)
        return list(acls)

    async def set_acls(self, path: str, acls: Sequence[ACL]) -> None:
        """Replace a znode's ACL (requires ADMIN on it)."""
        await self._call(self._client.set_acls_async, path, list(acls))

    async def child_rights(self, parent: str) -> int:
        """Which of CREATE and DELETE this session may use on ``parent``'s children.

        Found out by trying, since ZooKeeper shows a digest ACL's password hashes only
        to holders of ADMIN: one transaction creates a child, deletes it and then
        fails on purpose (a version check no node can pass), so nothing is applied
        and no watch fires. DELETE is reported only if CREATE is granted.

        Raises:
            ZkNoNodeError: ``parent`` does not exist.
        """
        probe = f"{parent.rstrip('/')}/.rights-probe-{secrets.token_hex(6)}"
        transaction = self._client.transaction()
        transaction.create(probe, b"", ephemeral=True)
        transaction.delete(probe)
        transaction.check(parent, _IMPOSSIBLE_VERSION)
        results = await self._call(transaction.commit_async)
        if any(isinstance(result, kz.NoNodeError) for result in results):
            raise ZkNoNodeError(f"NoNodeError: {parent}")
        if isinstance(results[0], kz.NoAuthError):
            return 0
        if isinstance(results[1], kz.NoAuthError):
            return int(Permissions.CREATE)
        return int(Permissions.CREATE | Permissions.DELETE)

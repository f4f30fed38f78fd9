"""One ZooKeeper session, owned by one kazoo client, used from asyncio.

kazoo is threaded: its connection thread reports state changes to listeners and its
callback thread runs watch functions and completes asynchronous results. This module
is the bridge between those threads and the event loop for every ZooKeeper operation,
watch and state change (the other two bridges of the project are the election's
thread, :mod:`discovery.election`, and the agent's own loop,
:mod:`discovery.loopthread`):

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

Access control (``ZkConfig.auth``, digest scheme): the session authenticates as the
configured identity and, in addition, as an *owner* identity invented for this object
(a random user and password that never leave the process). Persistent nodes we create
get "all rights for the configured identity, read for everyone"; ephemeral nodes get
"all rights for the owner identity, read for everyone", so no other process, not even
one holding the same credentials, can rewrite them. Deleting a node is a right on its
*parent* in ZooKeeper; see :mod:`discovery.acl` for the tree that makes use of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import posixpath
import secrets
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

from .config import ZkConfig
from .errors import (
    ZkAuthError,
    ZkBadVersionError,
    ZkConnectionError,
    ZkError,
    ZkNodeExistsError,
    ZkNoNodeError,
    ZkSessionExpiredError,
)
from .metrics import SessionMetrics

__all__ = [
    "NodeStat",
    "SessionEvent",
    "SessionState",
    "SessionSubscription",
    "WatchEvent",
    "ZkSession",
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
    (a session event kazoo passes to watchers).
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

    @classmethod
    def from_kazoo(cls, stat: ZnodeStat) -> NodeStat:
        return cls(
            version=stat.version,
            ephemeral_owner=stat.ephemeralOwner,
            czxid=stat.czxid,
            mzxid=stat.mzxid,
            num_children=stat.numChildren,
        )


_IMPOSSIBLE_VERSION = 2**31 - 1

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

    The session is not re-created by this class (except on request, :meth:`restart`):
    kazoo reconnects on its own, and after an expiry it opens a new session, which
    subscribers see as a CONNECTED event with ``new_session=True``.
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
    ) -> None:
        self._client = client
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
        :func:`discovery.acl.check_access` turns that into a clear start-up error.
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
        client = KazooClient(
            hosts=config.hosts,
            timeout=config.session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=2.0),
            auth_data=auth_data or None,
            default_acl=acl or OPEN_ACL_UNSAFE,
        )
        return cls(
            client,
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
        self._client.add_listener(self._on_kazoo_state)
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
        async with self._lifecycle:
            await asyncio.to_thread(self._client.stop)
            await asyncio.to_thread(self._client.close)
        self._client.remove_listener(self._on_kazoo_state)
        self._set_state(SessionState.CLOSED, self._session_id)

    async def restart(self) -> None:
        """End the current session and open a new one with the same client.

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
                    await asyncio.to_thread(self._client.stop)
                finally:
                    self._restarting = False
                # Not start(): on a timeout it would stop and close the client for good.
                await asyncio.to_thread(self._client.start_async)
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

    def _on_kazoo_state(self, state: str) -> None:
        # kazoo's connection thread: no ZooKeeper work here, only a hand-off.
        client_id = self._client.client_id
        session_id = client_id[0] if client_id else None
        mapped = {
            KazooState.CONNECTED: SessionState.CONNECTED,
            KazooState.SUSPENDED: SessionState.SUSPENDED,
            KazooState.LOST: SessionState.LOST,
        }.get(state)
        if mapped is not None:
            self._post(self._set_state, mapped, session_id)

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
        else:
            self._connected.clear()
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
            except BaseException as exc:
                self._post(settle, None, exc)
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
        except kz.KazooException as exc:
            error = translate_kazoo_error(exc)
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

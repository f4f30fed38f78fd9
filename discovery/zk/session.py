"""One ZooKeeper session, owned by one kazoo client, used from asyncio.

:class:`ZkSession` bridges kazoo's threads and the loop for every operation, watch and
state change: no blocking kazoo call on the loop, watch callbacks on the loop, kazoo's
errors translated into :mod:`discovery.errors`. SUSPENDED: the session may still be
alive. LOST: it expired (or the watchdog declared it lost) and its ephemeral nodes are
gone. CONNECTED with ``new_session``: recipes re-create what they own.

Design: docs/design/zookeeper.md, "The session: kazoo's threads and the loop".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.states import WatchedEvent
from kazoo.security import ACL
from prometheus_client import CollectorRegistry

from discovery.config import ZkConfig
from discovery.metrics import SessionMetrics
from discovery.zk import _kazoo
from discovery.zk.abandon import close_session
from discovery.zk.bridge import KazooBridge, WatchEvent
from discovery.zk.clients import client_factory
from discovery.zk.connection import ZkConnection
from discovery.zk.identity import AclIdentity
from discovery.zk.operations import NodeStat, ZkOperations
from discovery.zk.states import SessionEvent, SessionEvents, SessionState, SessionSubscription
from discovery.zk.translate import translate_kazoo_error

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


class ZkSession:
    """An asyncio facade over one :class:`kazoo.client.KazooClient`.

    Create it with :meth:`from_config` (or pass a client you built), ``await start()``
    (or ``async with``), then use the operations. All operations raise subclasses of
    :class:`~discovery.errors.ZkError`; a dropped connection or an operation that
    waited longer than ``operation_timeout`` raises
    :class:`~discovery.errors.ZkConnectionError`. Every operation goes through
    :meth:`call`, and every watch it leaves through :meth:`watcher`.

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
        metrics = SessionMetrics(registry if registry is not None else CollectorRegistry())
        requested = _kazoo.requested_session_timeout(client)
        self._identity = AclIdentity(acl, ephemeral_acl, tuple(identities))
        self._events = SessionEvents()
        self._connection = ZkConnection(
            client,
            events=self._events,
            metrics=metrics,
            lost_after=lost_after if lost_after is not None else requested,
            connect_timeout=connect_timeout,
            client_factory=client_factory,
        )
        self._bridge = KazooBridge(
            self._connection,
            identity=self._identity,
            metrics=metrics,
            operation_timeout=operation_timeout,
        )
        self._operations = ZkOperations(self, self._identity)

    @classmethod
    def from_config(
        cls, config: ZkConfig, *, registry: CollectorRegistry | None = None
    ) -> ZkSession:
        """Build a session and its kazoo client from ``config``.

        The client retries connecting forever (with backoff to 2 s between attempts),
        so a ZooKeeper restart or a partition never leaves it given up; ``start`` bounds
        only the first connection.

        With ``config.auth`` the session authenticates with the digest scheme (see
        :class:`~discovery.zk.identity.AclIdentity`). ZooKeeper accepts any digest
        credentials when they are presented (a wrong password is only a different
        identity), so a wrong password shows up as refused operations;
        :func:`discovery.zk.acl.check_access` turns that into a clear start-up error.
        """
        identity = AclIdentity.from_auth(config.auth)
        build = client_factory(config, identity)
        return cls(
            build(),
            client_factory=build,
            lost_after=config.session_timeout,
            operation_timeout=config.effective_operation_timeout,
            connect_timeout=config.connect_timeout,
            registry=registry,
            acl=identity.acl,
            ephemeral_acl=identity.ephemeral_acl,
            identities=identity.identities,
        )

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Connect, waiting up to ``connect_timeout``.

        Raises:
            ZkConnectionError: no server answered in time (the client is stopped).
            ZkAuthError: the credentials were refused.
        """
        await self._connection.start()

    async def aclose(self) -> None:
        """Close the session: ZooKeeper deletes our ephemeral nodes at once.

        Subscribers receive a final CLOSED event. Safe to call more than once.
        """
        await self._connection.aclose()

    async def restart(self) -> None:
        """End the current session and open a new one (in a fresh kazoo client); returns
        once it is connected. The one way to remove an ephemeral node without the right
        to delete it, and everything else tied to the session goes too: see
        :meth:`ZkConnection.restart <discovery.zk.connection.ZkConnection.restart>`.

        Raises:
            ZkConnectionError: closed or closing, or no new session within
                ``connect_timeout`` (the old one is ended all the same).
        """
        await self._connection.restart()

    async def __aenter__(self) -> ZkSession:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- state -------------------------------------------------------------------

    @property
    def client(self) -> KazooClient:
        """The kazoo client, for kazoo recipes. Never call its blocking methods on the loop."""
        return self._connection.client

    @property
    def hosts(self) -> str:
        """The connection string, with the chroot if any (``h1:p1,h2:p2/chroot``)."""
        return self._connection.hosts

    @property
    def session_timeout(self) -> float:
        """Seconds the server keeps the session without hearing from us (as requested;
        the watchdog's bound too)."""
        return self._connection.lost_after

    @property
    def state(self) -> SessionState:
        return self._connection.state

    @property
    def connected(self) -> bool:
        return self._connection.state is SessionState.CONNECTED

    @property
    def acl(self) -> list[ACL] | None:
        """ACL of persistent nodes we create (None: kazoo's default, open to all)."""
        return self._identity.acl

    @property
    def ephemeral_acl(self) -> list[ACL] | None:
        """ACL of ephemeral nodes we create (None: the same as :attr:`acl`)."""
        return self._identity.ephemeral_acl

    @property
    def identities(self) -> tuple[str, ...]:
        """The configured digest identities, as ``user:base64(sha1(user:password))``.

        The per-process owner identity is not listed: nothing outside this object
        ever needs to name it.
        """
        return self._identity.identities

    @property
    def session_id(self) -> int | None:
        """The id of the current (or last) session, as in a znode's ``ephemeralOwner``."""
        return self._connection.session_id

    def subscribe(self) -> SessionSubscription:
        """Receive every state change from now on (see :class:`SessionSubscription`)."""
        return self._events.subscribe()

    def add_listener(self, listener: Callable[[SessionEvent], None]) -> None:
        """Call ``listener(event)`` on the loop at every state change.

        Listeners run synchronously inside the state change: they must not block and
        should only record the event or wake a task (unlike kazoo's own listeners,
        they may touch loop objects).
        """
        self._events.add_listener(listener)

    def remove_listener(self, listener: Callable[[SessionEvent], None]) -> None:
        self._events.remove_listener(listener)

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until the connection is up.

        Raises:
            ZkConnectionError: not connected within ``timeout`` seconds, or closed.
        """
        await self._connection.wait_connected(timeout)

    def report_expired(
        self, client: KazooClient | None, why: str = "expired on the server"
    ) -> None:
        """ZooKeeper answered SESSIONEXPIRED to ``client``: the session is gone (see
        :meth:`ZkConnection.report_expired
        <discovery.zk.connection.ZkConnection.report_expired>`).

        Operations of this class report it themselves; code that uses :attr:`client`
        directly (kazoo recipes, in threads of their own) calls this on the loop,
        through ``loop.call_soon_threadsafe``.
        """
        self._connection.report_expired(client, why)

    # -- the bridge to kazoo ---------------------------------------------------------

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``method(*args, **kwargs)``, a kazoo ``*_async`` method (or anything
        returning kazoo's asynchronous result), and await its result on the loop.

        For requests this class has no method for (:mod:`discovery.zk.multiread`);
        every operation below goes through here too. Bounded by ``operation_timeout``;
        raises as the operations do. A SESSIONEXPIRED answer is reported for the
        client ``method`` is bound to (or the ``client`` of the object it is bound to).
        """
        return await self._bridge.call(method, *args, **kwargs)

    def watcher(
        self, watch: Callable[[WatchEvent], None] | None
    ) -> Callable[[WatchedEvent], None] | None:
        """The kazoo watch function that runs ``watch`` on the loop (None for None);
        equal for equal ``watch``, so kazoo does not set the same watch twice."""
        return self._bridge.watcher(watch)

    # -- operations --------------------------------------------------------------

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
        return await self._operations.create(
            path, value, ephemeral=ephemeral, sequence=sequence, makepath=makepath, acl=acl
        )

    async def get(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> tuple[bytes, NodeStat]:
        """Read a znode's data and stat, optionally leaving a data watch."""
        return await self._operations.get(path, watch=watch)

    async def get_children(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> list[str]:
        """List a znode's children, optionally leaving a child watch."""
        return await self._operations.get_children(path, watch=watch)

    async def exists(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> NodeStat | None:
        """Stat a znode (None if absent), optionally leaving an existence watch."""
        return await self._operations.exists(path, watch=watch)

    async def sync(self, path: str) -> None:
        """Have the server we are connected to catch up with the ensemble's leader, so
        that the reads that follow see every write committed before this call."""
        await self._operations.sync(path)

    async def set(self, path: str, value: bytes, *, version: int = -1) -> NodeStat:
        """Replace a znode's data; with ``version`` only if it still has that version."""
        return await self._operations.set(path, value, version=version)

    async def delete(self, path: str, *, version: int = -1) -> None:
        """Delete a znode; with ``version`` only if it still has that version."""
        await self._operations.delete(path, version=version)

    async def ensure_path(self, path: str, *, acl: Sequence[ACL] | None = None) -> None:
        """Create ``path`` and its parents as persistent nodes if they are missing.

        Missing nodes get ``acl`` (default :attr:`acl`); existing ones are left as
        they are, so this needs no right on them beyond reading.
        """
        await self._operations.ensure_path(path, acl=acl)

    async def get_acls(self, path: str) -> list[ACL]:
        """Read a znode's ACL (ZooKeeper requires READ or ADMIN on it)."""
        return await self._operations.get_acls(path)

    async def set_acls(self, path: str, acls: Sequence[ACL]) -> None:
        """Replace a znode's ACL (requires ADMIN on it)."""
        await self._operations.set_acls(path, acls)

    async def child_rights(self, parent: str) -> int:
        """Which of CREATE and DELETE this session may use on ``parent``'s children
        (found out by trying: see :meth:`ZkOperations.child_rights
        <discovery.zk.operations.ZkOperations.child_rights>`). DELETE is reported only
        if CREATE is granted.

        Raises:
            ZkNoNodeError: ``parent`` does not exist.
        """
        return await self._operations.child_rights(parent)

"""The kazoo client of a ZooKeeper connection, and its replacements.

State changes are reported from kazoo's connection thread. A replaced client stops in a
daemon thread of its own: a hung one never blocks the loop or the connection's close.

Design: docs/design/zookeeper.md, "The session watchdog: a session can never hang".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry
from kazoo.security import OPEN_ACL_UNSAFE

from discovery.config import ZkConfig
from discovery.zk.identity import AclIdentity
from discovery.zk.kazoolog import mask_kazoo_secrets
from discovery.zk.states import SessionState
from discovery.zk.tls import KazooTls, client_options

__all__ = ["KazooClients", "StateReport", "client_factory"]

log = logging.getLogger(__name__)

#: ``report(client, state, session_id)``, called on kazoo's connection thread.
StateReport = Callable[[KazooClient, SessionState, int | None], None]

# How long close waits for each replaced client to finish stopping.
_RETIRE_JOIN = 15.0

_KAZOO_STATES = {
    KazooState.CONNECTED: SessionState.CONNECTED,
    KazooState.SUSPENDED: SessionState.SUSPENDED,
    KazooState.LOST: SessionState.LOST,
}


def client_factory(config: ZkConfig, identity: AclIdentity) -> Callable[[], KazooClient]:
    """A function making kazoo clients for ``config``, authenticated as ``identity``.

    The clients retry connecting forever (with backoff to 2 s between attempts), so a
    ZooKeeper restart or a partition never leaves them given up. With ``config.tls``
    they connect over TLS, verifying the servers' certificates and names
    (:class:`~discovery.zk.tls.KazooTls`). kazoo's debug log shows their credentials
    masked (:func:`~discovery.zk.kazoolog.mask_kazoo_secrets`).
    """
    mask_kazoo_secrets()
    tls = client_options(KazooTls.from_config(config))

    def build() -> KazooClient:
        # The same credentials, owner identity included, in every client: a session
        # that replaces an expired one still owns the ephemeral nodes' ACL.
        return KazooClient(
            hosts=config.hosts,
            timeout=config.session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=2.0),
            auth_data=list(identity.auth_data) or None,
            default_acl=identity.acl or OPEN_ACL_UNSAFE,
            **tls,
        )

    return build


class _ClientListener:
    """The state listener of one kazoo client: reports each change with the client.

    Runs on kazoo's connection thread, so the report must do no ZooKeeper work, only
    hand the change over (kazoo forbids more there).
    """

    __slots__ = ("_client", "_report")

    def __init__(self, client: KazooClient, report: StateReport) -> None:
        self._client = client
        self._report = report

    def __call__(self, state: str) -> None:
        mapped = _KAZOO_STATES.get(state)
        if mapped is None:
            return
        client_id = self._client.client_id
        self._report(self._client, mapped, client_id[0] if client_id else None)


class KazooClients:
    """The current kazoo client and its replacements (from ``factory``).

    Without a factory the same client is stopped, closed and started again instead.
    :attr:`current` changes at every replacement: read it when needed, never keep it.
    Blocking kazoo calls run in threads; none runs on the loop.
    """

    def __init__(
        self,
        client: KazooClient,
        *,
        factory: Callable[[], KazooClient] | None,
        report: StateReport,
    ) -> None:
        self._client = client
        self._factory = factory
        self._report = report
        self._listener: _ClientListener | None = None
        # Threads stopping replaced clients (touched on the loop only).
        self._retiring: list[threading.Thread] = []

    @property
    def current(self) -> KazooClient:
        return self._client

    @property
    def tls(self) -> KazooTls | None:
        """The current client's TLS settings (None: plaintext); every replacement has
        the same."""
        return KazooTls.of(self._client)

    @property
    def hosts(self) -> str:
        """The connection string, with the chroot if any (``h1:p1,h2:p2/chroot``)."""
        servers = ",".join(f"{host}:{port}" for host, port in self._client.hosts)
        return servers + (self._client.chroot or "")

    def listen(self) -> None:
        """Report the current client's state changes from now on."""
        listener = _ClientListener(self._client, self._report)
        self._listener = listener
        self._client.add_listener(listener)

    def unlisten(self) -> None:
        if self._listener is not None:
            self._client.remove_listener(self._listener)

    async def stop(self) -> None:
        """Stop the current client: it sends closeSession (the server removes our
        ephemeral nodes) and reports LOST."""
        await asyncio.to_thread(self._client.stop)

    async def aclose(self) -> None:
        """Stop and close the current client for good; no more reports."""
        await self.stop()
        await asyncio.to_thread(self._client.close)
        self.unlisten()

    async def join_retired(self) -> None:
        """Wait a while for replaced clients to finish stopping. A stuck one is left to
        the interpreter (daemon threads) rather than hang our close."""
        for thread in self._retiring:
            await asyncio.to_thread(thread.join, _RETIRE_JOIN)

    async def replace(self, *, stopped: bool) -> None:
        """Start a new session in a fresh client (the old one is retired).

        ``stopped``: the old client has been stopped already (its session closed).
        Returns once the new client is starting, not connected: its reports say when.
        """
        old = self._client
        if self._factory is None:
            if not stopped:
                await asyncio.to_thread(old.stop)
            # close() as well: a client started again without it keeps bytes in its
            # wake-up socket pair until they clog it (python-zk/kazoo #577).
            await asyncio.to_thread(old.close)
            await asyncio.to_thread(old.start_async)
            return
        new = self._factory()
        self.unlisten()
        self._client = new
        self.listen()
        self._retire(old)
        # Not start(): on a timeout it would stop and close the client for good; the
        # caller's watchdog is what bounds the wait.
        await asyncio.to_thread(new.start_async)

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

"""ZooKeeper's operations, asyncio side: reads, writes, ACLs and the rights probe.

New nodes get their ACLs from the session's :class:`~discovery.zk.identity.AclIdentity`.

Design: docs/design/zookeeper.md, "The session: kazoo's threads and the loop".
"""

from __future__ import annotations

import posixpath
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.protocol.states import WatchedEvent, ZnodeStat
from kazoo.security import ACL, Permissions

from discovery.errors import ZkNoNodeError
from discovery.zk.bridge import WatchEvent
from discovery.zk.identity import AclIdentity

__all__ = ["NodeStat", "OperationsHost", "ZkOperations"]

_IMPOSSIBLE_VERSION = 2**31 - 1


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


class OperationsHost(Protocol):
    """What the operations need of a session: its current kazoo client, the bridge of
    a kazoo ``*_async`` call to the loop, and of a watch callback to the loop."""

    @property
    def client(self) -> KazooClient: ...

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def watcher(
        self, watch: Callable[[WatchEvent], None] | None
    ) -> Callable[[WatchedEvent], None] | None: ...


class ZkOperations:
    """ZooKeeper's operations on ``host``'s current client, awaited on the loop.

    Failures raise what ``host.call`` raises (:class:`~discovery.errors.ZkError`
    subclasses); nothing is retried here.
    """

    def __init__(self, host: OperationsHost, identity: AclIdentity) -> None:
        self._host = host
        self._identity = identity

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

        The node gets ``acl`` if given, else the identity's ephemeral ACL (ephemeral
        nodes) or its ACL. Parents created by ``makepath`` always get the identity's ACL.
        """
        node_acl = self._identity.node_acl(ephemeral=ephemeral, acl=acl)
        if not makepath or node_acl == self._identity.acl:
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
        result: str = await self._host.call(
            self._host.client.create_async,
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
        host = self._host
        data, stat = await host.call(host.client.get_async, path, watch=host.watcher(watch))
        return bytes(data or b""), NodeStat.from_kazoo(stat)

    async def get_children(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> list[str]:
        """List a znode's children, optionally leaving a child watch."""
        host = self._host
        children: list[str] = await host.call(
            host.client.get_children_async, path, watch=host.watcher(watch)
        )
        return list(children)

    async def exists(
        self, path: str, *, watch: Callable[[WatchEvent], None] | None = None
    ) -> NodeStat | None:
        """Stat a znode (None if absent), optionally leaving an existence watch."""
        host = self._host
        stat = await host.call(host.client.exists_async, path, watch=host.watcher(watch))
        return None if stat is None else NodeStat.from_kazoo(stat)

    async def sync(self, path: str) -> None:
        """Have the server we are connected to catch up with the ensemble's leader, so
        that the reads that follow see every write committed before this call."""
        await self._host.call(self._host.client.sync_async, path)

    async def set(self, path: str, value: bytes, *, version: int = -1) -> NodeStat:
        """Replace a znode's data; with ``version`` only if it still has that version."""
        stat = await self._host.call(self._host.client.set_async, path, value, version)
        return NodeStat.from_kazoo(stat)

    async def delete(self, path: str, *, version: int = -1) -> None:
        """Delete a znode; with ``version`` only if it still has that version."""
        await self._host.call(self._host.client.delete_async, path, version)

    async def ensure_path(self, path: str, *, acl: Sequence[ACL] | None = None) -> None:
        """Create ``path`` and its parents as persistent nodes if they are missing.

        Missing nodes get ``acl`` (default: the identity's ACL); existing ones are left
        as they are, so this needs no right on them beyond reading.
        """
        await self._host.call(
            self._host.client.ensure_path_async,
            path,
            list(acl) if acl is not None else self._identity.acl,
        )

    async def get_acls(self, path: str) -> list[ACL]:
        """Read a znode's ACL (ZooKeeper requires READ or ADMIN on it)."""
        acls, _stat = await self._host.call(self._host.client.get_acls_async, path)
        return list(acls)

    async def set_acls(self, path: str, acls: Sequence[ACL]) -> None:
        """Replace a znode's ACL (requires ADMIN on it)."""
        await self._host.call(self._host.client.set_acls_async, path, list(acls))

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
        transaction = self._host.client.transaction()
        transaction.create(probe, b"", ephemeral=True)
        transaction.delete(probe)
        transaction.check(parent, _IMPOSSIBLE_VERSION)
        results = await self._host.call(transaction.commit_async)
        if any(isinstance(result, kz.NoNodeError) for result in results):
            raise ZkNoNodeError(f"NoNodeError: {parent}")
        if isinstance(results[0], kz.NoAuthError):
            return 0
        if isinstance(results[1], kz.NoAuthError):
            return int(Permissions.CREATE)
        return int(Permissions.CREATE | Permissions.DELETE)

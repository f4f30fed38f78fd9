"""Reading and decoding the children of a membership directory (:class:`ChildReader`).

A child decodes to a :class:`~discovery.instance.ServiceInstance` or to the reason it is
skipped (:func:`decode_child`): bad data never raises, only a failed read does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from discovery.errors import InvalidInstanceError, PayloadTooLargeError, ZkNoNodeError
from discovery.instance import MAX_INSTANCE_BYTES, ServiceInstance
from discovery.zk.multiread import read_many
from discovery.zk.session import NodeStat, WatchEvent, ZkSession

__all__ = ["PERSISTENT", "PERSISTENT_DYNAMIC", "ChildRead", "ChildReader", "decode_child"]

#: The reason prefix (and metric label) of a persistent node whose document says it is
#: an ephemeral registration.
PERSISTENT_DYNAMIC: Final = "persistent_dynamic"
#: The reason prefix (and metric label) of any other persistent node (``PERMANENT``,
#: ``STATIC``) while persistent members are not allowed (the default).
PERSISTENT: Final = "persistent"

# Curator's service types that it registers as EPHEMERAL (_SEQUENTIAL) nodes; PERMANENT
# and STATIC are written as persistent nodes on purpose.
_EPHEMERAL_SERVICE_TYPES: Final = frozenset({"DYNAMIC", "DYNAMIC_SEQUENTIAL"})

# More children than this to read at once (and no data watch to set) go by multiRead.
_BULK_READ_MIN: Final = 16
# Children decoded between two yields to the loop in a bulk read (~7 ms of decoding).
_DECODE_SLICE: Final = 500

#: A child as read: the instance, or None and why it is skipped; and its stat.
ChildRead = tuple[ServiceInstance | None, str | None, NodeStat]

_Watch = Callable[[WatchEvent], None]


def decode_child(
    child: str,
    data: bytes,
    stat: NodeStat,
    *,
    max_bytes: int = MAX_INSTANCE_BYTES,
    allow_persistent: bool = False,
) -> ServiceInstance | str:
    """Decode one child of a membership directory: the instance, or why it is skipped.

    The reason starts with a short word, used as the metric label: ``too_large``,
    ``malformed`` (not a valid ServiceInstance), ``id_mismatch`` (the document's ``id``
    is not the znode's name), :data:`PERSISTENT_DYNAMIC` or :data:`PERSISTENT`.

    A persistent node (no owning session, ``ephemeralOwner`` 0) outlives whatever wrote
    it: a server long gone, or anyone allowed to create a node (a data identity may
    not delete another's node, so not even the real server can remove it). One whose
    ``serviceType`` is ``DYNAMIC`` or ``DYNAMIC_SEQUENTIAL``, which Curator (and our
    :class:`~discovery.zk.registration.Registration`) only ever write as an ephemeral
    node, is always refused (:data:`PERSISTENT_DYNAMIC`). Curator's ``PERMANENT`` and
    ``STATIC`` documents are persistent by design, but a deployment of ephemeral
    registrations has no use for them and an attacker every use: they are refused too
    (:data:`PERSISTENT`) unless ``allow_persistent`` (``--allow-persistent-members``,
    for deployments that register such members on purpose). Never raises for bad
    data: that is what the reason is for.
    """
    try:
        instance = ServiceInstance.from_json(data, max_bytes=max_bytes)
    except PayloadTooLargeError as exc:
        return f"too_large: {exc}"
    except InvalidInstanceError as exc:
        return f"malformed: {exc}"
    if instance.id != child:
        return f"id_mismatch: znode {child!r} holds id {instance.id!r}"
    if stat.ephemeral_owner == 0 and instance.service_type in _EPHEMERAL_SERVICE_TYPES:
        return (
            f"{PERSISTENT_DYNAMIC}: serviceType {instance.service_type} is an ephemeral "
            "registration but the node is persistent (no owning session); a persistent "
            "registration says PERMANENT or STATIC (admitted only with "
            "--allow-persistent-members)"
        )
    if stat.ephemeral_owner == 0 and not allow_persistent:
        return (
            f"{PERSISTENT}: serviceType {instance.service_type} in a persistent node (no "
            "owning session), which outlives whatever wrote it; persistent members are "
            "refused unless --allow-persistent-members"
        )
    return instance


class ChildReader:
    """Lists and reads the children of ``path`` on ``session``, decoded.

    ``admit`` is a deployment's own rule on top of :func:`decode_child`: why a valid
    registration is to be skipped, or None; ``allow_persistent`` is
    :func:`decode_child`'s. At most ``read_concurrency`` single reads
    are in flight at once. A read that fails raises
    :class:`~discovery.errors.ZkError`; a child deleted meanwhile reads as None.
    """

    def __init__(
        self,
        session: ZkSession,
        path: str,
        *,
        max_bytes: int = MAX_INSTANCE_BYTES,
        read_concurrency: int = 256,
        admit: Callable[[ServiceInstance], str | None] | None = None,
        allow_persistent: bool = False,
    ) -> None:
        self._session = session
        self._path = path
        self._max_bytes = max_bytes
        self._allow_persistent = allow_persistent
        self._admit = admit
        self._read_slots = asyncio.Semaphore(read_concurrency)

    async def names(self, watch: _Watch | None) -> list[str]:
        """The children's names, setting the child watch ``watch`` if given."""
        try:
            return await self._session.get_children(self._path, watch=watch)
        except ZkNoNodeError:
            # Someone deleted the directory; it comes back with the next registration.
            await self._session.ensure_path(self._path)
            return await self._session.get_children(self._path, watch=watch)

    async def read_all(self, children: list[str], watch: _Watch | None) -> list[ChildRead | None]:
        """Read and decode ``children``, in order; None for those gone.

        With a data ``watch`` to set, one ``get`` each; without, more than a handful go
        by ``multiRead``, which cannot set one.
        """
        if watch is None and len(children) > _BULK_READ_MIN:
            return await self._read_bulk(children)
        return await asyncio.gather(*(self.read(child, watch) for child in children))

    async def read(self, child: str, watch: _Watch | None) -> ChildRead | None:
        """Read and decode one child; None if it no longer exists."""
        async with self._read_slots:
            try:
                data, stat = await self._session.get(f"{self._path}/{child}", watch=watch)
            except ZkNoNodeError:
                return None
        return self.decode(child, data, stat)

    async def _read_bulk(self, children: list[str]) -> list[ChildRead | None]:
        raw = await read_many(self._session, [f"{self._path}/{child}" for child in children])
        reads: list[ChildRead | None] = []
        for index, (child, entry) in enumerate(zip(children, raw, strict=True)):
            if index and index % _DECODE_SLICE == 0:
                await asyncio.sleep(0)  # 50,000 children take ~0.7 s to decode
            reads.append(None if entry is None else self.decode(child, *entry))
        return reads

    def decode(self, child: str, data: bytes, stat: NodeStat) -> ChildRead:
        """Decode one child's data; the instance, or None and why it is skipped."""
        decoded = decode_child(
            child, data, stat, max_bytes=self._max_bytes, allow_persistent=self._allow_persistent
        )
        if isinstance(decoded, str):
            return None, decoded, stat
        if self._admit is not None and (refused := self._admit(decoded)) is not None:
            return None, refused, stat
        return decoded, None, stat

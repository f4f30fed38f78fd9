"""Reading a cluster's status: ZooKeeper and the live-list store, read once, never written.

Never a blocking kazoo call on the loop. The two reads are not one snapshot: while the
cluster changes, a difference may show for the moment the leader needs to publish it.

Operating: docs/operating.md, "``discovery status``".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from discovery.config import ClusterConfig, ZkConfig, redact_url
from discovery.errors import (
    StatusError,
    StoreAccessError,
    StoreError,
    ZkAuthError,
    ZkError,
    ZkNoNodeError,
)
from discovery.instance import ServiceInstance
from discovery.livelist.admin import LiveListAdmin, OpenedStore
from discovery.livelist.open import default_schemes, open_store
from discovery.livelist.shards import shard_out_of_range
from discovery.zk.maintenance import read_markers
from discovery.zk.membership import decode_child
from discovery.zk.multiread import read_many
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH, SEARCH_MEMBERS_PATH
from discovery.zk.session import ZkSession

from .model import ClusterStatus, Contender, compare

__all__ = [
    "CONNECT_TIMEOUT",
    "STORE_TIMEOUT",
    "collect_status",
    "fetch_status",
    "read_contenders",
    "read_directory",
]

log = logging.getLogger(__name__)

#: ``--zk-connect-timeout`` default of this command: an operator waiting at a prompt
#: wants an answer in seconds, not the 30 s a server grants itself at start-up.
CONNECT_TIMEOUT: Final = 5.0
#: Connect and read timeout for the store (Redis: its sockets); no retries.
STORE_TIMEOUT: Final = 2.0
# kazoo's lock recipe names contenders ``<uuid>__lock__<10-digit sequence>`` and orders
# them by the sequence text (see kazoo.recipe.lock.Lock.contenders).
_CONTENDER_RE: Final = re.compile(r"__lock__(-?\d{10})$")


async def _children(session: ZkSession, path: str) -> list[str]:
    try:
        return await session.get_children(path)
    except ZkNoNodeError:
        return []  # nothing ever registered there


async def read_directory(
    session: ZkSession, path: str, *, allow_persistent: bool = False
) -> tuple[dict[str, ServiceInstance], dict[str, str]]:
    """Decode the ServiceInstances under ``path``: ``(valid by id, invalid id -> reason)``.

    A child is invalid exactly when the membership watcher skips it (the same
    :func:`~discovery.zk.membership.decode_child`): too large, not a valid
    ServiceInstance, an ``id`` other than its znode name, a persistent node whose
    document says it is an ephemeral (``DYNAMIC``) registration, or any other persistent
    node unless ``allow_persistent`` (the leader's ``--allow-persistent-members``).
    """
    children = await _children(session, path)
    # multiRead: hundreds of nodes per request (50,000 in about half a second, where a
    # get each took some 15 s); node by node where the server lacks it.
    read = await read_many(session, [f"{path}/{child}" for child in children])
    nodes = {child: entry for child, entry in zip(children, read, strict=True) if entry}
    valid: dict[str, ServiceInstance] = {}
    invalid: dict[str, str] = {}
    for child, (data, stat) in nodes.items():
        decoded = decode_child(child, data, stat, allow_persistent=allow_persistent)
        if isinstance(decoded, str):
            invalid[child] = decoded
        else:
            valid[child] = decoded
    return valid, invalid


async def read_contenders(session: ZkSession, path: str = SEARCH_ELECTION_PATH) -> list[Contender]:
    """The election's contenders in kazoo's order (lowest sequence, the leader, first)."""
    matches = {
        c: m.group(1) for c in await _children(session, path) if (m := _CONTENDER_RE.search(c))
    }
    ordered = sorted(matches, key=lambda c: matches[c])
    read = await read_many(session, [f"{path}/{child}" for child in ordered])
    return [
        Contender(entry[0].decode("utf-8", errors="replace"), child, entry[1].czxid)
        for child, entry in zip(ordered, read, strict=True)
        if entry is not None
    ]


async def collect_status(
    session: ZkSession,
    store: LiveListAdmin,
    *,
    expected_shards: int = 0,
    allow_persistent_members: bool = False,
    clock: Callable[[], float] = time.time,
) -> ClusterStatus:
    """Read the cluster's registrations, election and published list, and compare them.

    ``session`` must be started; ``store`` is the live-list store's admin
    (:attr:`~discovery.livelist.admin.OpenedStore.admin`); ``expected_shards`` the
    cluster's shard count (0: only the shards seen): a data server of a shard outside
    it is reported among the invalid registrations, refused as the leader and the
    search servers of that ``--shards`` refuse it (``shard_out_of_range``);
    ``allow_persistent_members`` judges persistent registrations as a leader with
    ``--allow-persistent-members`` does (by default they are listed as invalid, reason
    ``persistent``). The ZooKeeper and store reads run concurrently.

    Raises:
        ZkError: a ZooKeeper read failed (ZkConnectionError if unreachable).
        StoreError: a store read failed (StoreUnavailableError if unreachable);
            StoreAccessError if it refused.
    """
    (
        contenders,
        (search_servers, search_invalid),
        (data_servers, data_invalid),
        (heartbeat, published),
        maintenance,
    ) = await _gather_first_error(
        read_contenders(session),
        read_directory(session, SEARCH_MEMBERS_PATH, allow_persistent=allow_persistent_members),
        read_directory(session, DATA_SERVERS_PATH, allow_persistent=allow_persistent_members),
        store.read_published(),
        read_markers(session),
    )
    if expected_shards > 0:
        data_servers, data_invalid = _refuse_other_shards(
            data_servers, data_invalid, expected_shards
        )
    elected = tuple(contenders)
    prefix = store.prefix
    status = ClusterStatus(
        zookeeper=session.hosts,
        redis=store.where(),
        prefix=prefix,
        now_ms=int(clock() * 1000),
        contenders=elected,
        search_servers=search_servers,
        search_servers_invalid=search_invalid,
        data_servers=data_servers,
        data_servers_invalid=data_invalid,
        heartbeat=heartbeat,
        published=published,
        maintenance=maintenance,
        expected_shards=expected_shards,
    )
    differences = compare(data_servers, elected, heartbeat, published, maintenance)
    log.debug(
        "%s: %d data servers registered, %d contenders, in sync: %s",
        prefix,
        len(data_servers),
        len(elected),
        differences.in_sync,
    )
    return dataclasses.replace(status, differences=differences)


def _refuse_other_shards(
    valid: dict[str, ServiceInstance], invalid: dict[str, str], shards: int
) -> tuple[dict[str, ServiceInstance], dict[str, str]]:
    """``valid`` less the servers of a shard outside ``0..shards - 1``, and ``invalid``
    with each of them and why (:func:`~discovery.livelist.shards.shard_out_of_range`)."""
    refused = {
        key: reason
        for key, instance in valid.items()
        if (reason := shard_out_of_range(instance, shards)) is not None
    }
    if not refused:
        return valid, invalid
    kept = {key: instance for key, instance in valid.items() if key not in refused}
    return kept, {**invalid, **refused}


async def _gather_first_error(*aws: Awaitable[Any]) -> list[Any]:
    """Like ``asyncio.gather`` but cancels the other reads when one fails."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# Answers that retrying with the same credentials cannot change.
_REFUSALS: Final = (ZkAuthError, StoreAccessError)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


async def _open_zk(config: ZkConfig) -> ZkSession:
    session = ZkSession.from_config(config)
    try:
        await session.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await session.aclose()
        raise
    return session


async def _open_store(cluster: ClusterConfig) -> OpenedStore:
    # Read-only: status only reads. An operator waiting at a prompt wants an answer
    # now or a reason: no retries.
    store = open_store(cluster, read_only=True, timeout=STORE_TIMEOUT, retry=False)
    try:
        # Refused credentials must say so (exit 4), not pass for an outage.
        await store.admin.ping()
    except BaseException:
        await store.aclose()
        raise
    return store


async def fetch_status(
    zk: ZkConfig,
    cluster: ClusterConfig,
    *,
    expected_shards: int = 0,
    allow_persistent_members: bool = False,
) -> ClusterStatus:
    """Connect to ZooKeeper and the store (concurrently), collect the status, disconnect
    (``expected_shards`` and ``allow_persistent_members``: see :func:`collect_status`).

    Raises:
        StatusError: one line per system that could not be reached or read, naming it
            and where (passwords are not shown); ``refused`` when one refused our
            credentials or lacked a right.
    """
    store_where = redact_url(cluster.store_url)
    backend = default_schemes().backend(cluster)
    zk_result, store_result = await asyncio.gather(
        _open_zk(zk), _open_store(cluster), return_exceptions=True
    )
    try:
        failures: list[str] = []
        refused = False
        for what, where, result in (
            ("ZooKeeper", zk.hosts, zk_result),
            (backend, store_where, store_result),
        ):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # KeyboardInterrupt, CancelledError
                failures.append(f"cannot reach {what} at {where}: {_one_line(result)}")
                refused = refused or isinstance(result, _REFUSALS)
        if failures:
            raise StatusError("\n".join(failures), refused=refused)
        assert isinstance(zk_result, ZkSession)
        assert not isinstance(store_result, BaseException)
        try:
            return await collect_status(
                zk_result,
                store_result.admin,
                expected_shards=expected_shards,
                allow_persistent_members=allow_persistent_members,
            )
        except ZkError as exc:
            raise StatusError(
                f"cannot read ZooKeeper at {zk.hosts}: {_one_line(exc)}",
                refused=isinstance(exc, _REFUSALS),
            ) from exc
        except (StoreError, StoreAccessError) as exc:
            raise StatusError(
                f"cannot read {backend} at {store_where}: {_one_line(exc)}",
                refused=isinstance(exc, _REFUSALS),
            ) from exc
    finally:
        if isinstance(zk_result, ZkSession):
            await zk_result.aclose()
        if not isinstance(store_result, BaseException):
            await store_result.aclose()

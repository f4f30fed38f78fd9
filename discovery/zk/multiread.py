"""Bulk reads of many znodes with ZooKeeper 3.6+ ``multiRead``, which kazoo lacks.

:func:`read_many` gives each path's ``(data, stat)`` in order, or ``None``: no such node.
Any other error of one read fails the call as its ``get`` would; a lost connection or
session, or a batch outliving ``operation_timeout``, is a
:class:`~discovery.errors.ZkConnectionError`. A batch the server refuses, and every read
of a session whose server lacks ``multiRead``, falls back to one ``get`` per node.

Design: docs/design/zookeeper.md, "Bulk reads: multiRead".
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from kazoo import exceptions as kz
from kazoo.client import KazooClient

from discovery.errors import ZkConnectionError, ZkError, ZkNoNodeError, ZkUnsupportedError
from discovery.zk import _kazoo
from discovery.zk.session import NodeStat, ZkSession, translate_kazoo_error

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_CONCURRENCY",
    "REQUEST_BUDGET",
    "RESPONSE_BUDGET",
    "MultiRead",
    "ReadResult",
    "multi_read_available",
    "read_many",
]

log = logging.getLogger(__name__)

#: One node as read: its data and stat.
ReadResult = tuple[bytes, NodeStat]

#: Paths per ``multiRead`` request, at most.
DEFAULT_BATCH: Final = 500
#: Requests of one call in flight at once.
DEFAULT_CONCURRENCY: Final = 4
#: Bytes of answer a batch is sized for (docs/design/zookeeper.md, "Bulk reads: multiRead").
RESPONSE_BUDGET: Final = 512 * 1024
#: Bytes of request at most; ZooKeeper closes the connection beyond ``jute.maxbuffer``.
REQUEST_BUDGET: Final = 256 * 1024
#: The first batch of a call, sent alone: it tells an old server and large nodes apart
#: from the rest before the other batches are sized.
_FIRST_BATCH: Final = 64
#: ``get`` requests in flight at once when reading node by node.
_SINGLE_CONCURRENCY: Final = 256

_OP_MULTI_READ: Final = 22
_OP_GET_DATA: Final = 4
_OP_ERROR: Final = -1
_NO_NODE: Final = kz.NoNodeError.code

_INT = struct.Struct("!i")
_HEADER = struct.Struct("!iBi")  # MultiHeader: int type, boolean done, int err
_STAT = struct.Struct("!qqqqiiiqiiq")  # Stat, as in zookeeper.jute
_GET_DATA_HEADER: Final = _HEADER.pack(_OP_GET_DATA, 0, -1)
_END: Final = _HEADER.pack(-1, 1, -1)
_NO_WATCH: Final = b"\x00"
# Request bytes per path beyond the path itself: header, string length, watch flag.
_PER_PATH: Final = _HEADER.size + _INT.size + 1

# Sessions that met a server without multiRead: read node by node from then on.
_unsupported: weakref.WeakSet[ZkSession] = weakref.WeakSet()


def multi_read_available(session: ZkSession) -> bool:
    """False once ``session`` met a server without ``multiRead`` (it stays so)."""
    return session not in _unsupported


@dataclass(frozen=True, repr=False)
class MultiRead:
    """The ``multiRead`` request (opcode 22) of ``getData`` operations, in kazoo's
    request protocol.

    kazoo sends any object with ``type`` and ``serialize()`` through ``client._call``
    and completes the async result with ``deserialize(buffer, offset)``, on its
    connection thread. ``paths`` are the server-side (chrooted) paths, UTF-8 encoded.
    No ``path`` or ``watcher`` attribute on purpose: kazoo (and the hook of
    :mod:`discovery.zk.watch`) would take this for a one-node request.
    """

    paths: tuple[bytes, ...]
    type: ClassVar[int] = _OP_MULTI_READ

    def serialize(self) -> bytes:
        parts: list[bytes] = []
        for path in self.paths:
            parts += (_GET_DATA_HEADER, _INT.pack(len(path)), path, _NO_WATCH)
        parts.append(_END)
        return b"".join(parts)

    @classmethod
    def deserialize(cls, buffer: bytes, offset: int) -> tuple[list[ReadResult | int], int]:
        """The answer: per operation ``(data, stat)`` or an error code; and its size.

        Raises ``ValueError`` or ``struct.error`` on an answer that is not a
        ``MultiResponse`` of reads (kazoo fails the request with it).
        """
        results: list[ReadResult | int] = []
        append = results.append
        header, stat_struct, length = _HEADER.unpack_from, _STAT.unpack_from, _INT.unpack_from
        kind, done, _err = header(buffer, offset)
        offset += _HEADER.size
        while not done:
            if kind == _OP_GET_DATA:
                (size,) = length(buffer, offset)
                offset += _INT.size
                if size > 0:
                    data = bytes(buffer[offset : offset + size])
                    offset += size
                else:
                    data = b""  # -1: a node created without data
                stat = stat_struct(buffer, offset)
                offset += _STAT.size
                # czxid, mzxid, ctime, mtime, version, cversion, aversion,
                # ephemeralOwner, dataLength, numChildren, pzxid
                append((data, NodeStat(stat[4], stat[7], stat[0], stat[1], stat[9], stat[10])))
            elif kind == _OP_ERROR:
                append(length(buffer, offset)[0])
                offset += _INT.size
            else:
                raise ValueError(f"unexpected operation type {kind} in a multiRead answer")
            kind, done, _err = header(buffer, offset)
            offset += _HEADER.size
        return results, len(buffer)

    def __repr__(self) -> str:
        first = self.paths[0].decode("utf-8", "replace") if self.paths else ""
        return f"<multiRead of {len(self.paths)} path(s) from {first}>"


class _Sender:
    """Sends one request on one kazoo client, the way kazoo's ``*_async`` methods do.

    ``client`` is read by :meth:`ZkSession.call` to tell which client an expired
    session answered on.
    """

    __slots__ = ("client",)

    def __init__(self, client: KazooClient) -> None:
        self.client = client

    def multi_read_async(self, request: MultiRead) -> Any:
        result = self.client.handler.async_result()
        _kazoo.submit(self.client, request, result)
        return result


class _Plan:
    """Hands out the next batch (start, end) and sizes it from the answers so far."""

    def __init__(self, paths: list[bytes], batch: int, response_budget: int) -> None:
        self._paths = paths
        self._batch = batch
        self._budget = response_budget
        self._next = 0
        self._size = batch
        self._per_node = 0.0  # the largest bytes per node seen in one answer
        self._warned = False
        self.requests = 0

    def take(self, limit: int | None = None) -> tuple[int, int] | None:
        start = self._next
        if start >= len(self._paths):
            return None
        end = min(len(self._paths), start + min(self._size, limit or self._size))
        request_bytes = 0
        for index in range(start, end):
            request_bytes += len(self._paths[index]) + _PER_PATH
            if request_bytes > REQUEST_BUDGET and index > start:
                end = index
                break
        self._next = end
        self.requests += 1
        return start, end

    def observe(self, nodes: int, answer_bytes: int) -> None:
        per_node = answer_bytes / nodes
        if per_node <= self._per_node:
            return
        self._per_node = per_node
        self._size = max(1, min(self._batch, int(self._budget // per_node)))
        if answer_bytes > self._budget and not self._warned:
            self._warned = True
            log.info(
                "multiRead: an answer of %d bytes for %d nodes is over the %d-byte budget; "
                "%d nodes per request from now on",
                answer_bytes,
                nodes,
                self._budget,
                self._size,
            )


async def read_many(
    session: ZkSession,
    paths: Sequence[str],
    *,
    batch: int = DEFAULT_BATCH,
    concurrency: int = DEFAULT_CONCURRENCY,
    response_budget: int = RESPONSE_BUDGET,
) -> list[ReadResult | None]:
    """Read the data and stat of every path; ``None`` where there is no such node.

    Results are in the order of ``paths`` (relative to the session's chroot, like
    every operation of the session). Failures are in the module documentation;
    batching and sizes in docs/design/zookeeper.md, "Bulk reads: multiRead".

    Raises:
        ZkConnectionError: the connection or the session was lost, or a batch timed
            out; the call may be repeated once the session is connected.
        ZkError: a node could not be read for another reason (NOAUTH...).
        ValueError: ``batch`` or ``concurrency`` is not positive.
    """
    if batch < 1 or concurrency < 1:
        raise ValueError(f"batch and concurrency must be positive, got {batch}, {concurrency}")
    wanted = list(paths)
    if not wanted:
        return []
    if session in _unsupported:
        return await _read_singly(session, wanted)
    chroot = session.client.chroot or ""
    encoded = [_kazoo.prefix_root(chroot, path).encode("utf-8") for path in wanted]
    results: list[ReadResult | None] = [None] * len(wanted)
    plan = _Plan(encoded, batch, response_budget)
    started = time.monotonic()
    try:
        first = plan.take(_FIRST_BATCH)
        assert first is not None
        await _read_batch(session, wanted, encoded, first, results, plan)
        workers = [
            asyncio.create_task(_worker(session, wanted, encoded, results, plan))
            for _ in range(concurrency)
        ]
        await _join(workers)
    except ZkUnsupportedError as exc:
        if session not in _unsupported:
            _unsupported.add(session)
            log.warning("ZooKeeper %s: %s; reading node by node from now on", session.hosts, exc)
        try:
            return await _read_singly(session, wanted)
        except ZkConnectionError:
            # The server closes the connection after UNIMPLEMENTED: gets sent before
            # kazoo noticed were lost with it. kazoo queues the next ones until it has
            # reconnected (or fails them at a further loss).
            return await _read_singly(session, wanted)
    log.debug(
        "read %d nodes in %d multiRead requests in %.3f s",
        len(wanted),
        plan.requests,
        time.monotonic() - started,
    )
    return results


async def _join(workers: list[asyncio.Task[None]]) -> None:
    """Wait for every worker; on the first failure stop the others and raise it.

    An UNIMPLEMENTED answer closes the connection, so the batches in flight beside it
    fail with a connection loss: :class:`ZkUnsupportedError` wins over those.
    """
    try:
        await asyncio.gather(*workers)
    except BaseException as exc:
        for worker in workers:
            worker.cancel()
        outcomes = await asyncio.gather(*workers, return_exceptions=True)
        if isinstance(exc, ZkError) and not isinstance(exc, ZkUnsupportedError):
            for outcome in outcomes:
                if isinstance(outcome, ZkUnsupportedError):
                    raise outcome from exc
        raise


async def _worker(
    session: ZkSession,
    wanted: list[str],
    encoded: list[bytes],
    results: list[ReadResult | None],
    plan: _Plan,
) -> None:
    while (span := plan.take()) is not None:
        await _read_batch(session, wanted, encoded, span, results, plan)


async def _read_batch(
    session: ZkSession,
    wanted: list[str],
    encoded: list[bytes],
    span: tuple[int, int],
    results: list[ReadResult | None],
    plan: _Plan,
) -> None:
    start, end = span
    request = MultiRead(tuple(encoded[start:end]))
    try:
        answers, answer_bytes = await _send(session, request)
    except (ZkConnectionError, ZkUnsupportedError):
        raise
    except ZkError as exc:
        log.warning(
            "ZooKeeper %s: %r refused (%s); reading its %d nodes one by one",
            session.hosts,
            request,
            exc,
            end - start,
        )
        results[start:end] = await _read_singly(session, wanted[start:end])
        return
    if len(answers) != end - start:
        raise ZkError(f"{request!r} was answered for {len(answers)} operations")
    plan.observe(end - start, answer_bytes)
    for index, answer in enumerate(answers, start):
        if isinstance(answer, int):
            _raise_unless_no_node(answer, wanted[index])
            results[index] = None
        else:
            results[index] = answer


async def _send(session: ZkSession, request: MultiRead) -> tuple[list[ReadResult | int], int]:
    sender = _Sender(session.client)
    try:
        answer: tuple[list[ReadResult | int], int] = await session.call(
            sender.multi_read_async, request
        )
    except ZkError as exc:
        if isinstance(exc.__cause__, kz.UnimplementedError):
            raise ZkUnsupportedError(
                f"ZooKeeper at {session.hosts} does not implement multiRead "
                "(ZooKeeper 3.6 or later)"
            ) from exc
        raise
    return answer


def _raise_unless_no_node(code: int, path: str) -> None:
    """An operation's error: NONODE is no error here, any other is raised."""
    if code == _NO_NODE:
        return
    exception_class = kz.EXCEPTIONS.get(code)
    if exception_class is None:
        raise ZkError(f"ZooKeeper answered error code {code} reading {path} (in a multiRead)")
    error = translate_kazoo_error(exception_class())
    raise type(error)(f"ZooKeeper refused get of {path} (in a multiRead): {error}")


async def _read_singly(session: ZkSession, paths: list[str]) -> list[ReadResult | None]:
    """One ``get`` per path (bounded concurrency); None where there is no such node."""
    slots = asyncio.Semaphore(_SINGLE_CONCURRENCY)

    async def read(path: str) -> ReadResult | None:
        async with slots:
            try:
                return await session.get(path)
            except ZkNoNodeError:
                return None

    return list(await asyncio.gather(*(read(path) for path in paths)))

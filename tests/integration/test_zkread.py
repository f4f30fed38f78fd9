"""Bulk reads by ``multiRead`` (``discovery.zk.multiread``) against a real ZooKeeper 3.8.

Each test runs in a ZooKeeper chroot of its own. What a real server cannot be made to
do (lack ``multiRead``, refuse one, drop the connection after a given answer) is done
by a stand-in between the client and the real server (:class:`_StandIn`), which
forwards every packet but speaks the server's side of the protocol for ``multiRead``
as told, the way ZooKeeper does it (answers in request order; UNIMPLEMENTED, then a
closed connection, from a server before 3.6).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest
from kazoo.security import make_digest_acl

from discovery.errors import ZkAuthError, ZkConnectionError
from discovery.testing import ZooKeeperEnsemble
from discovery.zk.multiread import ReadResult, multi_read_available, read_many
from discovery.zk.session import ZkSession
from tests.support import BULK_OPERATION_TIMEOUT, SessionFactory

TIMEOUT = 20.0


async def create_nodes(session: ZkSession, nodes: dict[str, bytes]) -> None:
    """Create ``nodes`` in order, parents first. Not concurrently: a child's makepath
    can create its parent first, and the parent's own create then finds it there."""
    for path, data in nodes.items():
        await session.create(path, data, makepath=True)


async def singly(session: ZkSession, paths: list[str]) -> list[ReadResult | None]:
    """What one ``get`` per path says (None: no such node)."""
    found = await asyncio.gather(*(session.get(path) for path in paths), return_exceptions=True)
    out: list[ReadResult | None] = []
    for result in found:
        if isinstance(result, BaseException):
            assert type(result).__name__ == "ZkNoNodeError", result
            out.append(None)
        else:
            out.append(result)
    return out


async def read_within(
    session: ZkSession, paths: list[str], **kwargs: int
) -> list[ReadResult | None]:
    async with asyncio.timeout(TIMEOUT):
        return await read_many(session, paths, **kwargs)


def suffix(hosts: str) -> str:
    """The chroot part of a hosts string."""
    return hosts[hosts.index("/") :]


# -- against the real server --------------------------------------------------------


async def test_data_and_stats_equal_what_single_gets_return(zk_session: ZkSession) -> None:
    session = zk_session
    await create_nodes(
        session,
        {
            "/ds/empty": b"",
            "/ds/binary": bytes(range(256)) * 3,
            "/ds/parent": b"p",
            "/ds/parent/a": b"",
            "/ds/parent/b": b"",
            "/ds/unicode-\u00e9": "\u00e9t\u00e9".encode(),
        },
    )
    await session.create("/ds/ephemeral", b"mine", ephemeral=True)
    await session.set("/ds/binary", b"changed")
    await session.set("/ds/binary", b"changed again")
    paths = [
        "/ds/parent",
        "/ds/binary",
        "/ds/ephemeral",
        "/ds/empty",
        "/ds/unicode-\u00e9",
        "/ds/binary",  # twice: each asked path has its answer
        "/ds",
    ]

    results = await read_within(session, paths)

    assert results == await singly(session, paths)
    by_path = dict(zip(paths, results, strict=True))
    empty = by_path["/ds/empty"]
    assert empty is not None
    assert empty[0] == b""
    binary = by_path["/ds/binary"]
    assert binary is not None
    assert binary[0] == b"changed again"
    assert binary[1].version == 2
    parent = by_path["/ds/parent"]
    assert parent is not None
    assert parent[1].num_children == 2
    ephemeral = by_path["/ds/ephemeral"]
    assert ephemeral is not None
    assert ephemeral[1].ephemeral_owner == session.session_id


async def test_missing_and_deleted_nodes_are_none_and_the_rest_is_read(
    zk_session: ZkSession,
) -> None:
    session = zk_session
    nodes = {f"/ds/n{i:03d}": f"node {i}".encode() for i in range(120)}
    await create_nodes(session, nodes)
    deleted = [f"/ds/n{i:03d}" for i in range(0, 120, 7)]
    await asyncio.gather(*(session.delete(path) for path in deleted))
    paths = ["/nowhere", *nodes, "/ds/n000/deeper", "/ds/never"]

    results = await read_within(session, paths, batch=25)

    assert results == await singly(session, paths)
    assert results[0] is None
    assert results[-2:] == [None, None]
    for path, result in zip(paths[1:-2], results[1:-2], strict=True):
        if path in deleted:
            assert result is None, path
        else:
            assert result is not None, path
            assert result[0] == nodes[path], path


async def test_large_read_keeps_the_order_given(make_session: SessionFactory) -> None:
    # Thousands of operations at once: on a loaded machine one waits behind the others
    # longer than the tests' 2 s default, which is not what this test is about.
    session = await make_session(operation_timeout=BULK_OPERATION_TIMEOUT)
    nodes = {f"/ds/server-{i:05d}": (f"{i:05d}" * 100).encode() for i in range(3000)}
    for chunk in range(0, 3000, 500):
        await create_nodes(session, dict(list(nodes.items())[chunk : chunk + 500]))
    paths = list(nodes)
    random.Random(7).shuffle(paths)

    results = await read_within(session, paths)

    assert [r[0] if r else None for r in results] == [nodes[p] for p in paths]
    assert results == await singly(session, paths)
    # Uneven batches, one request at a time, give the same.
    assert await read_within(session, paths, batch=333, concurrency=1) == results


async def test_paths_are_read_within_the_session_chroot(
    zk_server: ZooKeeperEnsemble, zk_hosts: str, make_session: SessionFactory
) -> None:
    chrooted = await make_session()  # in this test's chroot
    unrooted = await make_session(zk_server.hosts)
    chroot = suffix(zk_hosts)
    await create_nodes(chrooted, {"/a": b"in the chroot", "/b/c": b"deeper"})

    inside = await read_within(chrooted, ["/a", "/b/c", f"{chroot}/a"])
    outside = await read_within(unrooted, [f"{chroot}/a", f"{chroot}/b/c"])

    assert [r[0] if r else None for r in inside] == [b"in the chroot", b"deeper", None]
    assert outside == inside[:2]


async def test_answers_over_the_budget_shrink_the_batches(
    zk_session: ZkSession, caplog: pytest.LogCaptureFixture
) -> None:
    session = zk_session
    nodes = {f"/big/n{i:03d}": bytes([i]) * 20_000 for i in range(150)}
    await create_nodes(session, nodes)
    paths = list(nodes)

    with caplog.at_level(logging.INFO, logger="discovery.zk.multiread"):
        results = await read_within(session, paths, response_budget=100_000)

    assert [r[0] if r else None for r in results] == list(nodes.values())
    # The first batch (64 nodes, 1.3 MB) is over; later ones are sized to 4 nodes.
    [record] = [r for r in caplog.records if "budget" in r.getMessage()]
    assert "4 nodes per request" in record.getMessage()


async def test_an_operation_refused_fails_the_read_as_a_get_would(
    zk_session: ZkSession,
) -> None:
    session = zk_session
    await create_nodes(session, {f"/ds/n{i}": b"x" for i in range(30)})
    await session.create("/ds/secret", b"s", acl=[make_digest_acl("someone", "else", all=True)])
    with pytest.raises(ZkAuthError):
        await session.get("/ds/secret")

    with pytest.raises(ZkAuthError, match="/ds/secret"):
        await read_within(session, [f"/ds/n{i}" for i in range(30)] + ["/ds/secret"])


async def test_nothing_to_read_sends_nothing(zk_session: ZkSession) -> None:
    assert await read_many(zk_session, []) == []
    with pytest.raises(ValueError, match="positive"):
        await read_many(zk_session, ["/a"], batch=0)


# -- a stand-in between the client and the server --------------------------------------

_MULTI_READ = 22
_UNIMPLEMENTED = -6
_MARSHALLING_ERROR = -5


class _Link:
    """One proxied connection: kazoo's socket, the server's, and the answers owed."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.write_lock = threading.Lock()  # injected answers never split a packet
        self.owed = threading.Condition()
        self.outstanding = 0  # requests forwarded and not answered yet
        self.multi_read_xids: set[int] = set()
        self._closed = False

    def send_to_client(self, packet: bytes) -> None:
        with self.write_lock:
            self.client.sendall(packet)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class _StandIn:
    """Forwards kazoo <-> ZooKeeper packet by packet; ``multiRead`` as ``mode`` says.

    * ``unimplemented``: answer UNIMPLEMENTED once every earlier request is answered,
      then close the connection (a ZooKeeper before 3.6);
    * ``refuse``: answer MARSHALLINGERROR, keep the connection;
    * ``cut``: forward, but close the connection instead of passing on the
      ``cut_after``-th ``multiRead`` answer (once), so that an answer is owed when the
      connection goes. Requests kazoo has not sent yet are not lost with a connection
      (it sends them after reconnecting): a cut just after an answer lost nothing
      whenever, under load, the next batch had not been sent yet.

    :attr:`multi_reads` counts the ``multiRead`` requests seen.
    """

    def __init__(self, target: str, mode: str, *, cut_after: int = 1) -> None:
        host, port = target.split("/")[0].split(",")[0].rsplit(":", 1)
        self._target = (host, int(port))
        self._mode = mode
        self._cut_left = cut_after
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.multi_reads = 0
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> _StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping = True
        self._thread.join(10)
        self._listener.close()
        for link in self._links:
            link.close()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            client.settimeout(None)
            server = socket.create_connection(self._target)
            link = _Link(client, server)
            self._links.append(link)
            threading.Thread(target=self._upstream, args=(link,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(link,), daemon=True).start()

    @staticmethod
    def _packet(sock: socket.socket) -> bytes:
        """One length-prefixed packet, prefix included."""

        def exactly(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = sock.recv(n - len(data))
                if not chunk:
                    raise ConnectionError("closed")
                data += chunk
            return data

        prefix = exactly(4)
        return prefix + exactly(struct.unpack("!i", prefix)[0])

    def _upstream(self, link: _Link) -> None:
        try:
            link.server.sendall(self._packet(link.client))  # ConnectRequest
            while True:
                packet = self._packet(link.client)
                xid, op = struct.unpack_from("!ii", packet, 4)
                if op == _MULTI_READ:
                    with self._lock:
                        self.multi_reads += 1
                    if self._mode in ("unimplemented", "refuse"):
                        self._answer_in_turn(link, xid)
                        if self._mode == "unimplemented":
                            link.close()
                            return
                        continue
                    link.multi_read_xids.add(xid)
                with link.owed:
                    link.outstanding += 1
                link.server.sendall(packet)
        except (OSError, struct.error):
            link.close()

    def _answer_in_turn(self, link: _Link, xid: int) -> None:
        # ZooKeeper answers a connection's requests in order: first the ones before.
        with link.owed:
            link.owed.wait_for(lambda: link.outstanding == 0, timeout=TIMEOUT)
        err = _UNIMPLEMENTED if self._mode == "unimplemented" else _MARSHALLING_ERROR
        link.send_to_client(struct.pack("!iiqi", 16, xid, 0, err))

    def _downstream(self, link: _Link) -> None:
        try:
            link.send_to_client(self._packet(link.server))  # ConnectResponse
            while True:
                packet = self._packet(link.server)
                (xid,) = struct.unpack_from("!i", packet, 4)
                if self._mode == "cut" and xid in link.multi_read_xids:
                    with self._lock:
                        self._cut_left -= 1
                        cut = self._cut_left == 0
                    if cut:
                        link.close()
                        return
                link.send_to_client(packet)
                if xid != -1:  # -1: a watch notification, not an answer
                    with link.owed:
                        link.outstanding -= 1
                        link.owed.notify_all()
        except (OSError, struct.error):
            link.close()


@pytest.fixture
def stand_in(zk_hosts: str) -> Iterator[Callable[..., _StandIn]]:
    started: list[_StandIn] = []

    def start(mode: str, **kwargs: int) -> _StandIn:
        proxy = _StandIn(zk_hosts, mode, **kwargs).__enter__()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.__exit__(None, None, None)


async def test_a_server_without_multi_read_is_read_node_by_node_from_then_on(
    zk_session: ZkSession,
    zk_hosts: str,
    make_session: SessionFactory,
    stand_in: Callable[..., _StandIn],
    caplog: pytest.LogCaptureFixture,
) -> None:
    nodes = {f"/ds/n{i:03d}": f"node {i}".encode() for i in range(300)}
    await create_nodes(zk_session, nodes)
    paths = [*nodes, "/ds/gone"]
    expected = await read_within(zk_session, paths)
    old_server = stand_in("unimplemented")
    session = await make_session(old_server.address + suffix(zk_hosts))
    assert multi_read_available(session)

    with caplog.at_level(logging.WARNING, logger="discovery.zk.multiread"):
        # An answer, not a timeout: read_within raises TimeoutError at its deadline.
        assert await read_within(session, paths) == expected
        assert old_server.multi_reads == 1  # the first batch, sent alone
        assert not multi_read_available(session)
        # Later calls on the session do not try again.
        assert await read_within(session, paths[:50]) == expected[:50]
        assert old_server.multi_reads == 1

    warnings = [r.getMessage() for r in caplog.records if r.name == "discovery.zk.multiread"]
    assert len(warnings) == 1, warnings
    assert "does not implement multiRead" in warnings[0]
    assert multi_read_available(zk_session)  # a property of the session, not global


async def test_a_refused_batch_is_read_node_by_node(
    zk_session: ZkSession,
    zk_hosts: str,
    make_session: SessionFactory,
    stand_in: Callable[..., _StandIn],
) -> None:
    nodes = {f"/ds/n{i:03d}": f"node {i}".encode() for i in range(200)}
    await create_nodes(zk_session, nodes)
    paths = list(nodes)
    refusing = stand_in("refuse")
    session = await make_session(refusing.address + suffix(zk_hosts))

    assert await read_within(session, paths, batch=50) == await read_within(zk_session, paths)
    assert refusing.multi_reads == 1 + 3  # 64 alone, then 50, 50, 36
    assert multi_read_available(session)  # refused, not unsupported: tried again next time
    await read_within(session, paths[:10])
    assert refusing.multi_reads == 5


async def test_a_connection_lost_midway_raises_a_connection_error(
    zk_session: ZkSession,
    zk_hosts: str,
    make_session: SessionFactory,
    stand_in: Callable[..., _StandIn],
) -> None:
    nodes = {f"/ds/n{i:04d}": bytes(200) for i in range(1000)}
    for chunk in range(0, 1000, 500):
        await create_nodes(zk_session, dict(list(nodes.items())[chunk : chunk + 500]))
    paths = list(nodes)
    # The first batch is answered; the connection goes instead of the second answer.
    flaky = stand_in("cut", cut_after=2)
    session = await make_session(flaky.address + suffix(zk_hosts))

    # The loss itself, not read_within's deadline (that would be a TimeoutError).
    with pytest.raises(ZkConnectionError):
        await read_within(session, paths, batch=100)
    assert flaky.multi_reads >= 2  # the loss came after an answer: midway

    # The session reconnects by itself, and the next read is whole.
    await session.wait_connected(TIMEOUT)
    assert await read_within(session, paths) == await read_within(zk_session, paths)

"""Persistent recursive watches (``discovery.zk.watch``) against a real ZooKeeper 3.8.

Every test but the last runs on the project's ZooKeeper fixtures, in a chroot of its
own; events are waited for with deadlines, never with sleeps. "Exactly" means: after
the changes, one more node (a *marker*) is created, and once its event is in, the
events before it are compared with the expected list. ZooKeeper sends the events of a
connection in order and kazoo's callback thread runs them in order, so nothing can
still be under way.

The last test needs a server *without* addWatch, which the fixtures cannot provide
(they run ZooKeeper 3.8), so it speaks the pre-3.6 server's side of the protocol
itself: answer UNIMPLEMENTED, then close the connection, as ZooKeeper's
UnimplementedRequestProcessor does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import EventType, WatchedEvent
from kazoo.retry import KazooRetry

from discovery.testing import TcpProxy, ZooKeeperEnsemble
from discovery.zk import _kazoo
from discovery.zk.expiry import expire_session
from discovery.zk.session import WatchEvent
from discovery.zk.watch import (
    CHANGED,
    CREATED,
    DELETED,
    RESYNC,
    PersistentRecursiveWatch,
    SessionRecursiveWatch,
    ZkUnsupportedError,
)
from tests.support import SessionFactory, eventually

TIMEOUT = 20.0

Event = tuple[str, str]


class Recorder:
    """A thread-safe callback that records ``(kind, path)`` and can be waited on."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._cond = threading.Condition()

    def __call__(self, kind: str, path: str) -> None:
        with self._cond:
            self.events.append((kind, path))
            self._cond.notify_all()

    def wait_for(self, event: Event, timeout: float = TIMEOUT) -> list[Event]:
        """Wait until ``event`` was recorded; return everything recorded before it."""
        with self._cond:
            if not self._cond.wait_for(lambda: event in self.events, timeout):
                raise AssertionError(f"no {event} within {timeout:g}s; got {self.events}")
            return self.events[: self.events.index(event)]

    def take(self) -> list[Event]:
        with self._cond:
            events, self.events = self.events, []
            return events


@pytest.fixture
def make_client() -> Iterator[Callable[..., KazooClient]]:
    """Start kazoo clients (retrying connections forever); all are closed afterwards."""
    clients: list[KazooClient] = []

    def make(hosts: str, timeout: float = 10.0) -> KazooClient:
        client = KazooClient(
            hosts=hosts,
            timeout=timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5),
        )
        clients.append(client)
        client.start(timeout=TIMEOUT)
        return client

    yield make
    for client in clients:
        with contextlib.suppress(Exception):
            client.stop()
            client.close()


@pytest.fixture
def watches() -> Iterator[list[PersistentRecursiveWatch]]:
    """Watches to stop after the test (before the clients close)."""
    started: list[PersistentRecursiveWatch] = []
    yield started
    for watch in started:
        watch.stop()


def start_watch(
    started: list[PersistentRecursiveWatch], client: KazooClient, path: str
) -> tuple[PersistentRecursiveWatch, Recorder]:
    recorder = Recorder()
    watch = PersistentRecursiveWatch(client, path, recorder)
    watch.start(timeout=TIMEOUT)
    started.append(watch)
    return watch, recorder


def test_children_created_changed_deleted_deliver_exactly_their_events(
    zk_hosts: str, make_client: Callable[..., KazooClient], watches: list[PersistentRecursiveWatch]
) -> None:
    client = make_client(zk_hosts)
    writer = make_client(zk_hosts)
    # The watched node need not exist yet: its creation is an event too.
    watch, recorder = start_watch(watches, client, "/ds")
    assert watch.active

    one_shot: list[WatchedEvent] = []
    writer.create("/ds", b"")
    writer.create("/ds/a", b"1")
    # kazoo's one-shot watches on the same client keep working beside ours.
    client.get("/ds/a", watch=one_shot.append)
    writer.set("/ds/a", b"2")
    writer.create("/ds/a/grandchild", b"")
    writer.set("/ds", b"dir")
    writer.delete("/ds/a/grandchild")
    writer.delete("/ds/a")
    writer.create("/elsewhere", b"")  # outside the watched tree
    writer.create("/ds/marker", b"")

    assert recorder.wait_for((CREATED, "/ds/marker")) == [
        (CREATED, "/ds"),
        (CREATED, "/ds/a"),
        (CHANGED, "/ds/a"),
        (CREATED, "/ds/a/grandchild"),
        (CHANGED, "/ds"),
        (DELETED, "/ds/a/grandchild"),
        (DELETED, "/ds/a"),
    ]
    assert [(e.type, e.path) for e in one_shot] == [(EventType.CHANGED, "/ds/a")]
    assert watch.events == 8
    assert watch.resyncs == 0


async def test_ephemeral_children_of_closed_and_expired_sessions_are_deleted_events(
    zk_hosts: str,
    make_client: Callable[..., KazooClient],
    make_session: SessionFactory,
    watches: list[PersistentRecursiveWatch],
) -> None:
    client = await asyncio.to_thread(make_client, zk_hosts)
    writer = await asyncio.to_thread(make_client, zk_hosts)
    await asyncio.to_thread(writer.ensure_path, "/ds")
    _, recorder = await asyncio.to_thread(start_watch, watches, client, "/ds")

    closing = await make_session()
    expiring = await make_session()
    for session, name in ((closing, "closed"), (expiring, "expired")):
        for i in range(2):
            await session.create(f"/ds/{name}-{i}", b"{}", ephemeral=True)
    await closing.aclose()
    await expire_session(expiring)
    await asyncio.to_thread(writer.create, "/ds/marker", b"")

    events = await asyncio.to_thread(recorder.wait_for, (CREATED, "/ds/marker"))
    created = [(CREATED, f"/ds/{n}-{i}") for n in ("closed", "expired") for i in range(2)]
    assert events[:4] == created
    # A session's ephemeral nodes go in one transaction, in no particular order.
    assert sorted(events[4:]) == sorted((DELETED, path) for _, path in created)


def test_events_under_a_chroot_have_unchrooted_paths(
    zk_server: ZooKeeperEnsemble,
    chroot: Callable[[str], str],
    make_client: Callable[..., KazooClient],
    watches: list[PersistentRecursiveWatch],
) -> None:
    hosts = chroot(zk_server.hosts)
    prefix = hosts[len(zk_server.hosts) :]
    chrooted = make_client(hosts)
    plain = make_client(zk_server.hosts)
    inside, inside_events = start_watch(watches, chrooted, "/")  # the chroot itself
    assert inside.server_path == prefix
    _, outside_events = start_watch(watches, plain, f"{prefix}/ds")

    chrooted.create("/ds/x", b"", makepath=True)
    chrooted.create("/marker", b"")

    assert inside_events.wait_for((CREATED, "/marker")) == [
        (CREATED, "/ds"),
        (CREATED, "/ds/x"),
    ]
    assert outside_events.wait_for((CREATED, f"{prefix}/ds/x")) == [(CREATED, f"{prefix}/ds")]


def test_reconnection_in_the_same_session_readds_the_watch_and_reports_resync(
    zk_server: ZooKeeperEnsemble,
    chroot: Callable[[str], str],
    make_client: Callable[..., KazooClient],
    watches: list[PersistentRecursiveWatch],
) -> None:
    hosts = chroot(zk_server.hosts)
    prefix = hosts[len(zk_server.hosts) :]
    target_host, target_port = zk_server.servers[0].address.rsplit(":", 1)
    with TcpProxy(target_host, int(target_port)) as proxy:
        client = make_client(proxy.address + prefix, timeout=30.0)
        writer = make_client(hosts)
        writer.ensure_path("/ds")
        watch, recorder = start_watch(watches, client, "/ds")
        session_id = client.client_id[0]
        writer.create("/ds/before", b"")
        recorder.wait_for((CREATED, "/ds/before"))

        # A partition: the server sends this event into the void, and forgets the watch
        # with the connection when the proxy closes it on healing.
        proxy.blackhole()
        writer.create("/ds/during", b"")
        proxy.heal()

        before_resync = recorder.wait_for((RESYNC, "/ds"))
        writer.create("/ds/after", b"")
        recorder.wait_for((CREATED, "/ds/after"))
        assert client.client_id[0] == session_id  # the same session, a new connection

    assert (CREATED, "/ds/during") not in recorder.events  # why the resync is needed
    assert before_resync == [(CREATED, "/ds/before")]
    assert watch.resyncs == 1


def test_watch_survives_a_zookeeper_restart(
    own_zk_server: ZooKeeperEnsemble,
    make_client: Callable[..., KazooClient],
    watches: list[PersistentRecursiveWatch],
) -> None:
    # kazoo waits up to the session timeout for a server's answer to its handshake,
    # and a server still starting may leave it unanswered: keep that wait short.
    client = make_client(own_zk_server.hosts, timeout=6.0)
    client.ensure_path("/ds")
    watch, recorder = start_watch(watches, client, "/ds")

    own_zk_server.stop_server(0)
    own_zk_server.start_server(0)
    recorder.wait_for((RESYNC, "/ds"), timeout=2 * TIMEOUT)
    # Usually the same session; on a loaded machine the restarted server may expire it
    # before the client gets through, and the watch is re-added in a new session.
    writer = make_client(own_zk_server.hosts)
    writer.create("/ds/after-restart", b"")

    events = recorder.wait_for((CREATED, "/ds/after-restart"))
    assert events
    assert set(events) == {(RESYNC, "/ds")}  # one per reconnection, nothing else
    assert watch.active


async def test_session_expiry_readds_the_watch_in_the_new_session(
    make_session: SessionFactory,
    make_client: Callable[..., KazooClient],
    zk_hosts: str,
    watches: list[PersistentRecursiveWatch],
) -> None:
    # A watchdog slower than the expiry: kazoo itself opens the new session.
    session = await make_session(session_timeout=10.0)
    writer = await asyncio.to_thread(make_client, zk_hosts)
    await session.ensure_path("/ds")
    client = session.client
    watch, recorder = await asyncio.to_thread(start_watch, watches, client, "/ds")

    old = session.session_id
    new = await expire_session(session)
    assert new != old
    assert session.client is client  # kazoo opened the new session itself
    await asyncio.to_thread(recorder.wait_for, (RESYNC, "/ds"))
    await asyncio.to_thread(writer.create, "/ds/new-session", b"")

    events = await asyncio.to_thread(recorder.wait_for, (CREATED, "/ds/new-session"))
    assert events == [(RESYNC, "/ds")]
    assert watch.active


def test_stop_stops_delivery_and_removes_the_watch(
    zk_hosts: str,
    make_client: Callable[..., KazooClient],
    watches: list[PersistentRecursiveWatch],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = make_client(zk_hosts)
    other = make_client(zk_hosts)
    other.ensure_path("/ds")
    watch, recorder = start_watch(watches, client, "/ds")
    _, witness = start_watch(watches, other, "/ds")
    other.create("/ds/while-watched", b"")
    recorder.wait_for((CREATED, "/ds/while-watched"))

    with caplog.at_level(logging.WARNING, logger="discovery.zk.watch"):
        watch.stop()
        watch.stop()  # idempotent
    assert not caplog.records  # removeWatches was accepted
    assert not watch.active
    # The hook is gone from the connection: kazoo is as it was.
    assert "_read_watch_event" not in vars(_kazoo.connection(client))
    other.create("/ds/after-stop", b"")
    witness.wait_for((CREATED, "/ds/after-stop"))

    assert recorder.events == [(CREATED, "/ds/while-watched")]


def test_two_watches_on_one_path_of_one_client_are_independent(
    zk_hosts: str, make_client: Callable[..., KazooClient], watches: list[PersistentRecursiveWatch]
) -> None:
    client = make_client(zk_hosts)
    client.ensure_path("/ds")
    first, first_events = start_watch(watches, client, "/ds")
    _, second_events = start_watch(watches, client, "/ds")

    first.stop()  # must not remove the server's watch the second one shares
    client.create("/ds/x", b"")

    assert second_events.wait_for((CREATED, "/ds/x")) == []
    assert first_events.events == []


def test_one_shot_data_watch_on_the_watched_path_does_not_end_it(
    zk_hosts: str, make_client: Callable[..., KazooClient], watches: list[PersistentRecursiveWatch]
) -> None:
    """ZooKeeper < 3.9 keeps one watch mode per path and connection (ZOOKEEPER-4466):
    the one-shot watch would silently replace the persistent one."""
    client = make_client(zk_hosts)
    writer = make_client(zk_hosts)
    writer.ensure_path("/ds")
    watch, recorder = start_watch(watches, client, "/ds")
    fired = threading.Event()
    client.get("/ds", watch=lambda event: fired.set())
    recorder.wait_for((RESYNC, "/ds"))  # re-added once kazoo registered the one-shot
    writer.set("/ds", b"x")
    assert fired.wait(TIMEOUT)
    writer.create("/ds/child", b"")

    assert recorder.wait_for((CREATED, "/ds/child")) == [(RESYNC, "/ds"), (CHANGED, "/ds")]
    assert watch.active


def test_one_shot_child_watch_set_before_the_watch_still_fires(
    zk_hosts: str, make_client: Callable[..., KazooClient], watches: list[PersistentRecursiveWatch]
) -> None:
    """Our addWatch replaces a child watch the same client holds on the path (< 3.9):
    its watcher is fired at once so that its owner re-lists and re-arms."""
    client = make_client(zk_hosts)
    client.ensure_path("/ds")
    child_events: list[WatchedEvent] = []
    fired = threading.Event()

    def on_children(event: WatchedEvent) -> None:
        child_events.append(event)
        fired.set()

    client.get_children("/ds", watch=on_children)
    _, recorder = start_watch(watches, client, "/ds")
    assert fired.wait(TIMEOUT)
    fired.clear()
    # Re-armed after the addWatch, the one-shot works, and so does ours.
    client.get_children("/ds", watch=on_children)
    client.create("/ds/x", b"")
    assert fired.wait(TIMEOUT)

    assert [(e.type, e.path) for e in child_events] == [(EventType.CHILD, "/ds")] * 2
    assert recorder.wait_for((CREATED, "/ds/x")) == []


async def test_session_watch_delivers_on_the_loop_and_follows_a_new_client(
    make_session: SessionFactory,
) -> None:
    session = await make_session()
    await session.ensure_path("/ds")
    loop = asyncio.get_running_loop()
    received: list[WatchEvent] = []

    def on_event(event: WatchEvent) -> None:
        assert asyncio.get_running_loop() is loop  # called on the loop, not kazoo's thread
        received.append(event)

    async with SessionRecursiveWatch(session, "/ds", on_event) as watch:
        assert watch.active
        await session.create("/ds/a", b"")
        await eventually(lambda: WatchEvent(CREATED, "/ds/a") in received)

        first_client = session.client
        await session.restart()  # a new kazoo client, in a new session
        assert session.client is not first_client
        await eventually(lambda: WatchEvent(RESYNC, "/ds") in received)
        assert watch.active
        await session.create("/ds/b", b"")
        await eventually(lambda: WatchEvent(CREATED, "/ds/b") in received)

    await session.create("/ds/after-close", b"")
    await session.create("/ds/marker", b"")
    assert received == [
        WatchEvent(CREATED, "/ds/a"),
        WatchEvent(RESYNC, "/ds"),
        WatchEvent(CREATED, "/ds/b"),
    ]


# -- a server without addWatch --------------------------------------------------------

_UNIMPLEMENTED = -6


class _OldZooKeeper:
    """The client side of a ZooKeeper before 3.6, as far as kazoo needs it: sessions,
    pings, and UNIMPLEMENTED (then a closed connection) for every other request."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.refused: list[int] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> _OldZooKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping = True
        self._listener.close()
        self._thread.join(10)

    def _serve(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stopping:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    @staticmethod
    def _packet(conn: socket.socket) -> bytes:
        def exactly(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = conn.recv(n - len(data))
                if not chunk:
                    raise ConnectionError("closed")
                data += chunk
            return data

        (length,) = struct.unpack("!i", exactly(4))
        return exactly(length)

    def _session(self, conn: socket.socket) -> None:
        with conn:
            try:
                connect = self._packet(conn)
                _proto, _zxid, timeout, _session = struct.unpack_from("!iqiq", connect)
                body = struct.pack("!iiq", 0, timeout, 0x5E55) + struct.pack("!i", 16) + bytes(16)
                conn.sendall(struct.pack("!i", len(body)) + body)
                while True:
                    xid, op = struct.unpack_from("!ii", self._packet(conn))
                    err = 0 if op in (11, -11) else _UNIMPLEMENTED  # ping, close
                    if err:
                        self.refused.append(op)
                    conn.sendall(struct.pack("!iiqi", 16, xid, 0, err))
                    if op == -11 or err:
                        return
            except (ConnectionError, OSError, struct.error):
                return


def test_a_server_without_add_watch_is_reported_as_unsupported(
    make_client: Callable[..., KazooClient],
) -> None:
    with _OldZooKeeper() as server:
        client = make_client(f"127.0.0.1:{server.port}")
        watch = PersistentRecursiveWatch(client, "/ds", Recorder())
        # The server's answer (a timeout would raise ZkConnectionError instead).
        with pytest.raises(ZkUnsupportedError, match=r"ZooKeeper 3\.6 or later"):
            watch.start(timeout=TIMEOUT)
        assert server.refused == [106]
        assert not watch.active
        assert "_read_watch_event" not in vars(_kazoo.connection(client))
        watch.stop()  # harmless after a failed start


def test_relative_paths_are_refused() -> None:
    client = KazooClient(hosts="127.0.0.1:1")
    with pytest.raises(ValueError, match="absolute"):
        PersistentRecursiveWatch(client, "ds", Recorder())

"""The contract every live-list store keeps, as checks a store's own tests run.

Each ``check_*`` of :data:`CHECKS` runs on a :class:`StoreHarness` (a fresh list of one
backend, and that backend's faults); ``tests/integration/test_store_conformance.py`` runs
every check against every store.

Design: docs/design/live-list.md, "The live-list store".
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Final, Protocol, TypeVar

from prometheus_client import CollectorRegistry

from discovery.agent.loopthread import LoopThread
from discovery.config import ClusterConfig, RedisConfig
from discovery.errors import ConfigError, FencedError, StoreUnavailableError
from discovery.instance import InstancePayload, ServiceInstance
from discovery.livelist.admin import ChangeNotice, LiveListAdmin, OpenedStore
from discovery.livelist.memory import MemoryLiveStore
from discovery.livelist.model import (
    LiveList,
    LiveListChange,
    LiveListFollower,
    LiveListPublisher,
    LiveListStore,
)
from discovery.livelist.open import open_store
from discovery.livelist.redis.conn import make_redis
from discovery.livelist.redis.layout import RedisKeys

from .redis import RedisServer
from .sentinel import RedisSentinelGroup

__all__ = [
    "CHECKS",
    "MemoryHarness",
    "RedisHarness",
    "StoreHarness",
    "failover_of",
    "restart_of",
]

T = TypeVar("T")

#: The longest any one wait of a check may take (a loaded machine, a failover).
TIMEOUT: Final = 30.0
#: How long a quiet follower of a harness's store waits before it checks its list.
RECONCILE_INTERVAL: Final = 0.5


class StoreHarness(Protocol):
    """One fresh list in one backend, for one check."""

    def open(self, *, read_only: bool = False) -> OpenedStore:
        """A new store on this list (every store opened here shares it); the harness
        closes it in :meth:`aclose`. No I/O: safe to call from any thread."""
        ...

    async def trim(self, keep: int) -> None:
        """Drop all but the newest ``keep`` changes, as the backend's bounded log does."""
        ...

    def outage(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The backend unreachable when the block starts, and back (perhaps without the
        list, as a Redis restarted empty) when it ends."""
        ...

    async def aclose(self) -> None: ...


class _Harness:
    """What the library's harnesses share: a fresh cluster name, the stores opened."""

    def __init__(self, url: str, redis: RedisConfig | None = None) -> None:
        self.cluster = ClusterConfig(
            cluster=f"contract-{uuid.uuid4().hex[:12]}", redis_url=url, redis=redis or RedisConfig()
        )
        self._opened: list[OpenedStore] = []

    def open(self, *, read_only: bool = False) -> OpenedStore:
        store = open_store(
            self.cluster,
            read_only=read_only,
            reconcile_interval=RECONCILE_INTERVAL,
            registry=CollectorRegistry(),
        )
        self._opened.append(store)
        return store

    async def aclose(self) -> None:
        for store in self._opened:
            with contextlib.suppress(Exception):
                await store.aclose()


class MemoryHarness(_Harness):
    """A list of the in-memory store (``memory://``, a fresh name)."""

    def __init__(self) -> None:
        super().__init__(f"memory://contract-{uuid.uuid4().hex[:12]}")
        self._faults = MemoryLiveStore.from_config(self.cluster)

    async def trim(self, keep: int) -> None:
        self._faults.trim(keep)

    @contextlib.asynccontextmanager
    async def outage(self) -> AsyncIterator[None]:
        with self._faults.outage():
            yield


class RedisHarness(_Harness):
    """A list in the Redis of ``url`` (a fresh cluster name); ``outage`` makes that
    Redis unreachable for a block (:func:`restart_of`, :func:`failover_of`)."""

    def __init__(
        self,
        url: str,
        *,
        outage: Callable[[], contextlib.AbstractAsyncContextManager[None]],
        redis: RedisConfig | None = None,
    ) -> None:
        super().__init__(url, redis)
        self._outage = outage

    async def trim(self, keep: int) -> None:
        client = make_redis(self.cluster)
        try:
            await client.xtrim(RedisKeys(self.cluster.redis_prefix).changes, keep, False)
        finally:
            await client.aclose()

    def outage(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._outage()


@contextlib.asynccontextmanager
async def restart_of(server: RedisServer) -> AsyncIterator[None]:
    """``server`` stopped for the block, then started again (empty: it keeps no data)."""
    await asyncio.to_thread(server.stop)
    try:
        yield
    finally:
        await asyncio.to_thread(server.start)


@contextlib.asynccontextmanager
async def failover_of(group: RedisSentinelGroup) -> AsyncIterator[None]:
    """The primary of ``group`` killed when the block starts and unreachable all through
    it (the sentinels hold their failover, so that no slowness of the machine lets one
    end the outage early); after it, a replica is promoted and the killed server
    restarted as a replica."""
    await asyncio.to_thread(group.wait_replicated)
    old = group.primary_address()
    await asyncio.to_thread(group.hold_failovers)
    released = False
    try:
        killed = await asyncio.to_thread(group.kill_primary)
        try:
            yield
        finally:
            released = True
            await asyncio.to_thread(group.release_failovers)
            await asyncio.to_thread(group.wait_for_new_primary, old, TIMEOUT)
            await asyncio.to_thread(group.restart, killed, TIMEOUT)
    finally:
        if not released:  # the kill failed: the group's failovers as they were
            await asyncio.to_thread(group.release_failovers)


# -- helpers -------------------------------------------------------------------------------


def instance(instance_id: str, port: int = 9001, *, shard: int = 0) -> ServiceInstance:
    """A serving data server's instance."""
    payload = InstancePayload.from_dict(
        {"shard": shard, "replica": 0, "docs": 100, "version": "contract", "state": "serving"}
    )
    return ServiceInstance.create("data_servers", instance_id, "127.0.0.1", port, payload)


def view(*instances: ServiceInstance) -> dict[str, ServiceInstance]:
    return {i.id: i for i in instances}


A, B, C, D = (instance(f"ds-{n}", 9001 + i) for i, n in enumerate("abcd"))


async def _raises(error: type[BaseException], awaitable: Awaitable[object], what: str) -> Any:
    try:
        await awaitable
    except error as exc:
        return exc
    raise AssertionError(f"{what}: no {error.__name__} raised")


async def _eventually(probe: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {TIMEOUT}s")
        await asyncio.sleep(0.02)  # ok-sleep: the polling interval of a bounded wait


async def _reaches(follower: LiveListFollower, position: tuple[int, int]) -> LiveList:
    try:
        return await follower.wait_until(lambda live: live.position == position, TIMEOUT)
    except TimeoutError:
        raise AssertionError(
            f"the follower did not reach {position} (holds {follower.current.position})"
        ) from None


async def _stored(store: LiveListStore) -> LiveList:
    stored = await store.read()
    assert stored is not None, "nothing stored"
    return stored


async def _until_available(call: Callable[[], Awaitable[T]]) -> T:
    """``call()`` retried while the backend is unavailable (it is coming back)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            return await call()
        except StoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # ok-sleep: the retry period of a leader's probe


class _Steps:
    """The steps a follower reports (``changes()``): ``(position, reload)`` each,
    recorded by a task on the loop :meth:`start` runs on, until the follower closes."""

    def __init__(self, follower: LiveListFollower) -> None:
        self.seen: list[tuple[tuple[int, int], bool]] = []
        self._follower = follower
        self._task: asyncio.Task[None] | None = None

    async def _record(self, changes: AsyncIterator[LiveListChange]) -> None:
        async for change in changes:
            self.seen.append((change.current.position, change.reload))

    async def start(self) -> None:
        self._task = asyncio.create_task(self._record(self._follower.changes()))

    async def finish(self) -> None:
        """Wait for the last steps (call once the follower is closed: that ends them)."""
        if self._task is not None:
            await asyncio.wait_for(self._task, TIMEOUT)

    @property
    def positions(self) -> list[tuple[int, int]]:
        return [position for position, _reload in self.seen]

    def check_forwards(self) -> None:
        positions = self.positions
        assert positions == sorted(set(positions)), f"the list moved backwards: {positions}"


@contextlib.asynccontextmanager
async def _following(
    store: LiveListStore, *, forwards: bool = True
) -> AsyncIterator[tuple[LiveListFollower, _Steps]]:
    follower = store.follower()
    await follower.start()
    steps = _Steps(follower)
    await steps.start()
    try:
        yield follower, steps
    finally:
        await follower.aclose()
        await steps.finish()
    if forwards:
        steps.check_forwards()


# -- the contract --------------------------------------------------------------------------


async def check_the_protocols(harness: StoreHarness) -> None:
    """A store is a store, with an admin; nothing is published at first; a read-only
    store has no publisher."""
    store = harness.open()
    assert isinstance(store, LiveListStore)
    assert isinstance(store.admin, LiveListAdmin)
    assert isinstance(store.publisher(leader_id="ss-1", epoch=1), LiveListPublisher)
    assert isinstance(store.follower(), LiveListFollower)
    assert await store.read() is None
    heartbeat, published = await store.admin.read_published()
    assert heartbeat is None
    assert (published.live, published.error) == (None, "missing")
    assert (await store.admin.read_fence()).missing
    await _raises(
        ConfigError,
        _call(lambda: harness.open(read_only=True).publisher(leader_id="ss-1", epoch=1)),
        "a read-only store's publisher",
    )


async def _call(function: Callable[[], object]) -> object:
    return function()


async def check_a_follower_sees_every_publish_in_order(harness: StoreHarness) -> None:
    """Each publish awaited reaches the follower as that version; a burst reaches it in
    order and ends where the store is; the follower never goes back."""
    store = harness.open()
    async with _following(store) as (follower, steps):
        publisher = store.publisher(leader_id="ss-1", epoch=5)
        assert await publisher.publish_full(view(A)) == 1
        assert dict((await _reaches(follower, (5, 1))).servers) == view(A)
        servers = view(A)
        for version, (add, extra) in enumerate(((B, {}), (C, {}), (None, {"ds-a": "gone"})), 2):
            added = view(add) if add is not None else {}
            servers = {k: v for k, v in {**servers, **added}.items() if k not in extra}
            assert (
                await publisher.publish_change(servers, added=added, changed={}, removed=extra)
                == version
            )
            live = await _reaches(follower, (5, version))
            assert dict(live.servers) == servers
        assert follower.connected
        # A burst, not awaited one by one: in order, and the end is the stored list.
        for port in range(9100, 9110):
            moved = instance("ds-b", port)
            servers = {**servers, "ds-b": moved}
            await publisher.publish_change(servers, added={}, changed=view(moved), removed={})
        stored = await _stored(store)
        assert stored.position == (5, publisher.version)
        live = await _reaches(follower, stored.position)
        assert dict(live.servers) == dict(stored.servers) == servers
        assert await publisher.heartbeat() is True
    assert steps.positions[-1] == (5, publisher.version)


async def check_versions_never_move_backwards(harness: StoreHarness) -> None:
    """Within an epoch a version not above the stored one is refused, and a follower
    keeps the newer list."""
    store = harness.open()
    async with _following(store) as (follower, _steps):
        publisher = store.publisher(leader_id="ss-1", epoch=7)
        await publisher.publish_full(view(A))
        await publisher.publish_change(view(A, B), added=view(B), changed={}, removed={})
        await _reaches(follower, (7, 2))
        other = store.publisher(leader_id="ss-2", epoch=7)  # starts at version 1
        refused = await _raises(FencedError, other.publish_full(view(C)), "an older version")
        assert (refused.reason, refused.stored_epoch, refused.stored_version) == ("version", 7, 2)
        assert other.fenced
        stored = await _stored(store)
        assert (stored.position, set(stored.servers)) == ((7, 2), {"ds-a", "ds-b"})
        assert follower.current.position == (7, 2)


async def check_a_deposed_epoch_is_fenced(harness: StoreHarness) -> None:
    """Once a newer epoch is stored every write of an older one is refused, heartbeats
    included, and the follower stays with the newer leader."""
    store = harness.open()
    async with _following(store) as (follower, _steps):
        old = store.publisher(leader_id="ss-old", epoch=5)
        new = store.publisher(leader_id="ss-new", epoch=6)
        await old.publish_full(view(A))
        await new.publish_full(view(B))
        refused = await _raises(
            FencedError,
            old.publish_change(view(A, C), added=view(C), changed={}, removed={}),
            "a deposed leader's change",
        )
        assert (refused.reason, refused.stored_epoch) == ("epoch", 6)
        assert old.fenced
        assert not new.fenced
        await _raises(FencedError, old.heartbeat(), "a deposed leader's heartbeat")
        await _raises(FencedError, old.publish_full(view(A)), "a deposed leader's publish")
        stored = await _stored(store)
        assert (stored.epoch, stored.leader, set(stored.servers)) == (6, "ss-new", {"ds-b"})
        live = await _reaches(follower, (6, 1))
        assert live.leader == "ss-new"


async def _gap(harness: StoreHarness, keep: int) -> None:
    """The follower's loop is stalled while three changes are published and the log is
    trimmed to ``keep``; then it must load the stored list (a reload step)."""
    store = harness.open()
    publisher = store.publisher(leader_id="ss-1", epoch=9)
    await publisher.publish_full(view(A))
    elsewhere = LoopThread("storecontract-follower")
    elsewhere.start()

    def on(coroutine: Coroutine[Any, Any, T]) -> Awaitable[T]:
        return asyncio.wrap_future(elsewhere.submit(coroutine))

    try:
        reader = harness.open(read_only=True)
        follower = reader.follower()
        await on(follower.start())
        steps = _Steps(follower)
        await on(steps.start())
        await on(_reaches(follower, (9, 1)))
        stalled, release = threading.Event(), threading.Event()

        def stall() -> None:
            stalled.set()
            release.wait(TIMEOUT)  # blocks the follower's loop: a GC pause, a busy CPU

        elsewhere.loop.call_soon_threadsafe(stall)
        await asyncio.to_thread(stalled.wait, TIMEOUT)
        try:
            await publisher.publish_change(view(A, B), added=view(B), changed={}, removed={})
            await publisher.publish_change(view(A, B, C), added=view(C), changed={}, removed={})
            await publisher.publish_change(view(B, C), added={}, changed={}, removed={"ds-a": "x"})
            await harness.trim(keep)
        finally:
            release.set()
        stored = await _stored(store)
        live = await on(_reaches(follower, stored.position))
        assert dict(live.servers) == dict(stored.servers) == view(B, C)
        await on(follower.aclose())
        await on(steps.finish())
        await on(reader.aclose())  # its clients are that loop's
        steps.check_forwards()
        assert steps.seen[-1] == (stored.position, True), f"no reload: {steps.seen}"
    finally:
        await asyncio.to_thread(elsewhere.stop)


async def check_a_gap_loads_the_published_list(harness: StoreHarness) -> None:
    """A change that does not follow the list held (those between were trimmed) makes
    the follower load the stored list."""
    await _gap(harness, keep=1)


async def check_an_emptied_log_loads_the_published_list(harness: StoreHarness) -> None:
    """With every change trimmed the follower finds the stored list newer when it
    checks, and loads it."""
    await _gap(harness, keep=0)


async def check_the_list_is_kept_through_an_outage(harness: StoreHarness) -> None:
    """In an outage writes and reads raise StoreUnavailableError and the follower keeps
    its list, disconnected; after it the leader's heartbeat says whether to publish in
    full, and the follower catches up."""
    store = harness.open()
    async with _following(store) as (follower, _steps):
        publisher = store.publisher(leader_id="ss-1", epoch=11)
        await publisher.publish_full(view(A, B))
        held = await _reaches(follower, (11, 1))
        async with harness.outage():
            await _raises(StoreUnavailableError, publisher.heartbeat(), "a heartbeat")
            await _raises(StoreUnavailableError, store.read(), "a read")
            await _eventually(lambda: not follower.connected, "the follower disconnected")
            assert follower.current is held
        if not await _until_available(publisher.heartbeat):
            await _until_available(lambda: publisher.publish_full(view(A, B)))
        version = await _until_available(
            lambda: publisher.publish_change(view(A, B, C), added=view(C), changed={}, removed={})
        )
        live = await _reaches(follower, (11, version))
        assert dict(live.servers) == view(A, B, C)
        await _eventually(lambda: follower.connected, "the follower connected again")


async def check_a_full_publish_reloads(harness: StoreHarness) -> None:
    """A full publish (and a new epoch's) replaces the list as a reload step; a follower
    started later loads the list stored then."""
    store = harness.open()
    async with _following(store) as (follower, steps):
        publisher = store.publisher(leader_id="ss-1", epoch=3)
        await publisher.publish_full(view(A, B))
        await publisher.publish_change(view(A, B, C), added=view(C), changed={}, removed={})
        await _reaches(follower, (3, 2))
        await publisher.publish_full(view(D))
        assert dict((await _reaches(follower, (3, 3))).servers) == view(D)
        successor = store.publisher(leader_id="ss-2", epoch=4)
        await successor.publish_full(view(A, D))
        live = await _reaches(follower, (4, 1))
        assert (live.leader, dict(live.servers)) == ("ss-2", view(A, D))
        async with harness.open(read_only=True).follower() as late:
            assert late.current.position == (4, 1)
            assert dict(late.current.servers) == view(A, D)
    assert ((3, 3), True) in steps.seen
    assert ((4, 1), True) in steps.seen


async def check_the_admin_reads_what_was_published(harness: StoreHarness) -> None:
    """The admin reads the published list and the heartbeat, the fence, and every
    accepted write as it happens."""
    store = harness.open()
    admin = store.admin
    assert admin.prefix
    assert admin.where()
    publisher = store.publisher(leader_id="ss-1", epoch=21)
    await publisher.publish_full(view(A))
    notices: list[ChangeNotice] = []

    async def follow() -> None:
        async for write in admin.publishes():
            assert isinstance(write, ChangeNotice), write
            notices.append(write)

    task = asyncio.create_task(follow())
    try:
        # publishes() reports the writes from when it starts reading: publish until
        # one is seen.
        deadline = time.monotonic() + TIMEOUT
        servers = view(A)
        while not notices:
            assert time.monotonic() < deadline, "no write reported"
            port = 9200 + publisher.version
            servers = view(A, instance("ds-b", port))
            await publisher.publish_change(
                servers, added={}, changed=view(servers["ds-b"]), removed={}
            )
            await asyncio.sleep(0.2)  # ok-sleep: a bounded wait for the reader to start
        await _eventually(
            lambda: notices[-1].version == publisher.version, "the last write reported"
        )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [(n.epoch, n.leader, n.kind) for n in notices] == [(21, "ss-1", "delta")] * len(notices)
    versions = [n.version for n in notices]
    assert versions == sorted(set(versions)), versions
    heartbeat, published = await admin.read_published()
    assert published.live is not None
    assert published.error is None
    assert published.live.position == (21, publisher.version)
    assert dict(published.live.servers) == servers
    assert heartbeat is not None
    assert (heartbeat.leader, heartbeat.epoch, heartbeat.error) == ("ss-1", 21, None)
    assert heartbeat.ttl_ms is None or heartbeat.ttl_ms > 0
    fence = await admin.read_fence()
    assert fence.meta is not None
    assert fence.problem is None
    assert (fence.meta.position, fence.meta.leader, fence.generation) == (
        (21, publisher.version),
        "ss-1",
        0,
    )


async def check_the_admin_repairs_a_broken_fence(harness: StoreHarness) -> None:
    """An epoch no leader holds pins the follower and fences the leader; a repair of a
    stale read writes nothing; a repair resets the fence, the follower takes the
    repaired list (lower, a new generation) and the leader publishes again."""
    store = harness.open()
    admin = store.admin
    async with _following(store, forwards=False) as (follower, steps):
        leader = store.publisher(leader_id="ss-1", epoch=7)
        await leader.publish_full(view(A, B))
        await _reaches(follower, (7, 1))
        poison = store.publisher(leader_id="garbage", epoch=2**62)
        await poison.publish_full(view(A, B))
        await _reaches(follower, (2**62, 1))
        await _raises(FencedError, leader.heartbeat(), "the real leader")
        stale = await admin.read_fence()
        assert stale.meta is not None
        assert stale.meta.epoch == 2**62
        await poison.publish_change(view(A), added={}, changed={}, removed={"ds-b": "x"})
        assert await admin.repair_fence(stale, epoch=6, by="contract") is None
        assert (await admin.read_fence()).meta.position == (2**62, 2)  # type: ignore[union-attr]
        repaired = await admin.repair_fence(await admin.read_fence(), epoch=6, by="contract")
        assert repaired is not None
        assert (repaired.epoch, repaired.generation, repaired.count) == (6, 1, 1)
        live = await _reaches(follower, (6, 1))
        assert dict(live.servers) == view(A)
        fresh = store.publisher(leader_id="ss-1", epoch=7)
        assert await fresh.heartbeat() is False  # the list is the repair's, not ours
        version = await fresh.publish_full(view(A, C))
        live = await _reaches(follower, (7, version))
        assert dict(live.servers) == view(A, C)
        assert (await admin.read_fence()).generation == 1
    # Forwards up to the repair and from it on: the one step back is the repair's.
    positions = steps.positions
    repair = positions.index((6, 1))
    for part in (positions[:repair], positions[repair:]):
        assert part == sorted(set(part)), f"the list moved backwards: {positions}"


#: Every check of the contract, by name.
CHECKS: Final[dict[str, Callable[[StoreHarness], Awaitable[None]]]] = {
    check.__name__.removeprefix("check_"): check
    for check in (
        check_the_protocols,
        check_a_follower_sees_every_publish_in_order,
        check_versions_never_move_backwards,
        check_a_deposed_epoch_is_fenced,
        check_a_gap_loads_the_published_list,
        check_an_emptied_log_loads_the_published_list,
        check_the_list_is_kept_through_an_outage,
        check_a_full_publish_reloads,
        check_the_admin_reads_what_was_published,
        check_the_admin_repairs_a_broken_fence,
    )
}

"""Every live-list store keeps the same contract (:mod:`discovery.testing.storecontract`):
the in-memory store, Redis on one server and Redis behind Sentinel, each run through
every check. A new store adds a harness and a test here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from discovery.testing import RedisSentinelGroup, RedisServer
from discovery.testing.storecontract import (
    CHECKS,
    MemoryHarness,
    RedisHarness,
    StoreHarness,
    failover_of,
    restart_of,
)

Check = Callable[[StoreHarness], Awaitable[None]]

each_check = pytest.mark.parametrize("check", list(CHECKS.values()), ids=list(CHECKS))


@pytest.fixture(scope="module")
def sentinel_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelGroup]:
    """A primary, two replicas and three sentinels for this module's checks; each check
    has a list of its own, and the outage check fails the primary over."""
    group = RedisSentinelGroup(tmp_path_factory.mktemp("contract-ha"), replicas=2, sentinels=3)
    group.start()
    yield group
    group.stop()


@pytest.fixture
async def memory_harness() -> AsyncIterator[StoreHarness]:
    harness = MemoryHarness()
    yield harness
    await harness.aclose()


@pytest.fixture
async def redis_harness(own_redis: RedisServer) -> AsyncIterator[StoreHarness]:
    harness = RedisHarness(own_redis.url, outage=lambda: restart_of(own_redis))
    yield harness
    await harness.aclose()


@pytest.fixture
async def sentinel_harness(sentinel_group: RedisSentinelGroup) -> AsyncIterator[StoreHarness]:
    harness = RedisHarness(
        sentinel_group.sentinel_url(), outage=lambda: failover_of(sentinel_group)
    )
    yield harness
    await harness.aclose()


@each_check
async def test_the_memory_store_keeps_the_contract(
    check: Check, memory_harness: StoreHarness
) -> None:
    await check(memory_harness)


@each_check
async def test_the_redis_store_keeps_the_contract(
    check: Check, redis_harness: StoreHarness
) -> None:
    await check(redis_harness)


@each_check
async def test_the_redis_store_behind_sentinel_keeps_the_contract(
    check: Check, sentinel_harness: StoreHarness
) -> None:
    await check(sentinel_harness)

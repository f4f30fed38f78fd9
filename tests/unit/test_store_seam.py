"""The store seam without a server: stores opened by URL scheme, schemes a new store
registers, the neutral errors the Redis ones are, and ``memory://`` settings."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import CollectorRegistry

from discovery.config import ClusterConfig, RedisConfig
from discovery.errors import (
    ConfigError,
    RedisAccessError,
    RedisAuthError,
    RedisOperationError,
    RedisUnavailableError,
    StoreAccessError,
    StoreError,
    StoreUnavailableError,
)
from discovery.livelist import (
    MemoryLiveStore,
    OpenedStore,
    StoreSchemes,
    StoreSettings,
    default_schemes,
    open_store,
)
from discovery.livelist.redis.store import RedisLiveStore


async def test_the_scheme_picks_the_store() -> None:
    for url, kind, backend in (
        ("redis://127.0.0.1:6379/0", RedisLiveStore, "Redis"),
        ("redis+sentinel://h1:26379,h2:26379/mymaster", RedisLiveStore, "Redis"),
        ("memory://seam", MemoryLiveStore, "memory"),
    ):
        async with open_store(url, read_only=True) as store:  # nothing connects yet
            assert isinstance(store, kind)
            assert isinstance(store, OpenedStore)
            assert store.admin.backend == backend
            assert store.admin.prefix == "discovery:{default}"
        assert default_schemes().backend(ClusterConfig(redis_url=url)) == backend


def test_a_url_no_store_takes_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="must start with"):
        ClusterConfig(redis_url="http://h:1/0")
    # Accepted by the settings, but no store of these schemes registered.
    with pytest.raises(ConfigError, match="no store for 'memory'"):
        StoreSchemes().open(ClusterConfig(redis_url="memory://x"))
    for url in ("memory://", "memory://a/b"):
        with pytest.raises(ConfigError, match="memory://NAME"):
            open_store(url)
    with pytest.raises(ConfigError, match="no Redis"):
        ClusterConfig(redis_url="memory://x", redis=RedisConfig(password="p"))


def test_a_new_store_registers_its_scheme() -> None:
    opened: list[tuple[str, StoreSettings]] = []

    def factory(
        cluster: ClusterConfig, settings: StoreSettings, registry: CollectorRegistry | None
    ) -> OpenedStore:
        opened.append((cluster.store_url, settings))
        return MemoryLiveStore.from_config(ClusterConfig(redis_url="memory://new"))

    schemes = default_schemes()
    schemes.register("rediss", factory, backend="Other")
    cluster = ClusterConfig(cluster="c", redis_url="rediss://h:1/0")
    store = open_store(cluster, schemes=schemes, read_only=True, timeout=1.0, retry=False)
    assert isinstance(store, MemoryLiveStore)
    assert opened == [("rediss://h:1/0", StoreSettings(read_only=True, timeout=1.0, retry=False))]
    assert schemes.backend(cluster) == "Other"
    assert "memory" in schemes.schemes


def test_the_redis_errors_are_the_neutral_ones() -> None:
    # What callers outside the Redis store catch; every existing ``except`` still holds.
    assert issubclass(RedisUnavailableError, StoreUnavailableError)
    assert issubclass(RedisUnavailableError, RedisOperationError)
    assert issubclass(StoreUnavailableError, StoreError)
    assert issubclass(RedisAuthError, StoreAccessError)
    assert issubclass(RedisAccessError, StoreAccessError)
    # Refused credentials are no outage: whoever retries StoreErrors does not retry them.
    assert not issubclass(StoreAccessError, StoreError)


async def test_stores_of_one_memory_name_share_the_list_per_cluster() -> None:
    url = f"memory://shared-{uuid.uuid4().hex[:8]}"
    one = open_store(ClusterConfig(cluster="a", redis_url=url))
    two = open_store(ClusterConfig(cluster="a", redis_url=url))
    other = open_store(ClusterConfig(cluster="b", redis_url=url))
    publisher = one.publisher(leader_id="ss-1", epoch=3)
    await publisher.publish_full({})
    stored = await two.read()
    assert stored is not None
    assert stored.position == (3, 1)
    assert await other.read() is None

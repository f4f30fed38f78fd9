"""Opening a live-list store by its URL: :func:`open_store`.

:class:`StoreSchemes` maps URL schemes to factories (:func:`default_schemes`: Redis and
``memory://``); callers never name a store's class, so a new store is one factory.

Design: docs/design/live-list.md, "The live-list store".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry

from discovery.config import ClusterConfig
from discovery.errors import ConfigError
from discovery.livelist.admin import OpenedStore
from discovery.livelist.memory import MemoryLiveStore
from discovery.livelist.redis import RedisLiveStore

__all__ = ["StoreFactory", "StoreSchemes", "StoreSettings", "default_schemes", "open_store"]


@dataclass(frozen=True)
class StoreSettings:
    """How a store is opened, whatever its backend.

    Attributes:
        read_only: no publisher and no repair (a search server that never leads, an
            operator's read).
        heartbeat_ttl: seconds the leader's heartbeat lives.
        reconcile_interval: seconds a quiet follower waits before it checks its list.
        timeout: seconds connecting or one call to the backend may take.
        retry: a failed call is tried once more on a fresh connection; False fails at
            once (an operator's command answers now or says it cannot).
    """

    read_only: bool = False
    heartbeat_ttl: float = 5.0
    reconcile_interval: float = 5.0
    timeout: float = 2.0
    retry: bool = True


class StoreFactory(Protocol):
    """Opens one kind of store for ``cluster`` (whose URL has this factory's scheme).
    Opening does no I/O: a backend that is down is no error here."""

    def __call__(
        self, cluster: ClusterConfig, settings: StoreSettings, registry: CollectorRegistry | None
    ) -> OpenedStore: ...


def _redis(
    cluster: ClusterConfig, settings: StoreSettings, registry: CollectorRegistry | None
) -> OpenedStore:
    return RedisLiveStore.from_config(
        cluster,
        read_only=settings.read_only,
        heartbeat_ttl=settings.heartbeat_ttl,
        reconcile_interval=settings.reconcile_interval,
        registry=registry,
        socket_timeout=settings.timeout,
        retry=settings.retry,
    )


def _memory(
    cluster: ClusterConfig, settings: StoreSettings, registry: CollectorRegistry | None
) -> OpenedStore:
    return MemoryLiveStore.from_config(
        cluster,
        read_only=settings.read_only,
        heartbeat_ttl=settings.heartbeat_ttl,
        reconcile_interval=settings.reconcile_interval,
        registry=registry,
    )


class StoreSchemes:
    """URL schemes and the factory that opens a store of each (see the module docstring)."""

    def __init__(self) -> None:
        self._factories: dict[str, tuple[StoreFactory, str]] = {}

    def register(self, scheme: str, factory: StoreFactory, *, backend: str) -> None:
        """Open URLs of ``scheme`` with ``factory`` (replacing any factory it had);
        ``backend`` names the kind of store in messages (``Redis``)."""
        self._factories[scheme] = (factory, backend)

    @property
    def schemes(self) -> frozenset[str]:
        return frozenset(self._factories)

    def backend(self, cluster: ClusterConfig) -> str:
        """What the store of ``cluster``'s URL is, for messages (``the store`` if unknown)."""
        known = self._factories.get(cluster.store_scheme)
        return known[1] if known is not None else "the store"

    def open(
        self,
        cluster: ClusterConfig,
        settings: StoreSettings = StoreSettings(),
        *,
        registry: CollectorRegistry | None = None,
    ) -> OpenedStore:
        """The store ``cluster.store_url`` names, with metrics on ``registry``.

        Raises:
            ConfigError: no factory for the URL's scheme, or a URL the factory refuses.
        """
        known = self._factories.get(cluster.store_scheme)
        if known is None:
            schemes = ", ".join(f"{scheme}://" for scheme in sorted(self._factories))
            raise ConfigError(
                f"--redis / DISCOVERY_REDIS_URL: no store for {cluster.store_scheme!r} "
                f"URLs (known: {schemes})"
            )
        return known[0](cluster, settings, registry)


def default_schemes() -> StoreSchemes:
    """The stores the library ships: Redis and ``memory://``."""
    schemes = StoreSchemes()
    for scheme in (
        "redis",
        "rediss",
        "unix",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
        "rediss+cluster",
    ):
        schemes.register(scheme, _redis, backend="Redis")
    schemes.register("memory", _memory, backend="memory")
    return schemes


def open_store(
    cluster: ClusterConfig | str,
    *,
    registry: CollectorRegistry | None = None,
    schemes: StoreSchemes | None = None,
    read_only: bool = False,
    heartbeat_ttl: float = 5.0,
    reconcile_interval: float = 5.0,
    timeout: float = 2.0,
    retry: bool = True,
) -> OpenedStore:
    """Open the live-list store of ``cluster`` (or of a URL, for the cluster ``default``).

    The URL's scheme picks the store among ``schemes`` (:func:`default_schemes` if
    None); metrics go to ``registry`` (a fresh one if None); the rest is
    :class:`StoreSettings`. Nothing connects yet. The store owns what it opened:
    ``async with`` it, or :meth:`~discovery.livelist.LiveListStore.aclose` it.

    Raises:
        ConfigError: a URL no store takes, or settings its store refuses.
    """
    if isinstance(cluster, str):
        cluster = ClusterConfig(redis_url=cluster)
    settings = StoreSettings(read_only, heartbeat_ttl, reconcile_interval, timeout, retry)
    return (schemes or default_schemes()).open(cluster, settings, registry=registry)

"""Redis layout 1 of the live list, kept for one release behind ``--redis-layout v1``.

Layout 1 (``P:live``, one JSON snapshot rewritten by every change, and the pub/sub
channel ``P:events``) is what shipped first; layout 2 (:mod:`discovery.redislayout`)
replaces it and writes only what changed. A cluster that upgrades search servers one
at a time runs the new release with ``--redis-layout v1`` first, then switches every
search server to layout 2 (``docs/ARCHITECTURE.md``, "Migrating from layout 1").
:class:`RedisLiveStoreV1` implements :class:`~discovery.store.LiveListStore` like the
default store; the benchmarks use it as the baseline of layout 2.
"""

from .layout import V1Keys
from .publisher import LivePublisherV1
from .reader import LiveListReaderV1
from .store import RedisLiveStoreV1

__all__ = ["LiveListReaderV1", "LivePublisherV1", "RedisLiveStoreV1", "V1Keys"]

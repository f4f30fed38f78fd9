"""Redis layout 1 of the live list: the benchmarks' baseline, not part of the product.

Layout 1 (``P:live``, one JSON snapshot rewritten by every change, and the pub/sub
channel ``P:events``) was the first design; the product's layout writes only what
changed. :class:`RedisLiveStoreV1` implements the store Protocol like the default
store, so ``bench_scale.py`` can run both on the same registrations and report ratios.
Imported by the benchmarks as ``layout_v1`` (``bench/`` is their import root).
"""

from layout_v1.layout import V1Keys
from layout_v1.publisher import LivePublisherV1
from layout_v1.reader import LiveListReaderV1
from layout_v1.store import RedisLiveStoreV1

__all__ = ["LiveListReaderV1", "LivePublisherV1", "RedisLiveStoreV1", "V1Keys"]

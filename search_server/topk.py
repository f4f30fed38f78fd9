"""How many hits to ask each shard for, so that the merged top ``k`` is still exact with a
given probability (:func:`hits_per_shard`, :func:`hits_asked`), which answers may have
made it inexact (:func:`inexact_shards`: the shards a query's second round asks again
for ``k``), and a query's own probability (:func:`parse_topk_probability`).

Vespa's dispatcher asks each of its partitions for fewer than ``k`` hits (its
"top-k probability", 0.9999 by default): with documents spread over the shards at
random, the number of the global top ``k`` that one shard holds is binomial, and rarely
far above its mean. Fewer hits asked is fewer bytes for every data server to encode and
send, and fewer for the search server to decode, validate and merge. Pure functions: no
I/O, no clock, no metrics.

Design: docs/design/search-server.md, "Fewer hits per shard".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from discovery.errors import BadRequestError
from discovery.http import parse_float

__all__ = [
    "SHARE_GRID",
    "TOPK_PROBABILITY",
    "hits_asked",
    "hits_per_shard",
    "inexact_shards",
    "parse_topk_probability",
]

#: The default of ``FanOutConfig.topk_probability`` (``--topk-probability``): Vespa's.
#: The merged top ``k`` is exact in at least this share of queries (documents spread at
#: random); 1 asks every shard for ``k``.
TOPK_PROBABILITY: Final = 0.9999

#: A shard's share of the documents is rounded up to a multiple of ``1 / SHARE_GRID``:
#: up, so that the bound stays conservative; to a grid, so that the shares of a cluster
#: whose shards hold a few documents more or less than each other fall on a few values
#: and the cache stays small. A power of two: ``units / SHARE_GRID`` is exact in floats.
SHARE_GRID: Final = 4096

# Distinct (k, share, shards, probability) remembered. A cluster's shares fall on a few
# grid points, k on a few values, probability on the configured one and those a client
# asks for: a few hundred in practice; bounded whatever clients send.
_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=_CACHE_SIZE)
def hits_per_shard(k: int, share: float, shards: int, probability: float) -> int:
    """The fewest hits (``k'``) to ask of a shard holding ``share`` of the documents of
    the ``shards`` asked, so that the merged top ``k`` is exact with at least
    ``probability`` when documents are spread over the shards at random.

    The number of the global top ``k`` that fall in the shard is Binomial(``k``,
    ``share``); the merge can miss one only when some shard holds more of them than it
    was asked for. ``k'`` is the smallest with P(Binomial(k, share) > k') <=
    (1 - ``probability``) / ``shards``: by the union bound over the shards, the chance
    that any shard holds more than it was asked for is then at most 1 - ``probability``,
    whatever the shares (each shard given its own ``k'``). The tail is the exact
    binomial one (summed in log space), not Vespa's per-partition Student-t
    approximation, and the bound is over the whole query rather than per partition:
    stronger on both counts. ``share`` is rounded up to a multiple of
    ``1 / SHARE_GRID`` first (conservative, and it keeps this cache small).

    Never more than ``k``, never below 1; ``probability`` 1, ``shards`` 0 or 1, or a
    ``share`` of 1 give ``k``. Cached (a bounded LRU): the tail costs up to ``k``
    terms, a query of many equal shards computes it once.

    Raises:
        ValueError: ``k`` below 1, ``share`` outside 0..1, ``shards`` below 0, or
            ``probability`` outside (0, 1].
    """
    _check(k, probability)
    if not 0 <= share <= 1:  # NaN too: it compares false
        raise ValueError(f"share must be in 0..1, got {share}")
    if shards < 0:
        raise ValueError(f"shards must be >= 0, got {shards}")
    units = math.ceil(share * SHARE_GRID)
    if probability == 1 or shards <= 1 or units >= SHARE_GRID or k == 1:
        return k
    return _smallest_cutoff(k, units, (1 - probability) / shards)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _smallest_cutoff(k: int, units: int, allowed: float) -> int:
    """The smallest ``j`` (at least 1) with P(Binomial(k, units / SHARE_GRID) > j) <=
    ``allowed``, for ``0 <= units < SHARE_GRID`` and ``allowed > 0``.

    The tail is summed from the top (``i = k`` down), smallest terms first, each term
    from log-gamma: no cancellation (``1 - cdf`` would lose the tail in rounding near
    ``allowed`` of 1e-9 and below) and no overflow of ``C(k, i)`` for ``k`` of 1000.
    A term below the smallest float counts as 0: far below any ``allowed``.
    """
    if units == 0:
        return 1  # a shard without documents holds none of the top k
    share = units / SHARE_GRID
    log_share, log_rest = math.log(share), math.log1p(-share)
    log_k_factorial = math.lgamma(k + 1)
    tail = 0.0
    for j in range(k - 1, 0, -1):
        i = j + 1  # tail(j) = P(X > j) = tail(j + 1) + P(X = j + 1)
        log_pmf = (
            log_k_factorial
            - math.lgamma(i + 1)
            - math.lgamma(k - i + 1)
            + i * log_share
            + (k - i) * log_rest
        )
        tail += math.exp(log_pmf)
        if tail > allowed:
            return j + 1
    return 1


def hits_asked(k: int, docs: Sequence[int], probability: float) -> list[int]:
    """The hits to ask each of the shards asked for (:func:`hits_per_shard`), given what
    each holds (``docs``, one count per shard, 0 where unknown), in their order.

    A shard's share is its documents over those of the shards asked that say how many
    they hold. When no shard says, every shard's share is ``1 / len(docs)`` (shards
    even, as a hash-partitioned corpus's are). When some say and some do not, those that
    do not are asked for ``k`` (nothing is known of them) and the others' shares leave
    the unknown documents out, which only raises them: the bound stays conservative.

    Raises:
        ValueError: as :func:`hits_per_shard` for ``k`` or ``probability``, or a
            negative count.
    """
    _check(k, probability)
    shards = len(docs)
    if probability == 1 or shards <= 1:
        return [k] * shards
    if any(count < 0 for count in docs):
        raise ValueError("document counts must be >= 0")
    known = sum(docs)
    if known == 0:
        return [hits_per_shard(k, 1 / shards, shards, probability)] * shards
    # Shares in whole grid units, rounded up in integers (exact), once per distinct count:
    # a cluster of equal shards looks its k' up once per query.
    by_count: dict[int, int] = {0: k}  # a shard that does not say: k
    asked: list[int] = []
    for count in docs:
        hits = by_count.get(count)
        if hits is None:
            units = -(-count * SHARE_GRID // known)
            hits = by_count[count] = hits_per_shard(k, units / SHARE_GRID, shards, probability)
        asked.append(hits)
    return asked


def _check(k: int, probability: float) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0 < probability <= 1:  # NaN too: it compares false
        raise ValueError(f"probability must be > 0 and <= 1, got {probability}")


def inexact_shards(
    answers: Iterable[tuple[int, int, int]], k: int, merged: Sequence[Mapping[str, Any]]
) -> list[int]:
    """The shards whose answer may have left a better hit out of the merged top ``k``.

    ``answers`` holds, per shard that answered, ``(shard, hits it returned, hits it was
    asked for)``; ``merged`` is the merged top ``k``, each hit with its ``shard``. A
    shard that returned all it was asked for, fewer than ``k``, and all of whose hits
    made it into the merged top ``k`` (its lowest-ranked one too: the merged top ``k``
    is a prefix of the ranking, so that is the same) may hold one more that belonged
    there: the merge may be inexact. When no shard is flagged, it is exact: every
    shard's next hit ranks below the merged ``k``-th. A flag is not a miss (the shard's
    next hit may rank lower); it is what can be told without asking again, and what a
    second round asks again (``Query._second_round``: with every flagged shard's top
    ``k``, the merge is exact). O(answers + ``k``): it reads the top ``k`` the merge
    made, and merges nothing.
    """
    in_top: dict[object, int] = {}
    for hit in merged:
        shard = hit.get("shard")
        in_top[shard] = in_top.get(shard, 0) + 1
    return [
        shard
        for shard, returned, asked in answers
        if returned == asked < k and in_top.get(shard, 0) == returned
    ]


def parse_topk_probability(raw: str | None, default: float) -> float:
    """A query's ``topk_probability`` parameter (``raw``; ``default`` when absent): a
    plain decimal above 0 and at most 1.

    Raises:
        BadRequestError: naming ``topk_probability`` (``not_number``, ``out_of_range``).
    """
    probability = parse_float("topk_probability", raw, default, 0.0, 1.0)
    if not probability > 0:
        # No hit asked of any shard would be no search: 0 promises nothing.
        raise BadRequestError(
            "topk_probability",
            "out_of_range",
            f"'topk_probability' must be above 0 and at most 1, got {probability:g}",
        )
    return probability

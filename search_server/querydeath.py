"""Queries of death: a query that fails on many shards every time is refused for a while.

:class:`QueryOfDeathGuard` counts a strike only while other queries go well; its memory
is bounded. Pure policy, no I/O: the clock is passed in; not thread-safe.

Design: docs/design/search-server.md, "Queries of death".
"""

from __future__ import annotations

import math
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from discovery.errors import ConfigError

__all__ = ["Quarantine", "QueryOfDeathConfig", "QueryOfDeathGuard", "normalise"]

_WORD: Final = re.compile(r"\w+")
# A key longer than this is cut: queries are at most 1,024 characters anyway, and the
# key is kept in memory per tracked query.
_MAX_KEY: Final = 1024
# Outcomes behind the "others" baseline: enough to be a fair sample, bounded memory.
_MAX_OUTCOMES: Final = 2048


def normalise(query: str) -> str:
    """The key of ``query``: its lower-cased word tokens, each once, sorted."""
    return " ".join(sorted(set(_WORD.findall(query.lower()))))[:_MAX_KEY]


@dataclass(frozen=True, slots=True)
class QueryOfDeathConfig:
    """The guard's thresholds (flags ``--qod-*`` of the search server).

    ``strikes`` 0 turns the guard off. Raises :class:`ConfigError` naming the flag of
    a value out of range.
    """

    shard_fraction: float = 0.5
    strikes: int = 3
    window: float = 60.0
    cooldown: float = 60.0
    max_cooldown: float = 600.0
    max_others_bad: float = 0.5
    min_others: int = 5
    max_tracked: int = 10_000

    def __post_init__(self) -> None:
        if not 0 < self.shard_fraction <= 1:
            raise ConfigError(f"--qod-shard-fraction must be in (0, 1], got {self.shard_fraction}")
        if self.strikes < 0:
            raise ConfigError(f"--qod-strikes must be >= 0, got {self.strikes}")
        if not self.window > 0:
            raise ConfigError(f"--qod-window must be positive, got {self.window}")
        if not self.cooldown > 0:
            raise ConfigError(f"--qod-cooldown must be positive, got {self.cooldown}")
        if self.max_cooldown < self.cooldown:
            raise ConfigError("the maximum cool-down must not be shorter than --qod-cooldown")
        if not 0 <= self.max_others_bad <= 1:
            raise ConfigError(f"max_others_bad must be in 0..1, got {self.max_others_bad}")
        if self.min_others < 0:
            raise ConfigError(f"min_others must be >= 0, got {self.min_others}")
        if self.max_tracked < 1:
            raise ConfigError(f"max_tracked must be >= 1, got {self.max_tracked}")

    @property
    def enabled(self) -> bool:
        return self.strikes > 0


@dataclass(frozen=True, slots=True)
class Quarantine:
    """Why a query is refused, and until when (the guard's clock)."""

    until: float
    strikes: int
    bad_shards: int
    total_shards: int

    def retry_after(self, now: float) -> int:
        """Whole seconds until the query is tried again (at least 1)."""
        return max(1, math.ceil(self.until - now))

    def message(self, now: float) -> str:
        return (
            f"query refused as a query of death: {self.strikes} recent fan-outs of it "
            f"failed, timed out or were cut on many shards (the last on {self.bad_shards} "
            f"of {self.total_shards}) while other queries did not; retry in "
            f"{self.retry_after(now)} s, or change the query"
        )


class _Record:
    """What the guard knows of one query."""

    __slots__ = ("cooldown", "quarantine", "strikes")

    def __init__(self) -> None:
        self.strikes: deque[float] = deque()
        self.quarantine: Quarantine | None = None
        # The next quarantine's length; doubled on probation, reset by a good fan-out.
        self.cooldown = 0.0


class QueryOfDeathGuard:
    """Decides, per query, whether to fan it out (:meth:`check`) and learns from how
    each fan-out went (:meth:`record`).

    ``on_quarantine`` is called with the key and its :class:`Quarantine` each time a
    query is quarantined (the search server logs and counts it).
    """

    def __init__(
        self,
        config: QueryOfDeathConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_quarantine: Callable[[str, Quarantine], None] | None = None,
    ) -> None:
        self.config = config if config is not None else QueryOfDeathConfig()
        self._clock = clock
        self._on_quarantine = on_quarantine
        self._records: OrderedDict[str, _Record] = OrderedDict()
        # Recent outcomes (time, key, bad), and their counts overall and per key, so
        # that "how did the other queries do" is O(1) per fan-out.
        self._outcomes: deque[tuple[float, str, bool]] = deque()
        self._count = 0
        self._bad = 0
        self._per_key: dict[str, list[int]] = {}

    @property
    def quarantined(self) -> int:
        """Queries refused right now."""
        now = self._clock()
        return sum(
            1
            for record in self._records.values()
            if record.quarantine is not None and record.quarantine.until > now
        )

    @property
    def tracked(self) -> int:
        return len(self._records)

    def check(self, key: str) -> Quarantine | None:
        """The quarantine ``key`` is in now, or None if it may be fanned out."""
        if not self.config.enabled:
            return None
        record = self._records.get(key)
        if record is None or record.quarantine is None:
            return None
        if record.quarantine.until > self._clock():
            return record.quarantine
        return None

    def record(self, key: str, total_shards: int, bad_shards: int) -> None:
        """Learn how one fan-out of ``key`` went: ``bad_shards`` of ``total_shards``
        failed, timed out or were cut."""
        config = self.config
        if not config.enabled or total_shards <= 0:
            return
        now = self._clock()
        bad = bad_shards >= max(2, math.ceil(config.shard_fraction * total_shards))
        self._expire_outcomes(now)
        others_bad = self._others_bad_share(key)
        self._add_outcome(now, key, bad)
        record = self._records.get(key)
        if record is None:
            if not bad:
                return  # only queries that went wrong are worth remembering
            record = self._track(key)
        else:
            self._records.move_to_end(key)
        if not bad:
            # A good fan-out ends a probation and forgives older strikes.
            record.strikes.clear()
            record.cooldown = 0.0
            if record.quarantine is not None and record.quarantine.until <= now:
                record.quarantine = None
            return
        if others_bad is None or others_bad > config.max_others_bad:
            return  # the cluster is failing, not this query (or nothing to compare with)
        strikes = record.strikes
        strikes.append(now)
        while strikes and strikes[0] <= now - config.window:
            strikes.popleft()
        probation = record.cooldown > 0
        if len(strikes) < config.strikes and not probation:
            return
        cooldown = min(config.max_cooldown, 2 * record.cooldown) if probation else config.cooldown
        record.cooldown = cooldown
        record.quarantine = Quarantine(now + cooldown, len(strikes), bad_shards, total_shards)
        strikes.clear()
        if self._on_quarantine is not None:
            self._on_quarantine(key, record.quarantine)

    # -- bookkeeping ------------------------------------------------------------------

    def _track(self, key: str) -> _Record:
        record = self._records[key] = _Record()
        while len(self._records) > self.config.max_tracked:
            self._records.popitem(last=False)
        return record

    def _add_outcome(self, now: float, key: str, bad: bool) -> None:
        self._outcomes.append((now, key, bad))
        self._count += 1
        self._bad += bad
        counts = self._per_key.setdefault(key, [0, 0])
        counts[0] += 1
        counts[1] += bad
        if len(self._outcomes) > _MAX_OUTCOMES:
            self._drop_oldest()

    def _expire_outcomes(self, now: float) -> None:
        horizon = now - self.config.window
        outcomes = self._outcomes
        while outcomes and outcomes[0][0] <= horizon:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, key, bad = self._outcomes.popleft()
        self._count -= 1
        self._bad -= bad
        counts = self._per_key[key]
        counts[0] -= 1
        counts[1] -= bad
        if counts[0] == 0:
            del self._per_key[key]

    def _others_bad_share(self, key: str) -> float | None:
        """The share of bad fan-outs among other queries of the window (None: fewer
        than ``min_others`` of them)."""
        own = self._per_key.get(key, (0, 0))
        count = self._count - own[0]
        if count < max(1, self.config.min_others):
            return None
        return (self._bad - own[1]) / count

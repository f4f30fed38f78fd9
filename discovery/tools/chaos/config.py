"""The settings of a chaos run, built once from the ``discovery chaos`` flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from discovery.errors import ConfigError
from discovery.livelist.redis.follower import RECONNECT_BACKOFF_MAX
from discovery.testing.netns import netns_available
from discovery.testing.sentinel import DEFAULT_DOWN_AFTER_MS

__all__ = ["FAILOVER_TARGET", "REDIS_REPLICAS", "SENTINEL_DOWN_AFTER_MS", "ChaosConfig"]

#: Replicas of the Redis primary in a run with ``--redis-sentinels``: two, so that one
#: failover still leaves a replica while the killed server rejoins.
REDIS_REPLICAS = 2
#: The sentinels' ``down-after-milliseconds``: how long a silent primary has before
#: they start a failover. The harness's default (2 s): 1 s made the sentinels fail
#: over the primary they had just promoted (see ``discovery.testing.sentinel``).
SENTINEL_DOWN_AFTER_MS = DEFAULT_DOWN_AFTER_MS
#: The issue's target for a failover: every reader holds the right list again within
#: ``down-after`` plus this.
FAILOVER_TARGET = 3.0


@dataclass(frozen=True)
class ChaosConfig:
    """What to run and how hard to push it.

    Attributes:
        duration: seconds of fault injection (start-up and the final check come on top).
        seed: the schedule's seed: the same seed gives the same faults, in the same order,
            on the same victims.
        data_servers / search_servers: process counts (each one its own process and
            ZooKeeper session, as in production).
        shards: data servers are spread over this many shards (two replicas each by
            default), so a query fans out to ``shards`` servers.
        rate: queries per second of the steady load, spread over the live search servers.
        deadline_ms: the ``timeout_ms`` of every query; invariant 1 allows 50 ms more.
        session_timeout: ZooKeeper session timeout of every process (the crash bound).
        probe_interval / fall / rise / probe_timeout: the agents' probe budget.
        heartbeat_interval: the leader's heartbeat (the Redis-recovery bound).
        partitions: put every data and search server in a network namespace of its
            own (:class:`~discovery.testing.netns.NetworkLab`) and inject link faults;
            without it only process and application faults run.
        redis_sentinels: 0 runs one Redis server; N >= 1 runs a primary with
            :data:`REDIS_REPLICAS` replicas and N sentinels (``down-after``
            :data:`SENTINEL_DOWN_AFTER_MS`), which every client reaches through the
            sentinel URL; the schedule then fails the primary over (``redis_failover``)
            where a single-Redis run restarts Redis empty.
        kinds: the fault kinds or categories to run (``--kinds``), in the seed's order;
            empty: every kind of the run's mode.
        workdir: where processes keep their logs (kept; a scratch directory if None).
        report: where the JSON report is written (None: not written).
    """

    duration: float = 600.0
    seed: int = 1
    data_servers: int = 30
    search_servers: int = 3
    shards: int = 15
    rate: float = 10.0
    deadline_ms: int = 500
    session_timeout: float = 5.0
    tick_time_ms: int = 100
    probe_interval: float = 0.5
    probe_timeout: float = 1.0
    fall: int = 3
    rise: int = 2
    heartbeat_interval: float = 0.5
    partitions: bool = True
    redis_sentinels: int = 0
    kinds: tuple[str, ...] = ()
    workdir: Path | None = None
    report: Path | None = None

    def __post_init__(self) -> None:
        if self.data_servers < self.shards:
            raise ConfigError(
                f"--data-servers ({self.data_servers}) must be at least --shards ({self.shards})"
            )
        if self.search_servers < 2:
            raise ConfigError(
                "--search-servers must be at least 2 (leader faults need a successor)"
            )
        if self.duration <= 0 or self.rate <= 0:
            raise ConfigError("--duration and --rate must be positive")
        if self.redis_sentinels < 0:
            raise ConfigError(
                f"--redis-sentinels must be 0 (one Redis server) or more, "
                f"got {self.redis_sentinels}"
            )
        if self.partitions:
            reason = netns_available()
            if reason is not None:
                raise ConfigError(f"--partitions: {reason} (or run with --no-partitions)")

    # -- the bounds each fault is judged by ---------------------------------------

    @property
    def probe_budget(self) -> float:
        """Seconds from a fault on a data server to its node leaving, at worst.

        Probes start one interval apart, or back to back when one takes longer than
        the interval: the fault can begin just after a good probe, the next starts
        within an interval, and then ``fall`` probes each take up to the probe timeout
        (a hung server) before the agent gives up.
        """
        return self.probe_interval + self.fall * max(self.probe_interval, self.probe_timeout)

    @property
    def rise_budget(self) -> float:
        return self.rise * self.probe_interval + self.probe_timeout

    @property
    def heartbeat_ttl(self) -> float:
        """The search servers' ``--heartbeat-ttl``: also how long a leader that cannot
        write to Redis keeps trying before it hands over."""
        return max(3.0, 4 * self.heartbeat_interval)

    @property
    def crash_bound(self) -> float:
        """A dead process's node goes when ZooKeeper expires its session: the timeout,
        rounded up to ZooKeeper's tick, plus the leader's propagation."""
        return self.session_timeout + self.tick_time_ms / 1000 + 1.0

    @property
    def sentinel_mode(self) -> bool:
        """Redis is a primary with replicas behind sentinels (``--redis-sentinels`` > 0)."""
        return self.redis_sentinels > 0

    @property
    def redis_failover_bound(self) -> float:
        """Seconds from a SIGKILL of the Redis primary until the list is readable again
        and every search server follows it.

        ``down-after`` (:data:`SENTINEL_DOWN_AFTER_MS`) plus the issue's 3 s target (the
        sentinels' agreement and promotion, then the readers' move: measured
        2.1-3.2 s from the kill by ``bench/bench_redis_failover.py``, 12 failovers),
        plus a slack for the two periodic loops a recovery waits on once the new
        primary answers: a reader may be sleeping its longest reconnect back-off
        (:data:`~discovery.livelist.redis.follower.RECONNECT_BACKOFF_MAX`, 0.5 s) and the leader
        probes a failing store at its heartbeat (``heartbeat_interval``, 0.5 s),
        republishing in full on its first success. 6 s with the defaults (the chaos
        runs of seed 7 with 1 s down-after converged in 2.55-2.75 s after the kill).
        """
        return (
            SENTINEL_DOWN_AFTER_MS / 1000
            + FAILOVER_TARGET
            + self.heartbeat_interval
            + RECONNECT_BACKOFF_MAX
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ChaosConfig:
        return cls(
            duration=args.duration,
            seed=args.seed,
            data_servers=args.data_servers,
            search_servers=args.search_servers,
            shards=args.shards or max(1, args.data_servers // 2),
            rate=args.rate,
            deadline_ms=args.deadline_ms,
            session_timeout=args.session_timeout,
            partitions=args.partitions,
            redis_sentinels=args.redis_sentinels,
            kinds=tuple(args.kinds),
            workdir=args.workdir,
            report=args.report,
        )

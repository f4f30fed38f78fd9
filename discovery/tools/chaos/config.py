"""The settings of a chaos run, built once from the ``discovery chaos`` flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from discovery.errors import ConfigError
from discovery.testing.netns import netns_available

__all__ = ["ChaosConfig"]


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
            workdir=args.workdir,
            report=args.report,
        )

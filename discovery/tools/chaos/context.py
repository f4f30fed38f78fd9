"""What every fault kind works with: the context of a run and the verdict of one step.

A fault kind is a coroutine taking a :class:`FaultContext`: the cluster's processes, the
observer (the model and the views), the run's settings and the seeded generator that
picks victims and durations. :meth:`FaultContext.converge` is the one verdict all
kinds share: after a step that changes what should be true, every view must equal the
model within the step's bound (see :mod:`.faults` for the bounds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from discovery.livelist.redis.follower import RECONNECT_BACKOFF_MAX

from .cluster import ChaosCluster, Member
from .config import ChaosConfig
from .observer import Observer, Snapshot
from .watch import HostileFigures

if TYPE_CHECKING:
    from .deploy import DeployFigures
    from .load import LoadGenerator

__all__ = [
    "RECOVERY_TIMEOUT",
    "START_BOUND",
    "FaultContext",
    "StepResult",
    "redis_bound",
]

log = logging.getLogger(__name__)

RECOVERY_TIMEOUT = 60.0
#: Process start-up (imports, index build, first good probes) on a loaded 2-core box.
START_BOUND = 25.0


@dataclass(frozen=True)
class StepResult:
    fault: str
    step: str
    bound: float
    took: float | None  # None: not within the bound
    detail: str = ""
    #: When the step was judged (wall clock, seconds): the soak plot's time axis.
    at: float = field(default_factory=time.time)


class FaultContext:
    """What a fault may use: the cluster, the observer, the seeded RNG, the verdicts."""

    def __init__(
        self, cluster: ChaosCluster, observer: Observer, config: ChaosConfig, rng: random.Random
    ) -> None:
        self.cluster = cluster
        self.observer = observer
        self.config = config
        self.rng = rng
        self.results: list[StepResult] = []
        self.skipped: dict[str, int] = {}
        #: What each hostile fault did (:mod:`.hostile`), in the order they ran.
        self.hostile: list[HostileFigures] = []
        #: What each deploy did (:mod:`.deploy`), in the order they ran.
        self.deploy: list[DeployFigures] = []
        #: The steady query load (set by the runner once it runs): a kind that states an
        #: outcome for the queries sent during it reads their counts here.
        self.load: LoadGenerator | None = None

    async def converge(
        self,
        fault: str,
        step: str,
        bound: float,
        predicate: Callable[[Snapshot], bool] | None = None,
    ) -> float | None:
        """Wait until all views equal the model (and ``predicate``) within ``bound``."""
        observer = self.observer
        since, model = observer.now(), frozenset(observer.model)

        def done(snapshot: Snapshot) -> bool:
            # Only a snapshot sampled after this step, against the model it set, counts:
            # the one before the fault would agree with the old model at once.
            return (
                snapshot.at >= since
                and snapshot.model == model
                and snapshot.converged
                and (predicate is None or predicate(snapshot))
            )

        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await observer.wait_for(done, bound)
        except TimeoutError:
            last = observer.last
            detail = last.describe() if last is not None else "no snapshot"
            observer.violate(
                "list equals truth within the fault's bound",
                f"{fault} {step}: not converged within {bound:.1f} s: {detail}",
            )
            # The model holds the servers that are healthy and can reach ZooKeeper: one
            # of them still without its node past the bound is a lost registration.
            lost = sorted(model - last.zk) if last is not None and last.zk is not None else []
            if lost:
                observer.violate(
                    "no registration is ever lost",
                    f"{fault} {step}: {lost} not registered within {bound:.1f} s",
                )
            self.results.append(StepResult(fault, step, bound, None, detail))
            try:
                await observer.wait_for(done, RECOVERY_TIMEOUT)
            except TimeoutError:
                log.error("%s %s: not converged after %gs more", fault, step, RECOVERY_TIMEOUT)
            return None
        took = loop.time() - started
        self.results.append(StepResult(fault, step, bound, took))
        log.info("%s %s: converged in %.2f s (bound %.1f s)", fault, step, took, bound)
        return took

    async def working(self, fault: str) -> float | None:
        """After ``fault``: the list right *and* a leader in office and publishing (a
        heartbeat stamped after the fault's end), within the crash bound plus a
        heartbeat, so that the next fault never starts on a cluster that cannot react.
        A list that is right while nobody could publish a change is not converged."""
        ended_ms = time.time() * 1000
        return await self.converge(
            fault,
            "a leader in office and publishing",
            self.config.crash_bound + self.config.heartbeat_interval,
            lambda s: s.leading_since(ended_ms),
        )

    async def hold(self, low: float, high: float) -> None:
        """Keep the fault in place for a seeded while: its duration is part of the test."""
        await asyncio.sleep(self.rng.uniform(low, high))

    def pick_data(self, count: int) -> list[Member]:
        candidates = sorted(
            name
            for name, member in self.cluster.data.items()
            if member.running and name in self.observer.model
        )
        return [self.cluster.data[name] for name in self.rng.sample(candidates, count)]

    def remove(self, members: list[Member]) -> None:
        self.observer.model.difference_update(m.name for m in members)

    def add(self, members: list[Member]) -> None:
        self.observer.model.update(m.name for m in members)

    @contextlib.asynccontextmanager
    async def probes_failing(
        self, members: list[Member], fault: dict[str, object] | None = None
    ) -> AsyncIterator[None]:
        """``members`` fail their probes for the block (``fault`` is the data server's
        ``/admin/fault`` body, every probe an error by default) and the model leaves them
        out; on leaving the block they pass again and the model expects them back.

        However the block ends: a fault kind that raises midway (a harness bug, reported
        by the runner) must not leave a data server failing its probes for the faults
        after it, whose model would expect it.
        """
        body = fault if fault is not None else {"mode": "error", "rate": 1.0}
        try:
            await asyncio.gather(*(self.cluster.admin(m, "fault", body) for m in members))
            self.remove(members)
            yield
        finally:
            await asyncio.gather(
                *(self.cluster.admin(m, "fault", {"mode": "none"}) for m in members)
            )
            self.add(members)


def redis_bound(config: ChaosConfig) -> float:
    """Seconds for the list to be readable and followed again after a Redis fault: a
    reader may be waiting out its reconnect back-off when Redis comes back; the leader
    republishes at its next heartbeat once ``P:meta`` is gone or not its own."""
    return RECONNECT_BACKOFF_MAX + 2 * config.heartbeat_interval + 1.0

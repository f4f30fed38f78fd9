"""One chaos run: start everything, inject seeded faults for ``duration``, judge, report.

The seed decides the faults and their victims, so a seed replays a run: one fault at a
time, and the cluster whole and working before the next.

Development: docs/development.md, "The chaos run" (the faults).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from discovery.errors import ConfigError

from .cluster import ChaosCluster
from .config import ChaosConfig
from .deploy import DeployFigures
from .ensemble import ensemble_whole
from .faults import CATEGORIES, FAULTS, START_BOUND, FaultContext, StepResult, kinds
from .load import LoadGenerator, LoadStats, cpu_jiffies
from .observer import Observer, Violation
from .watch import HostileFigures

__all__ = ["HOSTILE", "ChaosResult", "resolve_kinds", "run_chaos", "schedule"]

#: The category of bad participants (:mod:`.hostile`): the last of every turn.
HOSTILE = "hostile"
#: The category of rolling restarts (:mod:`.deploy`): the last of every round.
DEPLOY = "deploy"

log = logging.getLogger(__name__)

#: Everything registered, a leader elected, the list published and read, from cold.
SETUP_TIMEOUT = 120.0
FINAL_BOUND = 30.0


@dataclass
class ChaosResult:
    config: ChaosConfig
    started: bool
    elapsed: float = 0.0
    faults_run: list[str] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    load: LoadStats = field(default_factory=LoadStats)
    epochs: int = 0
    publishes: int = 0
    #: Writes of deposed leaders that the fence refused (from the search servers' logs,
    #: which outlive their restarts): the other half of invariant 3.
    fenced_writes: int = 0
    #: Share of the machine's CPU time the hypervisor took during the faults (0..1).
    cpu_steal: float = 0.0
    #: What each hostile fault did, in the order they ran.
    hostile: list[HostileFigures] = field(default_factory=list)
    #: What each deploy day did, in the order they ran.
    deploy: list[DeployFigures] = field(default_factory=list)
    setup_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.started and not self.violations


def schedule(
    seed: int,
    *,
    partitions: bool = True,
    sentinels: bool = False,
    only: Collection[str] | None = None,
) -> list[str]:
    """An endless-enough seeded order of fault kinds: rounds of every kind once, the
    categories interleaved (without ``partitions``, the partition kinds are left out),
    the hostile one last in each turn; with ``only``, just those kinds, in that order.

    The kinds are those of the Redis mode (:func:`~.faults.kinds`): with ``sentinels``
    the Redis restarts become failovers, in their places, so the same seed gives the
    same order in both modes but for those; a single-Redis schedule never holds a
    failover, nor a Sentinel one a restart. The hostile kinds are drawn from a
    generator of their own, so the other kinds come in the order the seed gave them
    before the hostile category existed. The deploy category (a whole rolling restart,
    the longest kind by far) ends each round, drawing nothing from either generator.
    """
    rng = random.Random(seed)
    hostile_rng = random.Random(f"{HOSTILE}:{seed}")
    categories = {
        name: kinds(name, sentinels=sentinels)
        for name in sorted(CATEGORIES)
        if name not in (HOSTILE, DEPLOY) and (partitions or name != "partition")
    }
    hostile = kinds(HOSTILE, sentinels=sentinels)
    deploy = kinds(DEPLOY, sentinels=sentinels)
    order: list[str] = []
    for _ in range(100):
        queues = {name: rng.sample(pool, len(pool)) for name, pool in categories.items()}
        turn = rng.sample(sorted(queues), len(queues))
        bad = hostile_rng.sample(hostile, len(hostile))
        while any(queues.values()) or bad:
            for name in turn:
                if queues[name]:
                    order.append(queues[name].pop())
            if bad:
                order.append(bad.pop())
        order += deploy
    if only is not None:
        order = [kind for kind in order if kind in only]
    return order


def resolve_kinds(
    names: Iterable[str], *, partitions: bool = True, sentinels: bool = False
) -> frozenset[str] | None:
    """The kinds that ``--kinds`` names (each a kind or a category: the category's kinds
    that this run's mode schedules), or None for every kind.

    Raises:
        ConfigError: naming the flag, for a name that is neither a kind nor a category,
            or a kind this run's mode cannot schedule.
    """
    available = set(schedule(0, partitions=partitions, sentinels=sentinels))
    names = list(names)
    chosen: set[str] = set()
    for name in names:
        if name in CATEGORIES:
            chosen.update(kind for kind in CATEGORIES[name] if kind in available)
        elif name not in FAULTS:
            raise ConfigError(
                f"--kinds: {name!r} is neither a fault kind nor a category "
                f"({', '.join(sorted(CATEGORIES))}; kinds: {', '.join(sorted(FAULTS))})"
            )
        elif name not in available:
            raise ConfigError(
                f"--kinds: {name} does not run in this mode (partition kinds need "
                "--partitions; redis_failover and its overlap need --redis-sentinels; the "
                "Redis restarts a single Redis)"
            )
        else:
            chosen.add(name)
    if names and not chosen:
        raise ConfigError(
            f"--kinds: no kind of {', '.join(names)} runs in this mode (partition kinds "
            "need --partitions)"
        )
    return frozenset(chosen) or None


async def run_chaos(config: ChaosConfig, workdir: Path) -> ChaosResult:
    """Run it; never raises for what happens to the cluster (that is the result)."""
    result = ChaosResult(config, started=False)
    cluster = ChaosCluster(config, workdir)
    observer: Observer | None = None
    load: LoadGenerator | None = None
    started = time.monotonic()
    try:
        await cluster.start()
        observer = Observer(cluster)
        await observer.start()
        setup = await observer.wait_converged(SETUP_TIMEOUT)
        if setup is None:
            last = observer.last
            result.setup_error = (
                f"not converged within {SETUP_TIMEOUT:g}s of start: "
                f"{last.describe() if last else 'no snapshot'}"
            )
            return result
        log.info("all %d data servers live everywhere after %.1f s", len(cluster.data), setup)
        result.started = True
        observer.violations.clear()  # start-up noise is not a verdict
        load = LoadGenerator(
            cluster, observer, rate=config.rate, deadline_ms=config.deadline_ms, seed=config.seed
        )
        await load.start()
        cpu_before = cpu_jiffies()
        ctx = FaultContext(cluster, observer, config, random.Random(config.seed))
        ctx.load = load
        deadline = time.monotonic() + config.duration
        only = resolve_kinds(
            config.kinds, partitions=config.partitions, sentinels=config.sentinel_mode
        )
        for kind in schedule(
            config.seed, partitions=config.partitions, sentinels=config.sentinel_mode, only=only
        ):
            if time.monotonic() >= deadline:
                break
            observer.fault = kind
            log.info("== fault %d: %s", len(result.faults_run) + 1, kind)
            result.faults_run.append(kind)
            try:
                await FAULTS[kind](ctx)
            except Exception as exc:  # a harness bug: reported, and the run goes on
                log.exception("fault %s failed", kind)
                observer.violate("fault ran to its end", f"{kind}: {type(exc).__name__}: {exc}")
            await ensemble_whole(ctx, kind)
            await ctx.working(kind)
            observer.fault = "between faults"
            await ctx.hold(0.5, 2.0)
        observer.fault = "final check"
        observer.model.update(cluster.data)
        await ctx.converge(
            "final",
            "every data server registered and serving",
            FINAL_BOUND + START_BOUND,
            lambda s: len(s.search) == len(cluster.search),
        )
        await ctx.working("final")
        result.steps = ctx.results
        result.skipped = ctx.skipped
        result.hostile = ctx.hostile
        result.deploy = ctx.deploy
        result.fenced_writes = _count_fenced_writes(cluster)
        cpu_after = cpu_jiffies()
        if cpu_before is not None and cpu_after is not None and cpu_after[0] > cpu_before[0]:
            result.cpu_steal = (cpu_after[1] - cpu_before[1]) / (cpu_after[0] - cpu_before[0])
    finally:
        if load is not None:
            await load.aclose()
            result.load = load.stats
        try:
            if observer is not None:
                result.violations = list(observer.violations)
                result.epochs = len(observer.epochs_seen)
                result.publishes = observer.publishes
                await observer.aclose()
        finally:
            await cluster.aclose()
        result.elapsed = time.monotonic() - started
    return result


def _count_fenced_writes(cluster: ChaosCluster) -> int:
    count = 0
    for member in cluster.search.values():
        try:
            text = member.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        # The publisher logs each refusal once (the election's traceback repeats it).
        count += sum(
            1
            for line in text.splitlines()
            if "discovery.livelist.redis.publisher" in line and " fence): Redis holds" in line
        )
    return count

"""``deploy_day``: a rolling restart of the whole cluster under load.

Every server stopped gracefully and started again: search servers one by one, data servers
in batches that never hold every replica of a shard. Stated outcome (:data:`INVARIANT`): no
query failed, fewer than 1 % partial.

Development: docs/development.md, "The chaos run" (deploy; invariant 11).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .cluster import DATA_DRAIN_GRACE, Member
from .context import START_BOUND, FaultContext
from .observer import Snapshot

__all__ = [
    "BATCH_SHARE",
    "INVARIANT",
    "KIND",
    "PARTIAL_LIMIT",
    "STOP_BOUND",
    "DeployFigures",
    "deploy_batches",
    "deploy_day",
    "drain_bound",
]

log = logging.getLogger(__name__)

KIND = "deploy_day"
#: The verdict of a deploy's queries, a line of the report's invariants.
INVARIANT = "deploy day: no failed query, partial answers under 1 %"
#: Share of the data servers restarted at once.
BATCH_SHARE = 0.1
#: Partial answers allowed, as a share of the deploy's queries (strictly less).
PARTIAL_LIMIT = 0.01
#: Seconds from SIGTERM to exit: a search server's drain grace (2 s) and its queries in
#: flight (a deadline), a data server's drain grace (1 s) and its shutdown, with room
#: for a loaded 2-core machine.
STOP_BOUND = 10.0
#: The observer samples every view every 0.2 s: a change is seen up to that late.
_SAMPLING = 0.2


def drain_bound() -> float:
    """Seconds for a draining data server to leave every view: its drain grace (the
    search servers must stop routing to it while it still answers), plus the
    observer's sampling."""
    return DATA_DRAIN_GRACE + _SAMPLING


@dataclass
class DeployFigures:
    """What one deploy did: the queries sent during it, and each step's seconds."""

    sent: int = 0
    complete: int = 0
    partial: int = 0
    failed: int = 0
    #: Queries the harness disturbed (must be 0: a graceful stop is none).
    disturbed: int = 0
    search_restarts: int = 0
    batches: int = 0
    batch_size: int = 0
    #: Seconds from SIGTERM to exit, worst of the search servers and of the data servers.
    worst_stop_search_s: float = 0.0
    worst_stop_data_s: float = 0.0
    seconds: float = 0.0
    #: ``step: seconds`` (None: not converged within its bound), in order.
    steps: list[tuple[str, float | None]] = field(default_factory=list)

    @property
    def partial_share(self) -> float:
        return self.partial / self.sent if self.sent else 0.0

    def problems(self) -> list[str]:
        """What breaks the stated outcome (empty: it held)."""
        found = []
        if self.sent == 0:
            found.append("no query was sent during the deploy, nothing was judged")
        if self.failed:
            found.append(f"{self.failed} of {self.sent} queries failed")
        if self.sent and self.partial_share >= PARTIAL_LIMIT:
            found.append(
                f"{self.partial} of {self.sent} answers partial "
                f"({self.partial_share * 100:.2f} %, limit {PARTIAL_LIMIT * 100:g} %)"
            )
        if self.disturbed:
            found.append(f"{self.disturbed} queries disturbed by the harness (not judged)")
        return found


def deploy_batches(members: Sequence[tuple[str, int]], size: int) -> list[list[str]]:
    """Batches of at most ``size`` data servers (``(name, shard)`` pairs) that together
    hold each once, such that no batch holds every replica of a shard: while one batch
    is down, every shard keeps a replica serving.

    Replicas are taken replica by replica (each shard's first, then each shard's
    second, ...), so consecutive servers are of different shards; a server goes into
    the first batch with room that still leaves its shard a replica outside, else into
    a new one. A shard with a single replica cannot keep one while that replica
    restarts: it is the only shard a batch may take down.
    """
    if size < 1:
        raise ValueError(f"batch size must be at least 1, got {size}")
    replicas = Counter(shard for _, shard in members)
    rank: Counter[int] = Counter()
    ordered: list[tuple[int, int, str]] = []
    for name, shard in sorted(members):
        ordered.append((rank[shard], shard, name))
        rank[shard] += 1
    batches: list[list[str]] = []
    shards_in: list[Counter[int]] = []
    for _, shard, name in sorted(ordered):
        for batch, held in zip(batches, shards_in, strict=True):
            if len(batch) < size and held[shard] + 1 < replicas[shard]:
                batch.append(name)
                held[shard] += 1
                break
        else:
            batches.append([name])
            shards_in.append(Counter({shard: 1}))
    return batches


async def deploy_day(ctx: FaultContext) -> None:
    """Restart every search server one by one, then drain and restart the data servers
    in batches, all gracefully under load: no query may fail, fewer than 1 % partial."""
    load = ctx.load
    figures = DeployFigures()
    stats = load.stats if load is not None else None
    before = dict(stats.by_fault.get(KIND, {})) if stats is not None else {}
    disturbed_before = stats.disturbed if stats is not None else 0
    steps_before = len(ctx.results)
    loop = asyncio.get_running_loop()
    started = loop.time()

    for name in sorted(ctx.cluster.search):
        member = ctx.cluster.search[name]
        if not member.running:
            continue
        took = await _stop(ctx, member)
        if took is not None:
            figures.worst_stop_search_s = max(figures.worst_stop_search_s, took)
        await ctx.cluster.restart(member)
        figures.search_restarts += 1
        await ctx.converge(KIND, f"{name} restarted and ready", START_BOUND, _ready(member))
        await ctx.working(KIND)

    candidates = [
        (name, int(member.extra["shard"]))
        for name, member in sorted(ctx.cluster.data.items())
        if member.running and name in ctx.observer.model
    ]
    size = max(1, math.floor(len(candidates) * BATCH_SHARE))
    batches = deploy_batches(candidates, size)
    figures.batches, figures.batch_size = len(batches), size
    log.info("deploy_day: %d data servers in %d batches of %d", len(candidates), len(batches), size)
    for number, batch in enumerate(batches, 1):
        victims = [ctx.cluster.data[name] for name in batch]
        label = f"batch {number}/{len(batches)}"
        stops = [asyncio.create_task(_stop(ctx, member)) for member in victims]
        ctx.remove(victims)
        await ctx.converge(KIND, f"{label} drained", drain_bound())
        for took in await asyncio.gather(*stops):
            if took is not None:
                figures.worst_stop_data_s = max(figures.worst_stop_data_s, took)
        await asyncio.gather(*(ctx.cluster.restart(member) for member in victims))
        ctx.add(victims)
        await ctx.converge(KIND, f"{label} restarted", START_BOUND)

    figures.seconds = loop.time() - started
    figures.steps = [(r.step, r.took) for r in ctx.results[steps_before:]]
    if load is not None and stats is not None:
        # Every query sent so far has ended (and been counted) within its deadline and
        # the client's own timeout.
        await load.settle(ctx.config.deadline_ms / 1000 + 10.0)
        after = stats.by_fault.get(KIND, {})
        figures.complete = after.get("complete", 0) - before.get("complete", 0)
        figures.partial = after.get("partial", 0) - before.get("partial", 0)
        figures.failed = after.get("failed", 0) - before.get("failed", 0)
        figures.sent = figures.complete + figures.partial + figures.failed
        figures.disturbed = stats.disturbed - disturbed_before
    ctx.deploy.append(figures)
    log.info(
        "deploy_day: %d queries, %d complete, %d partial, %d failed, %d disturbed in %.1f s",
        figures.sent,
        figures.complete,
        figures.partial,
        figures.failed,
        figures.disturbed,
        figures.seconds,
    )
    for problem in figures.problems():
        ctx.observer.violate(INVARIANT, problem)


def _ready(member: Member) -> Callable[[Snapshot], bool]:
    """Its list equals the model (the converge's own test) and it answers ``/readyz``."""
    return lambda snapshot: member.name in snapshot.search and member.ready


async def _stop(ctx: FaultContext, member: Member) -> float | None:
    """Stop ``member`` gracefully; a violation if it did not exit within the bound."""
    took = await ctx.cluster.stop_gracefully(member, STOP_BOUND)
    if took is None:
        ctx.observer.violate(
            INVARIANT, f"{member.name} did not exit within {STOP_BOUND:g} s of SIGTERM (killed)"
        )
    else:
        log.info("deploy_day: %s exited %.2f s after SIGTERM", member.name, took)
    return took

"""The end of a chaos run: a table per fault kind, the invariants, and the JSON record."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from discovery.safetext import escape_controls

from . import deploy, watch
from .config import REDIS_REPLICAS
from .runner import ChaosResult
from .watch import MIB, HostileFigures, nearest_rank

__all__ = ["hostile_table", "render", "to_json", "write_json"]

INVARIANTS = (
    "query within deadline + 50 ms",
    "list equals truth within the fault's bound",
    "epoch never decreases",
    "a cut-off leader is silent before its session can expire",
    "no registration is ever lost",
    watch.SHARDS,
    watch.MEMORY,
    watch.OFFLINE,
    watch.LISTS,
    watch.STORM,
    watch.SKIPPED,
    watch.CRASH,
    watch.HITS,
    watch.FRESH,
    deploy.INVARIANT,
)


def hostile_table(figures: list[HostileFigures]) -> dict[str, dict[str, Any]]:
    """Per hostile kind, over every fault of it: the normal load's answers, their p99
    and max latency, the most shards one answer missed, the largest rise of a search
    server's memory, the healthy data servers lost, and each fault's own notes."""
    table: dict[str, dict[str, Any]] = {}
    latencies: dict[str, list[float]] = defaultdict(list)
    for figure in figures:
        row = table.setdefault(
            figure.kind,
            {
                "count": 0,
                "complete": 0,
                "partial": 0,
                "failed": 0,
                "max_missing_shards": 0,
                "rss_peak_delta_mib": None,
                "servers_lost": [],
                "notes": [],
            },
        )
        row["count"] += 1
        row["complete"] += figure.complete
        row["partial"] += figure.partial
        row["failed"] += figure.failed
        row["max_missing_shards"] = max(row["max_missing_shards"], figure.max_missing)
        if figure.rss_peak_delta is not None:
            delta = round(figure.rss_peak_delta / MIB, 1)
            previous = row["rss_peak_delta_mib"]
            row["rss_peak_delta_mib"] = delta if previous is None else max(previous, delta)
        row["servers_lost"] = sorted({*row["servers_lost"], *figure.servers_lost})
        row["notes"].append(figure.notes)
        latencies[figure.kind] += figure.latencies_ms
    for kind, row in table.items():
        row["p99_ms"] = round(nearest_rank(latencies[kind], 0.99), 1)
        row["max_ms"] = round(max(latencies[kind], default=0.0), 1)
    return dict(sorted(table.items()))


def _render_hostile(result: ChaosResult) -> list[str]:
    table = hostile_table(result.hostile)
    if not table:
        return []
    header = (
        f"{'hostile fault':<22} {'count':>5} {'queries':>8} {'complete':>8} {'partial':>8} "
        f"{'failed':>6} {'max missing':>11} {'p99 ms':>7} {'max ms':>7} "
        f"{'RSS +MiB':>8} {'DS lost':>7}"
    )
    lines = ["", header, "-" * len(header)]
    for kind, row in table.items():
        queries = row["complete"] + row["partial"] + row["failed"]
        rss = row["rss_peak_delta_mib"]
        lines.append(
            f"{kind:<22} {row['count']:>5} {queries:>8} {row['complete']:>8} "
            f"{row['partial']:>8} {row['failed']:>6} {row['max_missing_shards']:>11} "
            f"{row['p99_ms']:>7.0f} {row['max_ms']:>7.0f} "
            f"{'-' if rss is None else f'{rss:.1f}':>8} {len(row['servers_lost']):>7}"
        )
    lines.append(
        f"(memory bound: +{watch.RSS_BOUND / MIB:.0f} MiB per search server over its "
        "value when the fault began; notes per fault in the JSON report)"
    )
    for kind, row in table.items():
        for note in row["notes"]:
            if note:
                lines.append(f"  {kind}: " + ", ".join(f"{k} {v}" for k, v in note.items()))
    return lines


def _render_deploy(result: ChaosResult) -> list[str]:
    """One line per deploy day: its queries against the stated outcome, and its steps."""
    if not result.deploy:
        return []
    lines = [""]
    for number, figures in enumerate(result.deploy, 1):
        lines.append(
            f"deploy day {number}: {figures.search_restarts} search servers restarted one by "
            f"one, then {figures.batches} batches of {figures.batch_size} data servers, in "
            f"{figures.seconds:.0f} s; queries {figures.sent}: {figures.complete} complete, "
            f"{figures.partial} partial ({figures.partial_share * 100:.2f} %), "
            f"{figures.failed} failed, {figures.disturbed} disturbed; exit after SIGTERM at "
            f"worst {figures.worst_stop_search_s:.1f} s (search), "
            f"{figures.worst_stop_data_s:.1f} s (data)"
        )
        # The worst of each kind of step (every step is in the JSON report).
        worst: dict[str, float] = {}
        for step, took in figures.steps:
            what = re.sub(r"^search-\S+", "search server", re.sub(r"^batch \S+", "batch", step))
            worst[what] = max(worst.get(what, 0.0), float("inf") if took is None else took)
        lines.append(
            "  worst step: "
            + ", ".join(
                f"{what} {'never' if took == float('inf') else f'{took:.2f} s'}"
                for what, took in worst.items()
            )
        )
    return lines


def _per_kind(result: ChaosResult) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"count": 0, "worst_s": 0.0, "worst_ratio": 0.0, "violations": 0, "skipped": 0}
    )
    for kind in result.faults_run:
        table[kind]["count"] += 1
    for kind in result.load.by_fault:
        table[kind]  # a row for the quiet periods too: their queries are judged as well
    for kind, n in result.skipped.items():
        table[kind]["skipped"] += n
    for step in result.steps:
        row = table[step.fault]
        took = step.took if step.took is not None else float("inf")
        if took / step.bound > row["worst_ratio"]:
            row["worst_ratio"] = took / step.bound
            row["worst_s"] = took
            row["worst_step"] = f"{step.step} (bound {step.bound:.1f} s)"
    for violation in result.violations:
        # Violations between faults or at the final check get rows of their own.
        table[violation.fault]["violations"] += 1
    return dict(table)


def render(result: ChaosResult) -> str:
    """The human report: what ran, per-kind figures, invariant verdicts, violations."""
    config = result.config
    redis = (
        f"Redis primary + {REDIS_REPLICAS} replicas + {config.redis_sentinels} sentinels"
        if config.sentinel_mode
        else "Redis"
    )
    lines = [
        f"chaos run: seed {config.seed}, {config.data_servers} data servers, "
        f"{config.search_servers} search servers, 3 ZooKeeper servers, {redis}; "
        f"{config.rate:g} q/s, deadline {config.deadline_ms} ms, "
        f"session timeout {config.session_timeout:g} s; {result.elapsed:.0f} s in all",
        "(data servers and ZooKeeper at nice 10: on this one machine they stand in for "
        f"other machines); CPU stolen by the hypervisor meanwhile: {result.cpu_steal * 100:.1f}%",
    ]
    if not result.started:
        lines.append(f"SETUP FAILED: {result.setup_error}")
        return _joined(lines)
    lines.append("")
    rows = sorted(_per_kind(result).items())
    # As wide as the longest kind's name (overlap_redis_failover_during_leader_change).
    width = max([42, *(len(kind) for kind, _ in rows)])
    header = (
        f"{'fault':<{width}} {'count':>5} {'worst convergence':>24} {'violations':>10} "
        f"{'queries':>8} {'partial':>8} {'failed':>7} {'max ms':>7}"
    )
    lines += [header, "-" * len(header)]
    for kind, row in rows:
        worst = "-"
        if row.get("worst_step"):
            worst = (
                "never"
                if row["worst_s"] == float("inf")
                else f"{row['worst_s']:.2f} s ({row['worst_ratio'] * 100:.0f}% of bound)"
            )
        count = f"{row['count']}" + (f" ({row['skipped']} skipped)" if row["skipped"] else "")
        outcomes = result.load.by_fault.get(kind, {})
        sent = sum(outcomes.values())
        max_ms = result.load.max_ms_by_fault.get(kind, 0.0)
        lines.append(
            f"{kind:<{width}} {count:>5} {worst:>24} {row['violations']:>10} {sent:>8} "
            f"{outcomes.get('partial', 0):>8} {outcomes.get('failed', 0):>7} {max_ms:>7.0f}"
        )
    load = result.load
    lines += [
        "",
        f"queries: {load.sent} sent, {load.complete} complete, {load.partial} partial, "
        f"{load.failed} failed, {load.disturbed} disturbed by the harness "
        f"(missing shards: {load.shards_failed} failed, {load.shards_timed_out} timed out, "
        f"{load.shards_cut} cut); "
        f"p50 {load.percentile(0.5):.0f} ms, p99 {load.percentile(0.99):.0f} ms, "
        f"max {load.max_ms:.0f} ms",
        f"publishes seen: {result.publishes} in {result.epochs} epochs; writes of deposed "
        f"leaders refused by the fence: {result.fenced_writes}",
        *_render_hostile(result),
        *_render_deploy(result),
        "",
    ]
    by_invariant: dict[str, int] = defaultdict(int)
    for violation in result.violations:
        by_invariant[violation.invariant] += 1
    for invariant in INVARIANTS:
        verdict = "ok" if not by_invariant.get(invariant) else f"{by_invariant[invariant]} VIOLATED"
        lines.append(f"  {invariant:<58} {verdict}")
    for invariant, n in sorted(by_invariant.items()):
        if invariant not in INVARIANTS:
            lines.append(f"  {invariant:<58} {n} VIOLATED")
    if result.violations:
        lines += ["", "violations:"]
        lines += [
            f"  t={v.at:7.1f}s [{v.fault}] {v.invariant}: {v.detail}" for v in result.violations
        ]
    lines += ["", "RESULT: " + ("PASS" if result.ok else "FAIL")]
    return _joined(lines)


def _joined(lines: list[str]) -> str:
    # A violation's detail or a setup error may quote what a hostile peer or a server
    # answered: each line escaped, so none can steer the terminal or add lines.
    return "\n".join(escape_controls(line) for line in lines)


def to_json(result: ChaosResult) -> dict[str, Any]:
    config = result.config
    load = result.load
    return {
        "config": {
            "seed": config.seed,
            "duration_s": config.duration,
            "data_servers": config.data_servers,
            "search_servers": config.search_servers,
            "rate": config.rate,
            "deadline_ms": config.deadline_ms,
            "session_timeout_s": config.session_timeout,
            "redis_sentinels": config.redis_sentinels,
            "kinds": list(config.kinds),
            "redis_replicas": REDIS_REPLICAS if config.sentinel_mode else 0,
        },
        "ok": result.ok,
        "started": result.started,
        "setup_error": result.setup_error,
        "elapsed_s": round(result.elapsed, 1),
        "faults": _per_kind(result),
        "steps": [
            {
                "fault": s.fault,
                "step": s.step,
                "bound_s": s.bound,
                "took_s": s.took,
                "at": round(s.at, 3),
            }
            for s in result.steps
        ],
        "queries": {
            "sent": load.sent,
            "complete": load.complete,
            "partial": load.partial,
            "failed": load.failed,
            "disturbed": load.disturbed,
            "over_deadline": load.over_deadline,
            "shards_failed": load.shards_failed,
            "shards_timed_out": load.shards_timed_out,
            "shards_cut": load.shards_cut,
            "p50_ms": round(load.percentile(0.5), 1),
            "p99_ms": round(load.percentile(0.99), 1),
            "max_ms": round(load.max_ms, 1),
            "by_fault": load.by_fault,
            "max_ms_by_fault": {k: round(v, 1) for k, v in load.max_ms_by_fault.items()},
            # [interval start (wall clock, s), complete, partial, failed], in time order.
            "timeline": [
                [start, c["complete"], c["partial"], c["failed"]]
                for start, c in sorted(load.timeline.items())
            ],
        },
        "publishes": result.publishes,
        "fenced_writes": result.fenced_writes,
        "cpu_steal_share": round(result.cpu_steal, 4),
        "epochs": result.epochs,
        "hostile": hostile_table(result.hostile),
        "hostile_faults": [
            {
                "kind": f.kind,
                "complete": f.complete,
                "partial": f.partial,
                "failed": f.failed,
                "p99_ms": f.p99_ms,
                "max_ms": f.max_ms,
                "max_missing_shards": f.max_missing,
                "rss_peak_delta_mib": (
                    None if f.rss_peak_delta is None else round(f.rss_peak_delta / MIB, 1)
                ),
                "servers_lost": f.servers_lost,
                "notes": f.notes,
            }
            for f in result.hostile
        ],
        "deploy": [
            {
                "sent": f.sent,
                "complete": f.complete,
                "partial": f.partial,
                "failed": f.failed,
                "disturbed": f.disturbed,
                "partial_share": round(f.partial_share, 5),
                "search_restarts": f.search_restarts,
                "batches": f.batches,
                "batch_size": f.batch_size,
                "worst_stop_search_s": round(f.worst_stop_search_s, 2),
                "worst_stop_data_s": round(f.worst_stop_data_s, 2),
                "seconds": round(f.seconds, 1),
                "steps": [
                    {"step": step, "took_s": None if took is None else round(took, 2)}
                    for step, took in f.steps
                ],
            }
            for f in result.deploy
        ],
        "violations": [v.__dict__ for v in result.violations],
    }


def write_json(result: ChaosResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = to_json(result)
    # inf is not JSON; a step that never converged has took_s null already.
    for row in record["faults"].values():
        if row["worst_s"] == float("inf"):
            row["worst_s"] = None
            row["worst_ratio"] = None
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

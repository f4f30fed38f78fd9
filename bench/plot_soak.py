"""Plot a chaos run's report over time: queries, partial answers, list convergence.

Usage: ``python bench/plot_soak.py REPORT.json [REPORT.json ...] --out PNG``

One column per report (``make soak`` writes ``bench/results/soak-<seed>.json`` and
plots them all), three rows:

1. queries answered per 10 s interval (complete, partial, failed), by when they were
   sent;
2. partial and failed answers as a share of each interval's queries (the issue's bar:
   partial under 1 %, none failed, is the dashed line);
3. each convergence step (every fault's steps, the final check included): how long it
   took as a share of its bound, so 1.0 is the bound and a miss is a red cross at 1.1.

Reads only the report (``timeline`` and ``steps[].at``, written since issue 23), and
prints a markdown table row per report (the soak table of ``docs/BENCHMARKS.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a build machine
import matplotlib.pyplot as plt  # after choosing the backend

MISSED = 1.1


def _minutes(report: dict[str, Any]) -> tuple[float, list[list[float]]]:
    timeline = report["queries"].get("timeline")
    if not timeline:
        raise SystemExit("the report has no query timeline (written since issue 23)")
    return float(timeline[0][0]), timeline


def plot(reports: list[tuple[str, dict[str, Any]]], out: Path) -> None:
    columns = len(reports)
    figure, axes = plt.subplots(3, columns, figsize=(7 * columns, 9), sharex="col", squeeze=False)
    for column, (name, report) in enumerate(reports):
        origin, timeline = _minutes(report)
        at = [(row[0] - origin) / 60 for row in timeline]
        complete = [row[1] for row in timeline]
        partial = [row[2] for row in timeline]
        failed = [row[3] for row in timeline]
        total = [c + p + f for c, p, f in zip(complete, partial, failed, strict=True)]
        width = (timeline[1][0] - timeline[0][0]) / 60 if len(timeline) > 1 else 1 / 6

        queries = axes[0][column]
        queries.bar(at, complete, width=width, align="edge", color="#4c9a2a", label="complete")
        queries.bar(
            at,
            partial,
            width=width,
            align="edge",
            bottom=complete,
            color="#e8a33d",
            label="partial",
        )
        queries.bar(
            at,
            failed,
            width=width,
            align="edge",
            bottom=[c + p for c, p in zip(complete, partial, strict=True)],
            color="#c0392b",
            label="failed",
        )
        config = report["config"]
        mode = "Sentinel" if config.get("redis_sentinels") else "single Redis"
        q = report["queries"]
        queries.set_title(
            f"{name}: seed {config['seed']}, {config['duration_s'] / 60:.0f} min, {mode}\n"
            f"{q['sent']} queries, {q['partial']} partial, {q['failed']} failed; "
            f"{len(report['violations'])} violations"
        )
        queries.set_ylabel("queries per interval")
        queries.legend(loc="lower right")

        shares = axes[1][column]
        shares.plot(
            at,
            [100 * p / t if t else 0 for p, t in zip(partial, total, strict=True)],
            color="#e8a33d",
            label="partial",
        )
        shares.plot(
            at,
            [100 * f / t if t else 0 for f, t in zip(failed, total, strict=True)],
            color="#c0392b",
            label="failed",
        )
        shares.axhline(1.0, linestyle="--", color="grey", linewidth=0.8)
        shares.set_ylabel("% of the interval's queries")
        shares.legend(loc="upper right")

        steps = axes[2][column]
        met = [(s["at"], s["took_s"] / s["bound_s"]) for s in report["steps"] if s["took_s"]]
        missed = [s["at"] for s in report["steps"] if s["took_s"] is None]
        steps.scatter(
            [(t - origin) / 60 for t, _ in met],
            [r for _, r in met],
            s=8,
            color="#2c6fbb",
            label=f"{len(met)} steps converged",
        )
        if missed:
            steps.scatter(
                [(t - origin) / 60 for t in missed],
                [MISSED] * len(missed),
                marker="x",
                color="#c0392b",
                label=f"{len(missed)} not within the bound",
            )
        steps.axhline(1.0, linestyle="--", color="grey", linewidth=0.8)
        # Headroom for a one-row legend above the misses, which it would hide.
        steps.set_ylim(0, 1.5)
        steps.set_ylabel("convergence / its bound")
        steps.set_xlabel("minutes into the run")
        steps.legend(loc="upper left", ncol=2)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=90)
    print(f"wrote {out}")


def table(reports: list[tuple[str, dict[str, Any]]]) -> str:
    """A markdown row per report: the soak table of docs/BENCHMARKS.md."""
    rows = [
        "| report | seed | minutes | faults (kinds) | skipped | queries | partial | failed "
        "| worst step / bound | violations |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, report in reports:
        faults = report["faults"]
        count = sum(f["count"] for f in faults.values())
        skipped = sum(f.get("skipped", 0) for f in faults.values())
        real = {k: f for k, f in faults.items() if f["count"]}
        worst = max(real.items(), key=lambda kv: kv[1]["worst_ratio"] or 0.0, default=None)
        worst_text = (
            f"{worst[1]['worst_ratio'] * 100:.0f} % ({worst[0]})" if worst is not None else "-"
        )
        q = report["queries"]
        share = 100 * q["partial"] / q["sent"] if q["sent"] else 0.0
        rows.append(
            f"| {name} | {report['config']['seed']} | {report['elapsed_s'] / 60:.1f} "
            f"| {count} ({len(real)}) | {skipped} | {q['sent']} | {q['partial']} ({share:.2f} %) "
            f"| {q['failed']} | {worst_text} | {len(report['violations'])} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="chaos report JSON files")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    reports = []
    for path in args.reports:
        try:
            reports.append((path.stem, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as exc:
            print(f"plot_soak: {path}: {exc}", file=sys.stderr)
            return 2
    plot(reports, args.out)
    print(table(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())

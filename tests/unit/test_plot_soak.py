"""bench/plot_soak.py: the soak's plot and table, from a report as the chaos run writes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import REPO_ROOT

ROOT = REPO_ROOT
SCRIPT = ROOT / "bench" / "plot_soak.py"


def _report(seed: int, *, missed: bool) -> dict[str, object]:
    start = 1_800_000_000
    steps = [
        {"fault": "zk_leader_pause", "step": "re-elected", "bound_s": 12.6, "took_s": 10.2,
         "at": start + 15.0},
        {"fault": "redis_refuses_writes", "step": "published again", "bound_s": 3.5,
         "took_s": None if missed else 0.4, "at": start + 25.0},
    ]  # fmt: skip
    return {
        "config": {"seed": seed, "duration_s": 60.0, "redis_sentinels": 0},
        "elapsed_s": 75.0,
        "faults": {
            "zk_leader_pause": {"count": 1, "worst_ratio": 0.81, "skipped": 0},
            "redis_refuses_writes": {"count": 2, "worst_ratio": 0.11, "skipped": 1},
        },
        "steps": steps,
        "queries": {
            "sent": 300,
            "partial": 3,
            "failed": 0,
            "timeline": [[start, 100, 0, 0], [start + 10, 97, 3, 0], [start + 20, 100, 0, 0]],
        },
        "violations": [{"invariant": "x", "detail": "y"}] if missed else [],
    }


def test_plots_every_report_and_prints_a_row_each(tmp_path: Path) -> None:
    reports = []
    for seed, missed in ((23, False), (37, True)):
        path = tmp_path / f"soak-{seed}.json"
        path.write_text(json.dumps(_report(seed, missed=missed)), encoding="utf-8")
        reports.append(str(path))
    out = tmp_path / "soak.png"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *reports, "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.read_bytes().startswith(b"\x89PNG")
    rows = [line for line in done.stdout.splitlines() if line.startswith("| soak-")]
    assert rows == [
        "| soak-23 | 23 | 1.2 | 3 (2) | 1 | 300 | 3 (1.00 %) | 0 | 81 % (zk_leader_pause) | 0 |",
        "| soak-37 | 37 | 1.2 | 3 (2) | 1 | 300 | 3 (1.00 %) | 0 | 81 % (zk_leader_pause) | 1 |",
    ]


def test_a_report_without_a_timeline_is_refused_by_name(tmp_path: Path) -> None:
    report = _report(5, missed=False)
    del report["queries"]["timeline"]  # type: ignore[attr-defined]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(report), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), "--out", str(tmp_path / "x.png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "no query timeline" in done.stderr
    assert not (tmp_path / "x.png").exists()

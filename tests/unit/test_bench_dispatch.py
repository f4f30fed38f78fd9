"""bench/bench_dispatch.py at a tiny scale: every policy this tree has is run in every
phase (the others are said to be pending), the figures hold their invariants, and a
replay of the saved trace gives the same figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "bench_dispatch.py"
POLICIES = ("oracle", "rr", "p2c", "ars", "ours", "ours-wrr", "ours-groups")
PHASES = ("baseline", "slow", "turns", "restart")
QUERIES = 300
TINY = ("--shards", "4", "--queries", str(QUERIES), "--warmup", "60", "--jobs", "1")


def _bench(out: Path, *argv: str) -> dict[str, Any]:
    subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, "--out-dir", str(out), *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    label = argv[argv.index("--label") + 1]
    result: dict[str, Any] = json.loads((out / f"dispatch-{label}.json").read_text())
    return result


def _rows(record: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["policy"], r["phase"]): r for r in record["rows"] if "phase" in r}


def test_a_tiny_run_has_every_policy_and_phase_and_replays_the_same(tmp_path: Path) -> None:
    record = _bench(
        tmp_path, "--docs", "500", "--trace-queries", "40", "--repeats", "1", "--label", "tiny"
    )
    rows = _rows(record)
    skipped = record["skipped"]
    for policy in POLICIES:
        if policy in skipped:
            # Only the policies another change brings may be missing, and say so.
            assert policy in ("ours-wrr", "ours-groups")
            assert skipped[policy].startswith("pending")
        else:
            assert {phase for (p, phase) in rows if p == policy} == set(PHASES)
    for (policy, phase), row in rows.items():
        assert row["queries"] + row["refused"] == QUERIES
        assert row["first_requests"] == 4 * row["queries"]  # every shard asked
        assert row["sub_requests"] >= row["first_requests"]
        assert row["extra_requests_pct"] >= 0
        assert row["p50_ms"] <= row["p99_ms"] <= row["p999_ms"] <= row["max_ms"]
        assert 0 <= row["partial_share"] <= 1
        if phase == "baseline":
            assert row["p999_vs_own_baseline"] == 1.0
        if not policy.startswith("ours"):
            assert row["hedges"] == 0  # hedging off
    # Round robin keeps sending a third of the shard's queries to the slowed replica.
    assert rows[("rr", "slow")]["p99_ms"] > rows[("rr", "baseline")]["p99_ms"]
    assert rows[("rr", "restart")]["retries"] > 0  # refused by the killed replica
    assert {g["policy"] for g in record["goal"]} == {
        p for p in POLICIES if p.startswith("ours") and p not in skipped
    }

    # Replayed from the saved trace: the same run, figure for figure.
    trace = tmp_path / "dispatch-trace-tiny.json"
    again = _bench(
        tmp_path, "--trace", str(trace), "--policies", "rr", "--phases", "slow", "--label", "again"
    )
    assert again["trace"]["file"] == str(trace)
    for phase in ("baseline", "slow"):
        replayed, first = _rows(again)[("rr", phase)], rows[("rr", phase)]
        del replayed["p999_vs_ours_baseline"], first["p999_vs_ours_baseline"]  # no ours there
        assert replayed == first

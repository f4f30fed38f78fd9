"""bench/bench_dispatch.py at a tiny scale: every policy this tree has is run in every
phase (the others are said to be pending), the figures hold their invariants, and a
replay of the saved trace gives the same figures; the coverage policy is skipped where
it cannot act and lets the slow shard go where it can."""

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
# The trickle before each warm-up runs its full 35 s of virtual time, at 2 queries a
# second rather than 20: a tenth of the work.
TINY = ("--queries", str(QUERIES), "--warmup", "60", "--jobs", "1", "--settle-rate", "2")
#: Slow start's ramp and the wrr picker's blackout at their defaults, and the margin.
RAMP, BLACKOUT, MARGIN = 30.0, 10.0, 5.0


def _bench(out: Path, *argv: str, shards: int = 4) -> dict[str, Any]:
    subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, "--shards", str(shards), "--out-dir", str(out), *argv],
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
    assert "ours-wrr" not in skipped
    for policy in POLICIES:
        if policy in skipped:
            # Only the groups, which another change brings, may be missing, and say so.
            assert policy == "ours-groups"
            assert skipped[policy].startswith("pending")
        else:
            assert {phase for (p, phase) in rows if p == policy} == set(PHASES)
    # Every policy is warmed past its own time constants (the wrr picker's blackout,
    # slow start's ramp), the same for all.
    assert record["setup"]["settle_s"] == max(RAMP, BLACKOUT) + MARGIN
    assert {row["settle_s"] for row in rows.values()} == {max(RAMP, BLACKOUT) + MARGIN}
    for (policy, phase), row in rows.items():
        assert row["queries"] + row["refused"] == QUERIES
        assert row["first_requests"] == 4 * row["queries"]  # every shard asked
        assert row["sub_requests"] >= row["first_requests"]
        assert row["extra_requests_pct"] >= 0
        assert row["p50_ms"] <= row["p99_ms"] <= row["p999_ms"] <= row["max_ms"]
        assert 0 <= row["partial_share"] <= 1
        assert 0 <= row["mean_coverage_pct"] <= 100
        assert sum(row["shard_requests_by_replica"]) == row["shard_requests"]
        assert row["faulty_cut"] <= row["server_cut"]
        if policy == "ours-groups":
            assert sum(row["group_queries"].values()) == QUERIES - row["refused"]
        else:
            assert row["group_queries"] == {}
        if phase == "baseline":
            assert row["p999_vs_own_baseline"] == 1.0
        # The queries over 1.2 x the baseline's p99.9: at most the 0.1 % above the p99.9's
        # rank when the p99.9 is within the line, more when not.
        assert row["over_goal_allowed"] == 0  # 300 queries: the p99.9 is the slowest
        assert (row["over_goal_queries"] > 0) == (row["p999_ms"] > row["goal_line_ms"])
        assert "latencies_ms" not in row
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


def test_the_coverage_policy_is_skipped_where_it_cannot_act_and_lets_a_slow_shard_go(
    tmp_path: Path,
) -> None:
    tiny = ("--docs", "500", "--trace-queries", "40", "--repeats", "1")
    # 95 % of 4 shards is all 4: the policy would never end a query early.
    record = _bench(tmp_path, *tiny, "--policies", "ours-cov95", "--label", "four")
    assert "meaningless on 4 shards" in record["skipped"]["ours-cov95"]
    assert not record["rows"][0].get("phase")

    # On 20 shards, with every replica of shard 0 slowed: ours waits for it, ours-cov95
    # lets it go once the other 19 have answered (and waited as long again).
    record = _bench(
        tmp_path,
        *tiny,
        "--policies",
        "ours,ours-cov95",
        "--phases",
        "slow-shard",
        "--label",
        "twenty",
        shards=20,
    )
    rows = _rows(record)
    assert set(rows) == {
        (p, ph) for p in ("ours", "ours-cov95") for ph in ("baseline", "slow-shard")
    }
    ours, cov = rows[("ours", "slow-shard")], rows[("ours-cov95", "slow-shard")]
    assert ours["to_faulty_pct"] == 100.0  # every replica of the shard was slowed
    assert "adaptive_wait" not in ours["partial_reasons"]
    assert cov["partial_reasons"]["adaptive_wait"] > 0
    assert cov["mean_coverage_pct"] >= 95.0
    assert cov["p99_ms"] < ours["p99_ms"]
    # Not among the goal's phases: no choice of replica helps a shard slow everywhere.
    assert {g["phase"] for g in record["goal"]} == set()

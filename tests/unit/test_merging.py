"""The merge of the shards' answers as pure functions: decoded answers in, the ranked,
bounded result out."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pytest

from search_server.merging import (
    ANSWER_ENVELOPE_BYTES,
    HIT_BYTES,
    MAX_HIT_FIELDS,
    MAX_HIT_ID,
    MAX_HIT_TEXT,
    MAX_SCORE,
    BadAnswer,
    FailureReason,
    Ranked,
    ShardOutcome,
    answer_bytes,
    feedback,
    load_report,
    merge,
    ranked_hits,
)


@dataclass
class Shard:
    """One shard's end of a query, as the fan-out's call holds it."""

    hits: list[Ranked] | None
    outcome: ShardOutcome = "ok"
    cut: bool = False
    reason: FailureReason = "error"
    docs: int = 0
    shard_docs: int = 0


def answered(
    shard: int, *hits: tuple[str, float], k: int = 10, cut: bool = False, docs: int = 0
) -> Shard:
    body = {"hits": [{"id": i, "score": s} for i, s in hits], "shard": shard}
    return Shard(ranked_hits(body, shard, k), cut=cut, docs=docs, shard_docs=docs)


def test_the_top_k_across_shards_each_with_its_shard() -> None:
    shards = [
        answered(0, ("a", 9.0), ("b", 3.0)),
        answered(1, ("c", 7.0), ("d", 5.0)),
        answered(2, ("e", 8.0)),
    ]
    result = merge(shards, 3, 12.3456)

    assert result.hits == [
        {"id": "a", "score": 9.0, "shard": 0},
        {"id": "e", "score": 8.0, "shard": 2},
        {"id": "c", "score": 7.0, "shard": 1},
    ]
    assert result.shards == {
        "total": 3,
        "ok": 3,
        "failed": 0,
        "timed_out": 0,
        "cut": 0,
        "missing": 0,
    }
    assert not result.partial
    assert result.took_ms == 12.346


def test_ties_rank_by_id_then_shard() -> None:
    shards = [answered(1, ("x", 1.0), ("a", 1.0)), answered(0, ("x", 1.0))]
    hits = merge(shards, 10, 1.0).hits
    assert [(h["id"], h["shard"]) for h in hits] == [("a", 1), ("x", 0), ("x", 1)]


def test_shards_are_counted_by_outcome_and_any_miss_is_partial() -> None:
    shards = [
        answered(0, ("a", 1.0)),
        answered(1, ("b", 2.0), cut=True),
        Shard(None, "failed"),
        Shard(None, "timed_out"),
        Shard(None, "timed_out"),
    ]
    result = merge(shards, 10, 500.0)
    assert result.shards == {
        "total": 5,
        "ok": 2,
        "failed": 1,
        "timed_out": 2,
        "cut": 1,
        "missing": 0,
    }
    assert result.partial
    assert [h["id"] for h in result.hits] == ["b", "a"]


def test_a_cut_answer_alone_makes_the_result_partial() -> None:
    result = merge([answered(0, ("a", 1.0), cut=True)], 10, 1.0)
    assert result.shards["ok"] == 1
    assert result.partial


def test_only_the_merged_hits_are_copied() -> None:
    body = {"hits": [{"id": "a", "score": 1.0, "title": "t"}], "shard": 0}
    ranked = ranked_hits(body, 0, 10)
    assert ranked[0][3] is body["hits"][0]
    result = merge([Shard(ranked)], 10, 1.0)
    assert result.hits == [{"id": "a", "score": 1.0, "title": "t", "shard": 0}]
    assert "shard" not in body["hits"][0]
    # The result's dict form is fresh objects again.
    assert result.to_dict()["hits"][0] is not result.hits[0]


def test_an_answer_of_exactly_k_hits_is_ranked_whole() -> None:
    body = {"hits": [{"id": f"d{i}", "score": float(i)} for i in range(3)], "shard": 3}
    assert [(hit_id, shard) for _, hit_id, shard, _ in ranked_hits(body, 3, 3)] == [
        ("d0", 3),
        ("d1", 3),
        ("d2", 3),
    ]


def test_more_than_k_hits_is_a_bad_answer_not_cut_to_k() -> None:
    # A data server asked for k that sends more ignores the request: none of its hits
    # is used (before, the first k were, and all of them parsed and kept).
    body = {"hits": [{"id": f"d{i}", "score": 1.0} for i in range(4)], "shard": 0}
    with pytest.raises(BadAnswer, match="answered 4 hits, more than k=3") as refused:
        ranked_hits(body, 0, 3)
    assert refused.value.why == "too_many_hits"


@pytest.mark.parametrize(
    "score", [1e308, -1e308, math.inf, -math.inf, math.nan, MAX_SCORE * 1.000001, 10**400]
)
def test_a_score_out_of_range_is_a_bad_answer(score: float) -> None:
    with pytest.raises(BadAnswer, match="'score' out of") as refused:
        ranked_hits({"hits": [{"id": "d1", "score": score}], "shard": 0}, 0, 10)
    assert refused.value.why == "score"


def test_scores_at_the_ends_of_the_range_are_accepted() -> None:
    body = {"hits": [{"id": "a", "score": MAX_SCORE}, {"id": "b", "score": -MAX_SCORE}]}
    assert [(rank, hit_id) for rank, hit_id, _, _ in ranked_hits(body, 0, 2)] == [
        (-MAX_SCORE, "a"),
        (MAX_SCORE, "b"),
    ]


def test_the_answer_cap_follows_k() -> None:
    assert answer_bytes(1) == ANSWER_ENVELOPE_BYTES + HIT_BYTES
    assert answer_bytes(3) == ANSWER_ENVELOPE_BYTES + 3 * HIT_BYTES
    # k = 10, the default: about 135 KiB, not the 8 MiB a body may have at most.
    assert 100_000 < answer_bytes(10) < 200_000


def test_a_hit_at_its_id_and_text_limits_fits_the_allowance() -> None:
    fields: dict[str, Any] = {f"{i:064d}": -1.2345678901234567e-300 for i in range(29)}
    hit = {"id": "i" * MAX_HIT_ID, "score": -MAX_SCORE, "title": "x" * MAX_HIT_TEXT, **fields}
    assert len(hit) == MAX_HIT_FIELDS
    assert len(json.dumps(hit, separators=(",", ":"))) <= HIT_BYTES
    k = 5
    body = json.dumps({"hits": [hit] * k, "shard": 0, "took_ms": 1.5, "queue": 0})
    assert len(body.encode()) <= answer_bytes(k)


def test_hits_at_the_bounds_are_accepted() -> None:
    hit: dict[str, Any] = {"id": "i" * MAX_HIT_ID, "score": 1, "title": "x" * MAX_HIT_TEXT}
    hit.update(flag=True, rank=1.5, **{f"f{i}": None for i in range(MAX_HIT_FIELDS - 5)})
    assert len(hit) == MAX_HIT_FIELDS
    assert len(ranked_hits({"hits": [hit]}, 0, 10)) == 1


def _hit(**fields: object) -> dict[str, object]:
    return {"hits": [{"id": "d1", "score": 1.0, **fields}], "shard": 0}


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ([], "not a JSON object"),
        ({"shard": 0}, "no 'hits' list"),
        ({"hits": [], "shard": 1}, "answered for shard 1, registered for shard 0"),
        ({"hits": ["d1"]}, "a hit is not a JSON object"),
        ({"hits": [{"id": 1, "score": 1.0}]}, "'id' is not a string"),
        ({"hits": [{"id": "i" * (MAX_HIT_ID + 1), "score": 1.0}]}, "'id' is not a string"),
        ({"hits": [{"id": "d1", "score": math.nan}]}, "'score' out of"),
        ({"hits": [{"id": "d1", "score": "1"}]}, "no number 'score'"),
        ({"hits": [{"id": "d1", "score": True}]}, "no number 'score'"),
        (_hit(**{f"f{i}": i for i in range(MAX_HIT_FIELDS - 1)}), "33 fields, more than 32"),
        (_hit(title="x" * (MAX_HIT_TEXT + 1)), "longer than"),
        (_hit(rank=math.inf), "not finite"),
        (_hit(nested={"a": [1]}), "not a flat JSON value"),
        (_hit(**{"n" * 65: 1}), "field name that is not a short string"),
    ],
)
def test_a_malformed_answer_is_refused(body: object, complaint: str) -> None:
    with pytest.raises(BadAnswer, match=complaint):
        ranked_hits(body, 0, 10)


def test_a_document_answered_twice_by_one_shard_is_refused_before_the_merge() -> None:
    # Same id, same score, other fields: ranked as they were, the merge compared the hit
    # objects (a TypeError) and failed the whole query for one data server's answer.
    twice = {
        "hits": [{"id": "d1", "score": 2.0, "title": "a"}, {"id": "d1", "score": 2.0, "x": 1}],
        "shard": 0,
    }
    with pytest.raises(BadAnswer, match="hit 'd1' is in the answer twice") as refused:
        ranked_hits(twice, 0, 10)
    assert refused.value.why == "malformed"
    # Another score for the same document is no better: a shard answers each one once.
    with pytest.raises(BadAnswer, match="twice"):
        ranked_hits({"hits": [{"id": "d1", "score": 2.0}, {"id": "d1", "score": 1.0}]}, 0, 10)
    # The same id from two shards is two documents: merged, ranked by shard.
    shards = [answered(1, ("d1", 2.0)), answered(0, ("d1", 2.0))]
    assert [(h["id"], h["shard"]) for h in merge(shards, 10, 1.0).hits] == [("d1", 0), ("d1", 1)]


def test_a_refusal_quotes_a_bounded_excerpt() -> None:
    with pytest.raises(BadAnswer) as refused:
        ranked_hits(_hit(nested=["y" * 10_000]), 0, 10)
    assert len(str(refused.value)) < 250
    assert str(refused.value).endswith("...")


def test_a_bad_answer_is_a_value_error() -> None:
    # The fan-out counts it as it counts undecodable JSON: a failed sub-request.
    assert issubclass(BadAnswer, ValueError)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"took_ms": 12, "queue": 3}, (0.012, 3.0)),
        ({"took_ms": 1.5}, (0.0015, None)),
        ({"took_ms": -1, "queue": -1}, (None, None)),
        ({"took_ms": 4e6, "queue": 10**6}, (None, None)),
        ({"took_ms": "12", "queue": 2.0}, (None, None)),
        ({}, (None, None)),
    ],
)
def test_feedback_is_taken_only_when_sane(
    body: dict[str, Any], expected: tuple[float | None, float | None]
) -> None:
    assert feedback(body) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"utilization": 0.25, "qps": 120.5, "eps": 0.0}, (0.25, 120.5, 0.0)),
        ({"utilization": 3, "qps": 40, "eps": 2}, (3.0, 40.0, 2.0)),  # integers
        ({"utilization": 0, "qps": 0, "eps": 0}, (0.0, 0.0, 0.0)),  # in range: kept
        ({"utilization": 1000, "qps": 1e7, "eps": 1e7}, (1000.0, 1e7, 1e7)),
        ({}, None),  # a data server that does not report its load
        ({"utilization": 0.5, "qps": 10.0}, None),  # one missing: no report
        ({"utilization": -0.1, "qps": 10.0, "eps": 0.0}, None),
        ({"utilization": 1000.5, "qps": 10.0, "eps": 0.0}, None),
        ({"utilization": 0.5, "qps": 1.1e7, "eps": 0.0}, None),
        ({"utilization": 0.5, "qps": 10.0, "eps": -1}, None),
        ({"utilization": float("nan"), "qps": 10.0, "eps": 0.0}, None),
        ({"utilization": 0.5, "qps": float("inf"), "eps": 0.0}, None),
        ({"utilization": "0.5", "qps": 10.0, "eps": 0.0}, None),
        ({"utilization": True, "qps": 10.0, "eps": 0.0}, None),
        ({"utilization": 0.5, "qps": [10], "eps": None}, None),
        ({"utilization": 0.5, "qps": 10**400, "eps": 0}, None),  # a huge int
    ],
)
def test_a_load_report_is_taken_only_when_all_three_are_sane(
    body: dict[str, Any], expected: tuple[float, float, float] | None
) -> None:
    assert load_report(body) == expected


def test_a_bad_load_report_leaves_the_answer_usable() -> None:
    body = {"hits": [{"id": "a", "score": 1.0}], "shard": 0, "utilization": "high", "qps": -3}
    assert load_report(body) is None
    assert len(ranked_hits(body, 0, 10)) == 1
    assert feedback(body) == (None, None)


def test_coverage_counts_the_documents_searched_and_names_every_reason() -> None:
    shards = [
        answered(0, ("a", 1.0), docs=1000),
        answered(1, ("b", 2.0), cut=True, docs=900),
        Shard(None, "failed", reason="overload", shard_docs=1100),
        Shard(None, "timed_out", shard_docs=1000),
    ]
    result = merge(shards, 10, 5.0, missing=[(7, 1000), (4, 800)])
    coverage = result.coverage
    assert coverage is not None
    assert (coverage.docs, coverage.docs_total) == (1900, 1900 + 1100 + 1000 + 1800)
    assert (coverage.shards, coverage.shards_total) == (2, 6)
    assert coverage.missing == (4, 7)
    assert coverage.degraded == ("no_replica", "deadline", "overload", "cut")
    assert not coverage.full
    assert coverage.to_dict()["percent"] == round(100 * 1900 / 5800, 2)
    assert (result.shards["total"], result.shards["missing"]) == (6, 2)
    assert result.partial


def test_a_complete_answer_covers_everything() -> None:
    result = merge([answered(0, ("a", 1.0), docs=10), answered(1, docs=20)], 10, 1.0)
    assert result.coverage is not None
    assert result.coverage.to_dict() == {
        "percent": 100.0,
        "docs": 30,
        "docs_total": 30,
        "shards": 2,
        "shards_total": 2,
        "full": True,
        "missing": [],
        "degraded": [],
    }
    assert not result.partial
    assert result.to_dict()["coverage"]["full"] is True


def test_coverage_without_documents_counts_shards() -> None:
    result = merge([answered(0, ("a", 1.0)), Shard(None, "failed")], 10, 1.0)
    assert result.coverage is not None
    assert result.coverage.ratio == 0.5
    assert result.coverage.degraded == ("error",)

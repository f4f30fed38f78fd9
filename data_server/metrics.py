"""Prometheus metrics of a data server (:class:`DataServerMetrics`): its searches by HTTP
status, latency, cuts and slices, the searches in progress and their cap, and its shard.
Registered on the registry given, never the global one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["DataServerMetrics"]


class DataServerMetrics:
    """The metrics of one data server's searches and shard, on ``registry``.

    Raises ``ValueError`` (from prometheus_client) if ``registry`` already holds these
    names, i.e. when two data servers are given the same registry.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "data_server_search_requests",
            "Search requests, by HTTP status.",
            ["status"],
            registry=registry,
        )
        self.latency = Histogram(
            "data_server_search_seconds",
            "Search latency as served (including injected faults).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=registry,
        )
        self.documents = Gauge(
            "data_server_documents", "Documents in this shard.", registry=registry
        )
        self.terms = Gauge("data_server_terms", "Distinct terms in the index.", registry=registry)
        self.index_build_seconds = Gauge(
            "data_server_index_build_seconds",
            "Time it took to load and index the shard (or to load its snapshot).",
            registry=registry,
        )
        self.from_snapshot = Gauge(
            "data_server_index_from_snapshot",
            "1 when the shard's index was loaded from its snapshot (--index-snapshot-dir), "
            "0 when it was built.",
            registry=registry,
        )
        self.cut = Counter(
            "data_server_search_cut",
            "Searches stopped when their budget (timeout_ms, less a safety margin) ran "
            "out: answered with the hits found so far (answer=hits, HTTP 200 with "
            "cut=true), or with HTTP 504 when it ran out before the search could start "
            "(answer=timeout).",
            ["answer"],
            registry=registry,
        )
        self.slice = Histogram(
            "data_server_search_slice_seconds",
            "How long one slice of a search held the event loop.",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1),
            registry=registry,
        )
        self.in_progress = Gauge(
            "data_server_searches_in_progress",
            "Searches in progress that count against --max-concurrent-searches (held by "
            "an injected fault included, the agent's probes not).",
            registry=registry,
        )
        self.utilization = Gauge(
            "data_server_load_utilization",
            "The utilization this server reports in its answers: the searches in "
            "progress (probes included), averaged over the last 2-3 seconds.",
            registry=registry,
        )
        self.limit = Gauge(
            "data_server_max_concurrent_searches",
            "The cap on searches in progress (--max-concurrent-searches); more are "
            "answered with 429.",
            registry=registry,
        )
        self.clamped = Counter(
            "data_server_search_timeout_clamped",
            "Search requests whose timeout_ms exceeded --max-timeout-ms, worked with "
            "that maximum instead.",
            registry=registry,
        )
        # The hot path's counter children, looked up once rather than per request.
        self.ok = self.requests.labels(status="200")
        self.full = self.requests.labels(status="429")

"""A data server: one shard of documents behind an HTTP API, registered in ZooKeeper.

For now it serves ``/healthz`` and ``/readyz`` and registers itself once listening;
the search engine, health probes and drain come with the data-server issue.
"""

__all__: list[str] = []

"""A data server: one shard of documents behind an HTTP API, kept registered in ZooKeeper
by the embedded :class:`~discovery.agent.agent.Agent` exactly while it answers.

``data-server`` runs one (:mod:`.server`: real BM25 search over an in-memory inverted
index, :mod:`.index` and :mod:`.corpus`; health, readiness, metrics; admin drain,
offline/online and simulated faults, :mod:`.faults`); ``data-server fleet`` runs many
simulated ones in a few processes (:mod:`.fleet`), and ``data-server loadgen`` sends
them queries through the search servers (:mod:`.loadgen`). An application on the
``discovery`` library; it never imports ``search_server``.
"""

__all__: list[str] = []

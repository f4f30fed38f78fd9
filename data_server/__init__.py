"""A data server: one shard of documents behind an HTTP API, kept registered in ZooKeeper
by the embedded :class:`~discovery.agent.agent.Agent` exactly while it answers.

Design: docs/design/data-server.md, "The data server".
"""

__all__: list[str] = []

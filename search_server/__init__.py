"""A search server: takes part in the leader election, publishes the live list while it
leads, and fans every query out to one live replica per shard under a deadline.

An application on the ``discovery`` library; it never imports ``data_server``.
Design: docs/design/search-server.md; its modules: docs/design/modules.md, "Modules".
"""

__all__: list[str] = []

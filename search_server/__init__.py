"""A search server: takes part in the leader election, publishes the live list while it
leads, and fans every query out to one live replica per shard under a deadline.

:mod:`.server` is the process (election, the leader's duty, the live-list follower, the
HTTP API and the dashboard, :mod:`.dashboard`); :mod:`.fanout` the fan-out with its
deadlines, retries, hedges, outlier ejection and admission control; :mod:`.routing` its
routing table, which follows the live list change by change; :mod:`.picking` the replica
picker seam (adaptive replica selection by default). An application on the ``discovery``
library; it never imports ``data_server``.
"""

__all__: list[str] = []

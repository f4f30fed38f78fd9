"""A search server with a replica picker of your own: each shard's primary first.

What it shows: a replica picker (:class:`search_server.picking.ReplicaPicker`) is any
object with ``pick(candidates) -> Replica``, and ``search_server.cli.main(picker=...)``
runs a whole search server with it: every flag and environment variable of
``search-server`` (``--help``), with this picker in place of the one ``--picker`` names.
For every sub-request the fan-out narrows a shard's replicas to the candidates
(routable, not ejected, not yet tried by this query, own zone first, warmed up) and asks
the picker for one, on its event loop: a picker must be fast, need not be thread-safe,
and must never raise for a non-empty list.

This one sends each shard's requests to its lowest-numbered replica (the payload's
``replica``), say because replica 0 keeps the shard's cache warm or the others are
standby copies on smaller machines; among equals the shipped power-of-two-choices
picker decides. Another replica gets a request only when no replica 0 is a candidate:
gone, ejected after failures, draining, or already tried by this query (a retry).

Run it against ``discovery devcluster`` (paste the ``export`` lines it prints first),
with data servers registered (``data-server --shard 0 --replica 1 --port 9011``...)::

    python examples/custom_picker.py --port 8080 --id ss-1
    curl 'http://127.0.0.1:8080/search?q=hello'
    curl -s http://127.0.0.1:8080/cluster   # "sent" per data server: where requests went
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from search_server.cli import main
from search_server.picking import PowerOfTwoChoices, Replica, ReplicaPicker


class PrimaryFirst:
    """The candidates of the lowest ``replica`` number, then ``among`` picks one of them."""

    def __init__(self, among: ReplicaPicker | None = None) -> None:
        self.among = among if among is not None else PowerOfTwoChoices()

    def pick(self, candidates: Sequence[Replica]) -> Replica:
        if len(candidates) == 1:
            return candidates[0]
        first = min(replica.instance.payload.replica for replica in candidates)
        return self.among.pick([r for r in candidates if r.instance.payload.replica == first])


if __name__ == "__main__":
    sys.exit(main(picker=PrimaryFirst()))

"""``discovery status``: what is registered, who leads, what is published, and how they differ.

One read-only look at a cluster, for operators and scripts, in four parts: the status
and its comparison (:mod:`.model`), reading it from ZooKeeper and Redis
(:mod:`.reader`), the text report (:mod:`.format`) and the subcommand (:mod:`.command`).
"""

from .command import add_parser, run
from .format import format_text
from .model import (
    PROBLEMS,
    ClusterStatus,
    Contender,
    Differences,
    Health,
    Mismatch,
    Published,
    compare,
)
from .reader import collect_status, fetch_status

__all__ = [
    "PROBLEMS",
    "ClusterStatus",
    "Contender",
    "Differences",
    "Health",
    "Mismatch",
    "Published",
    "add_parser",
    "collect_status",
    "compare",
    "fetch_status",
    "format_text",
    "run",
]

"""``discovery status``: what is registered, who leads, what is published, and how they differ.

In four parts: :mod:`.model`, :mod:`.reader`, :mod:`.format` and :mod:`.command`.

Operating: docs/operating.md, "``discovery status``".
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

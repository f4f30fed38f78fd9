"""``discovery chaos``: seeded faults against a local cluster under load, invariants checked.

Development: docs/development.md, "The chaos run".
"""

from .command import add_parser, run
from .config import ChaosConfig
from .runner import ChaosResult, run_chaos, schedule

__all__ = ["ChaosConfig", "ChaosResult", "add_parser", "run", "run_chaos", "schedule"]

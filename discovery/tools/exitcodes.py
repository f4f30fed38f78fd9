"""The exit status of every ``discovery`` operator command, one scheme for all of them.

0 (:data:`EXIT_OK`) done; 1 (:data:`EXIT_ATTENTION`) needs attention (look again);
2 (:data:`EXIT_USAGE`) bad arguments; 3 (:data:`EXIT_UNREACHABLE`) unreachable or failing
(retry later); 4 (:data:`EXIT_REFUSED`) refused (credentials or ACL).

Operating: docs/operating.md, "Exit codes".
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "EPILOG",
    "EXIT_ATTENTION",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
]

EXIT_OK: Final = 0
EXIT_ATTENTION: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_REFUSED: Final = 4

#: The common part of each command's ``--help`` epilog (the command adds what 0 and 1
#: mean for it).
EPILOG: Final = (
    "2 bad arguments (the flag is named); 3 ZooKeeper or Redis could not be reached or "
    "failed the operation (retrying later may help); 4 ZooKeeper or Redis refused "
    "(credentials or ACL; the flag is named)"
)

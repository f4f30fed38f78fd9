"""The exit status of every ``discovery`` operator command, one scheme for all of them.

Scripts branch on these, so they mean the same in ``status``, ``maint``, ``fence`` and
``zk-init`` (each command's ``--help`` says which it uses and when):

* 0 (:data:`EXIT_OK`): done; the cluster (or what was checked) needs nothing.
* 1 (:data:`EXIT_ATTENTION`): the command ran and what it found needs attention:
  ``status`` is degraded, ``fence check`` found the fence poisoned, ``fence repair``
  wrote nothing. Looking again may give another answer (the published list lags a
  change for a moment).
* 2 (:data:`EXIT_USAGE`): bad arguments or settings; the message names the flag or
  variable. argparse exits with 2 too. Retrying the same command cannot help.
* 3 (:data:`EXIT_UNREACHABLE`): ZooKeeper or Redis could not be reached, or failed the
  operation (a timeout, a lost connection, an error reply). Retrying later may help.
* 4 (:data:`EXIT_REFUSED`): ZooKeeper or Redis answered but refused: wrong credentials,
  or an ACL that lacks the right. The message names the credential flag. Retrying with
  the same credentials cannot help.

Failures go to stderr, one line each, prefixed with the command's name; with ``--json``
stdout holds the document or nothing.
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

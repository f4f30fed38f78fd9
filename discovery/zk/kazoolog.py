"""kazoo's log without our secrets.

At DEBUG kazoo logs every request it sends, the authentication packet with the digest
credentials in clear (``Auth(..., auth='user:password')``) and the connect packet
with the session's password, which is all it takes to take over the session (as
:mod:`discovery.zk.abandon` does on purpose). :func:`mask_kazoo_secrets` installs a
filter on kazoo's logger that masks both before any handler sees the record: running
a server or ``discovery status -vv`` at DEBUG then shows the user, not the password.

Design: docs/design/security.md, "Secrets in messages".
"""

from __future__ import annotations

import logging
import threading
from typing import Final

from kazoo.protocol.serialization import Auth, Connect

__all__ = ["KAZOO_LOGGER", "KazooSecretFilter", "mask_kazoo_secrets"]

#: The logger kazoo's clients (and their connections) log to unless given another.
KAZOO_LOGGER: Final = "kazoo.client"

_MASK: Final = "***"
_install_lock = threading.Lock()


def _masked(value: object) -> object:
    if isinstance(value, Auth):
        # Digest credentials are ``user:password``: the user says who, the rest is secret.
        user = str(value.auth).partition(":")[0]
        return value._replace(auth=f"{user}:{_MASK}")
    if isinstance(value, Connect):
        return value._replace(passwd=_MASK)
    return value


class KazooSecretFilter(logging.Filter):
    """Masks the credentials of kazoo's ``Auth`` and ``Connect`` packets and the
    session password of its "Session created" line in a record's arguments; lets
    every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            masked = tuple(_masked(arg) for arg in args)
            if "session_passwd" in str(record.msg) and len(masked) > 1:
                masked = (masked[0], _MASK, *masked[2:])
            record.args = masked
        return True


def mask_kazoo_secrets(logger: logging.Logger | None = None) -> None:
    """Install :class:`KazooSecretFilter` on ``logger`` (kazoo's own by default), once:
    calling again changes nothing."""
    target = logger if logger is not None else logging.getLogger(KAZOO_LOGGER)
    with _install_lock:
        if not any(isinstance(f, KazooSecretFilter) for f in target.filters):
            target.addFilter(KazooSecretFilter())

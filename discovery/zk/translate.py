"""kazoo's exceptions mapped onto the :mod:`discovery.errors` tree."""

from __future__ import annotations

from kazoo import exceptions as kz
from kazoo.handlers.threading import KazooTimeoutError

from discovery.errors import (
    ZkAuthError,
    ZkBadVersionError,
    ZkConnectionError,
    ZkError,
    ZkNodeExistsError,
    ZkNoNodeError,
    ZkSessionExpiredError,
)

__all__ = ["translate_kazoo_error"]


def translate_kazoo_error(exc: BaseException) -> ZkError:
    """Map a kazoo exception onto our error tree (the caller chains the original)."""
    message = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, kz.NoNodeError):
        return ZkNoNodeError(message)
    if isinstance(exc, kz.NodeExistsError):
        return ZkNodeExistsError(message)
    if isinstance(exc, kz.BadVersionError):
        return ZkBadVersionError(message)
    if isinstance(exc, kz.SessionExpiredError):
        return ZkSessionExpiredError(message)
    if isinstance(exc, kz.NoAuthError | kz.AuthFailedError):
        return ZkAuthError(message)
    if isinstance(
        exc,
        kz.ConnectionLoss
        | kz.ConnectionClosedError
        | kz.OperationTimeoutError
        | kz.SessionMovedError
        | KazooTimeoutError
        | TimeoutError,
    ):
        return ZkConnectionError(message)
    return ZkError(message)

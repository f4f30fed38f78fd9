"""The exception tree of the discovery framework.

Every error raised by our code derives from :class:`DiscoveryError`, so an
embedding application can catch one type. kazoo and redis-py errors are
translated where they enter our code (see :func:`discovery.zk.translate_kazoo_error`);
the original exception is always kept as ``__cause__``.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DevClusterError",
    "DiscoveryError",
    "FencedError",
    "InvalidInstanceError",
    "PayloadTooLargeError",
    "RedisAccessError",
    "RedisAuthError",
    "RedisOperationError",
    "RedisPermissionError",
    "RedisUnavailableError",
    "RegistrationConflictError",
    "ZkAuthError",
    "ZkBadVersionError",
    "ZkConnectionError",
    "ZkError",
    "ZkNoNodeError",
    "ZkNodeExistsError",
    "ZkSessionExpiredError",
]


class DiscoveryError(Exception):
    """Root of every error raised by the discovery framework."""


class ConfigError(DiscoveryError, ValueError):
    """A setting is missing or malformed; the message names the flag or variable."""


class InvalidInstanceError(DiscoveryError, ValueError):
    """A ServiceInstance document is malformed (bad JSON, missing field, wrong type)."""


class PayloadTooLargeError(InvalidInstanceError):
    """A ServiceInstance document exceeds the size bound (64 KiB by default)."""


class ZkError(DiscoveryError):
    """A ZooKeeper operation failed."""


class ZkConnectionError(ZkError):
    """The connection to ZooKeeper is down or an operation timed out.

    The session may still be alive: callers should wait for the next CONNECTED
    state and retry, not assume their ephemeral nodes are gone.
    """


class ZkSessionExpiredError(ZkConnectionError):
    """The ZooKeeper session expired: its ephemeral nodes and watches are gone."""


class ZkAuthError(ZkError):
    """Authentication failed or the ACL does not allow the operation."""


class ZkNoNodeError(ZkError):
    """The znode does not exist."""


class ZkNodeExistsError(ZkError):
    """The znode already exists."""


class ZkBadVersionError(ZkError):
    """A conditional update or delete lost a race: the znode's version changed."""


class RegistrationConflictError(ZkError):
    """Another live session owns the znode of our instance id; we refuse to steal it."""

    def __init__(self, path: str, owner_session: int) -> None:
        super().__init__(
            f"{path} is owned by another live ZooKeeper session 0x{owner_session:x}; "
            "is another server configured with the same --id?"
        )
        self.path = path
        self.owner_session = owner_session


class DevClusterError(DiscoveryError):
    """A local ZooKeeper or Redis process could not be started or did not answer."""


class FencedError(DiscoveryError):
    """A live-list publish or heartbeat was refused: Redis holds a newer epoch or version.

    Another leader (a newer epoch) or another writer in our epoch has published. The
    publisher has been deposed and must stop leading; retrying cannot succeed.
    ``reason`` is ``"epoch"`` or ``"version"``; ``stored_epoch`` and ``stored_version``
    are what Redis holds.
    """

    def __init__(
        self,
        *,
        epoch: int,
        version: int,
        stored_epoch: int,
        stored_version: int,
        reason: str,
    ) -> None:
        super().__init__(
            f"publish of epoch {epoch} version {version} refused ({reason} fence): Redis holds "
            f"epoch {stored_epoch} version {stored_version}; another leader has taken over"
        )
        self.epoch = epoch
        self.version = version
        self.stored_epoch = stored_epoch
        self.stored_version = stored_version
        self.reason = reason


class RedisOperationError(DiscoveryError):
    """A Redis command failed with an error reply or an unexpected answer.

    redis-py errors are translated where they enter our code
    (:func:`discovery.publisher.translate_redis_error`); the original is ``__cause__``.
    """


class RedisUnavailableError(RedisOperationError):
    """Redis cannot be reached or cannot serve writes right now (connection refused or lost,
    timeout, loading its data, read-only replica).

    The outcome of a write that failed this way is unknown: it may have been applied.
    """


class RedisAccessError(DiscoveryError):
    """Redis refused us: bad credentials, or an ACL that does not allow what we asked.

    Deliberately *not* a :class:`RedisOperationError`: callers retry those (an outage
    passes), but waiting does not fix a wrong password or a missing permission. An
    operator has to change the configuration or the server's ACL, so whoever meets
    this error should stop what needs the permission and say so loudly. Translated
    from redis-py by :func:`discovery.publisher.translate_redis_error`; the original
    is ``__cause__``.
    """


class RedisAuthError(RedisAccessError):
    """Authentication failed: wrong or missing password, unknown or disabled user."""


class RedisPermissionError(RedisAccessError):
    """Authenticated, but the user's ACL refuses a command, key or channel (NOPERM)."""

"""The Redis ACL rules of the two roles in layout 1 (``--redis-layout v1``).

Readers GET the snapshot and the heartbeat, HMGET the fence, PTTL the heartbeat (in a
MULTI/EXEC), SUBSCRIBE to the events channel and PING on it; the publisher runs the
fence script, which GETs, HMGETs and checks EXISTS, SETs and HSETs, and PUBLISHes the
event. Layout 2's rules are :func:`discovery.redisconn.reader_acl_rules` and
:func:`~discovery.redisconn.publisher_acl_rules`.
"""

from __future__ import annotations

from typing import Final

from ..redisconn import role_rules
from .layout import V1Keys

__all__ = [
    "PUBLISHER_COMMANDS_V1",
    "READER_COMMANDS_V1",
    "publisher_acl_rules_v1",
    "reader_acl_rules_v1",
]

READER_COMMANDS_V1: Final = (
    "get",
    "hmget",
    "pttl",
    "multi",
    "exec",
    "subscribe",
    "unsubscribe",
    "ping",
    "select",
)
PUBLISHER_COMMANDS_V1: Final = (
    "evalsha",
    "script|load",
    "get",
    "hmget",
    "exists",
    "set",
    "hset",
    "publish",
    "select",
)


def _keys(prefix: str) -> tuple[str, ...]:
    keys = V1Keys(prefix)
    return (keys.live, keys.fence, keys.leader)


def reader_acl_rules_v1(prefix: str) -> str:
    """Layout 1's reading role for ``prefix`` (``discovery:<cluster>``): read-only."""
    return role_rules("%R~", _keys(prefix), (V1Keys(prefix).events,), READER_COMMANDS_V1)


def publisher_acl_rules_v1(prefix: str) -> str:
    """Layout 1's publishing role for ``prefix``: what its fence script needs."""
    return role_rules("~", _keys(prefix), (V1Keys(prefix).events,), PUBLISHER_COMMANDS_V1)

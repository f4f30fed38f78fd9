"""Failovers of a Redis Sentinel group, forced or by a crash, and waits until it is whole.

Every wait has a deadline and fails with ``DevClusterError`` carrying the logs' tails.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Sequence

import redis

from discovery.errors import DevClusterError

from .process import remaining
from .redis import RedisServer, redis_command
from .sentinelprocess import Address, RedisSentinel
from .sentinelview import SentinelView, address_of

__all__ = ["SentinelFaults"]

logger = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.05


class SentinelFaults:
    """Fail the group of ``servers`` and ``sentinels`` (monitoring ``master_name``) over,
    read through ``view``, and wait until it has recovered. Each method's contract is
    documented on :class:`~discovery.testing.sentinel.RedisSentinelGroup`, which hands
    over to it."""

    def __init__(
        self,
        servers: Sequence[RedisServer],
        sentinels: Sequence[RedisSentinel],
        master_name: str,
        view: SentinelView,
    ) -> None:
        self._servers = servers
        self._sentinels = sentinels
        self._master_name = master_name
        self._view = view

    def failover(self, timeout: float = 30.0) -> Address:
        """Force a failover; see :meth:`RedisSentinelGroup.failover`."""
        deadline = time.monotonic() + timeout
        while True:
            old = self._view.primary_address()
            refusals: list[str] = []
            for sentinel in self._sentinels:
                if not sentinel.running:
                    continue
                try:
                    redis_command(
                        sentinel.host, sentinel.port, "SENTINEL", "FAILOVER", self._master_name
                    )
                except (redis.RedisError, OSError) as exc:
                    refusals.append(f"{sentinel.name}: {exc}")
                    continue
                logger.info("%s forced a failover away from %s:%d", sentinel.name, *old)
                return self.wait_for_new_primary(old, remaining(deadline))
            if time.monotonic() >= deadline:
                raise DevClusterError(
                    f"no sentinel started a failover within {timeout:g} s: "
                    f"{'; '.join(refusals) or 'none is running'}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def set_down_after(self, down_after_ms: int) -> None:
        """Tell every running sentinel how long a silent primary takes to be judged down;
        see :meth:`RedisSentinelGroup.hold_failovers`."""
        for sentinel in self._sentinels:
            if sentinel.running:
                redis_command(
                    sentinel.host,
                    sentinel.port,
                    *("SENTINEL", "SET", self._master_name),
                    *("down-after-milliseconds", str(down_after_ms)),
                )

    def kill_primary(self) -> RedisServer:
        """SIGKILL the primary; see :meth:`RedisSentinelGroup.kill_primary`."""
        primary = self._view.server_at(self._view.primary_address())
        pid = primary.pid
        if pid is None or not primary.running:
            raise DevClusterError(f"the primary {primary.name} is not running")
        os.kill(pid, signal.SIGKILL)
        # ``running`` polls the child, which reaps it once the kill has landed.
        self._view.wait(
            lambda: not primary.running, f"{primary.name} is dead", time.monotonic() + 10
        )
        primary.stop()  # only bookkeeping now: its pid goes, as for any stopped server
        logger.info("killed the primary %s (pid %d)", primary.name, pid)
        return primary

    def wait_for_new_primary(self, previous: Address, timeout: float = 30.0) -> Address:
        """Wait for another primary; see :meth:`RedisSentinelGroup.wait_for_new_primary`."""
        started = time.monotonic()
        found: list[Address] = []

        def promoted() -> bool:
            addresses = {self._view.primary_of(s) for s in self._sentinels if s.running}
            if len(addresses) != 1:
                return False
            (address,) = addresses
            if address is None or address == previous:
                return False
            if self._view.info(address).get("role") != "master":
                return False
            for sentinel in self._sentinels:
                if sentinel.running:
                    fields = self._view.master(sentinel)
                    if "failover_in_progress" in fields.get("flags", "failover_in_progress"):
                        return False
            found[:] = [address]
            return True

        self._view.wait(
            promoted, f"a primary other than {previous[0]}:{previous[1]}", started + timeout
        )
        logger.info("new primary %s:%d after %.1f s", *found[0], time.monotonic() - started)
        return found[0]

    def restart(self, server: RedisServer, timeout: float = 30.0) -> None:
        """Start ``server`` as a replica; see :meth:`RedisSentinelGroup.restart`."""
        if not any(server is s for s in self._servers):
            raise ValueError(f"{server!r} is not a data server of this group")
        deadline = time.monotonic() + timeout
        server.stop()
        primary = self._view.primary_address()
        own = address_of(server)
        server.replicaof = None if primary == own else primary
        server.start(timeout=remaining(deadline))
        if primary == own:
            return

        def rejoined() -> bool:
            # The primary is read again on every poll: the sentinels may fail over once
            # more while the server rejoins (with a short down-after on a loaded machine a
            # live primary can be judged down), and then they repoint the server to the
            # new primary, which is what rejoining means.
            running = [s for s in self._sentinels if s.running]
            current = {self._view.primary_of(s) for s in running}
            if len(current) != 1:
                return False
            (now,) = current
            if now is None:
                return False
            if now == own:
                return self._view.info(own).get("role") == "master"
            info = self._view.info(own)
            if info.get("role") != "slave" or info.get("master_link_status") != "up":
                return False
            if (info.get("master_host"), info.get("master_port")) != (now[0], str(now[1])):
                return False
            return all(self._view.sees_replica(s, own) for s in running)

        self._view.wait(
            rejoined,
            f"{server.name} is a replica of the primary every sentinel reports"
            f" ({primary[0]}:{primary[1]} when it started)",
            deadline,
            alive=[server],
        )

    def wait_replicated(self, timeout: float = 30.0) -> None:
        """Wait for the replicas' links; see :meth:`RedisSentinelGroup.wait_replicated`."""
        deadline = time.monotonic() + timeout

        def linked() -> bool:
            primary = self._view.primary_address()
            return all(
                self._view.replicates_from(s, primary)
                for s in self._servers
                if s.running and address_of(s) != primary
            )

        self._view.wait(linked, "every running replica replicates from the primary", deadline)

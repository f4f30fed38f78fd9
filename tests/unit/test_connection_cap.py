"""The cap on an HTTP server's open connections (:mod:`discovery.httpconns`).

Connections are stand-ins that record being closed, and the clock is a
:class:`ManualTimer`: which idle connection makes room at the cap, and when the short
keep-alive closes one as the cap nears, are seen at exact times.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from discovery.cli.options import HTTP_EDGE_OPTIONS, http_edge_config
from discovery.config import HttpEdgeConfig
from discovery.errors import ConfigError
from discovery.httpconns import ConnectionCap, default_max_connections
from discovery.metrics import HttpEdgeMetrics
from tests.support import ManualTimer, sample


class _Conn:
    """A connection that records why the cap closed it."""

    def __init__(self, name: str, closed: list[tuple[str, str]]) -> None:
        self.name = name
        self._closed = closed

    def close_idle(self, reason: str) -> None:
        self._closed.append((self.name, reason))

    def __repr__(self) -> str:
        return self.name


class _Rig:
    def __init__(self, limit: int, pressure_keepalive: float = 5.0) -> None:
        self.registry = CollectorRegistry()
        self.timer = ManualTimer()
        self.cap = ConnectionCap(
            limit, pressure_keepalive, HttpEdgeMetrics(self.registry), timer=self.timer
        )
        self.closed: list[tuple[str, str]] = []

    def open(self, name: str) -> _Conn | None:
        """A new connection, admitted (or None: refused)."""
        connection = _Conn(name, self.closed)
        if not self.cap.admit(connection):
            self.cap.refuse()
            return None
        return connection

    def admitted(self, name: str) -> _Conn:
        connection = self.open(name)
        assert connection is not None, f"{name} refused"
        return connection

    def idle_closed(self, reason: str) -> float:
        return sample(self.registry, "discovery_http_idle_connections_closed_total", reason=reason)


def test_at_the_cap_the_longest_idle_connection_makes_room() -> None:
    rig = _Rig(limit=4)
    conns = [rig.admitted(f"c{i}") for i in range(4)]
    # They idle in the order 2, 0, 3 (1 keeps its request): 2 has idled longest.
    for index in (2, 0, 3):
        rig.timer.advance(1)
        rig.cap.idle(conns[index])
    new = rig.admitted("new")
    assert rig.closed == [("c2", "cap")]
    assert rig.cap.open == 4
    # A connection that got a request's first byte is no longer idle: 0 is skipped.
    rig.cap.active(conns[0])
    rig.admitted("newer")
    assert rig.closed == [("c2", "cap"), ("c3", "cap")]
    # Idle again, 0 counts from now: "new", idle before it, goes first.
    rig.cap.idle(new)
    rig.timer.advance(1)
    rig.cap.idle(conns[0])
    rig.admitted("newest")
    assert rig.closed[2:] == [("new", "cap")]
    assert rig.idle_closed("cap") == 3
    assert sample(rig.registry, "discovery_http_connections") == 4
    assert sample(rig.registry, "discovery_http_max_connections") == 4


def test_at_the_cap_with_none_idle_a_new_connection_is_refused_and_nothing_is_cut() -> None:
    rig = _Rig(limit=3)
    for i in range(3):
        rig.admitted(f"busy{i}")
    assert rig.open("new") is None
    assert rig.closed == []
    assert rig.cap.open == 3
    assert rig.cap.refused == 1
    assert sample(rig.registry, "discovery_http_connections_refused_total") == 1


def test_a_lost_connection_frees_its_place_and_is_never_closed_again() -> None:
    rig = _Rig(limit=2)
    first = rig.admitted("a")
    rig.admitted("b")
    rig.cap.idle(first)
    rig.cap.lost(first)  # the client closed it
    rig.cap.lost(first)  # idempotent
    rig.admitted("c")
    assert rig.closed == []  # room without an eviction
    # An idle call for a connection already gone is ignored.
    rig.cap.idle(first)
    assert rig.cap.idle_count == 0
    assert rig.open("d") is None


def test_the_short_keep_alive_applies_only_above_three_quarters_of_the_cap() -> None:
    rig = _Rig(limit=8, pressure_keepalive=5.0)
    assert rig.cap.pressure_threshold == 6
    conns = [rig.admitted(f"c{i}") for i in range(6)]
    for connection in conns:
        rig.cap.idle(connection)
    # Six of eight open: no pressure, idle connections stay (aiohttp's 75 s applies).
    rig.timer.advance(60)
    assert rig.closed == []
    # A seventh: above the threshold. The longest idle has been idle 60 s already: it
    # goes at once (the timer is due), and that brings the fill back to six.
    rig.admitted("c6")
    rig.timer.advance(0)
    assert rig.closed == [("c0", "pressure")]
    assert rig.cap.open == 6
    assert rig.idle_closed("pressure") == 1


def test_under_pressure_idle_connections_go_longest_idle_first_after_the_short_keep_alive() -> None:
    rig = _Rig(limit=8, pressure_keepalive=5.0)
    conns = [rig.admitted(f"c{i}") for i in range(8)]
    # Eight open (above six): they idle one second apart, c7 first and c0 last.
    for connection in reversed(conns):
        rig.cap.idle(connection)
        rig.timer.advance(1)
    # Each goes once idle 5 s while the fill is above six: c7 at 5 s, c6 at 6 s, and
    # then the fill is six, so c5 and c4 (idle 5 s by the end) stay.
    assert rig.closed == [("c7", "pressure"), ("c6", "pressure")]
    assert rig.cap.open == 6
    # No more while at the threshold, however long they idle.
    rig.timer.advance(120)
    assert len(rig.closed) == 2
    # A new busy connection pushes the fill over again: the next longest idle goes.
    rig.admitted("busy")
    rig.timer.advance(0)
    assert rig.closed[2:] == [("c5", "pressure")]


def test_a_connection_is_closed_only_after_the_short_keep_alive_ends() -> None:
    rig = _Rig(limit=4, pressure_keepalive=5.0)
    conns = [rig.admitted(f"c{i}") for i in range(4)]  # 4 > 3: pressure
    rig.cap.idle(conns[0])
    rig.timer.advance(4.9)
    assert rig.closed == []
    # Its next request's first byte: no longer idle, its timer comes to nothing.
    rig.cap.active(conns[0])
    rig.cap.idle(conns[1])
    rig.timer.advance(0.2)
    assert rig.closed == []
    rig.timer.advance(4.8)  # c1 idle 5 s
    assert rig.closed == [("c1", "pressure")]


def test_the_default_cap_leaves_a_quarter_of_the_file_limit_within_bounds() -> None:
    assert default_max_connections(1024) == 768
    assert default_max_connections(65536) == 49152
    assert default_max_connections(256) == 192  # the reserve's floor: 64
    assert default_max_connections(128) == 64  # at most half
    assert default_max_connections(64) == 32
    assert default_max_connections(1) == 1


def test_connection_settings_are_checked_and_read_from_flags() -> None:
    import argparse

    from discovery.cli.options import add_options

    parser = argparse.ArgumentParser()
    add_options(parser, HTTP_EDGE_OPTIONS, environ={"DISCOVERY_PRESSURE_KEEPALIVE": "2.5"})
    config = http_edge_config(parser.parse_args(["--max-connections", "100"]))
    assert config.max_connections == 100
    assert config.pressure_keepalive == 2.5
    assert http_edge_config(parser.parse_args([])).max_connections is None
    with pytest.raises(ConfigError, match="--max-connections"):
        HttpEdgeConfig(max_connections=0)
    with pytest.raises(ConfigError, match="--pressure-keepalive"):
        HttpEdgeConfig(pressure_keepalive=0)

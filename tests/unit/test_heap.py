"""The heap freezer: the old generation frozen once it has grown, settled hourly."""

from __future__ import annotations

import asyncio
import gc

import pytest
from prometheus_client import CollectorRegistry

from search_server.heap import HeapFreezer


class _Collector:
    """A stand-in for :mod:`gc`: an old generation of ``old`` objects."""

    def __init__(self, old: int) -> None:
        self.old = old
        self.frozen = 0
        self.calls: list[str] = []
        self.froze = asyncio.Event()

    def get_objects(self, generation: int | None = None) -> list[object]:
        assert generation == 2
        return [None] * self.old

    def freeze(self) -> None:
        self.calls.append("freeze")
        self.froze.set()
        self.frozen += self.old
        self.old = 0

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")
        self.old += self.frozen
        self.frozen = 0

    def collect(self, generation: int = 2) -> int:
        self.calls.append("collect")
        return 0

    def get_freeze_count(self) -> int:
        return self.frozen


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_the_old_generation_is_frozen_once_it_has_grown_past_the_threshold() -> None:
    collector, clock, registry = _Collector(old=200_000), _Clock(), CollectorRegistry()
    freezer = HeapFreezer(above=1000, collector=collector, clock=clock, registry=registry)
    # What the process held before the server (a test runner's heap) is not growth.
    assert freezer.check() is None
    collector.old += 1000
    assert freezer.check() is None
    collector.old += 1
    assert freezer.check() == "freeze"
    assert collector.frozen == 201_001
    assert collector.old == 0
    assert _sample(registry, "search_server_heap_frozen_objects") == 201_001
    assert _sample(registry, "search_server_heap_freezes_total", kind="freeze") == 1
    # Counted from the freeze on: the next thousand and one objects freeze again.
    collector.old = 1000
    assert freezer.check() is None
    collector.old = 1001
    assert freezer.check() == "freeze"
    assert collector.calls == ["freeze", "freeze"]


def test_the_heap_is_settled_hourly_while_anything_is_frozen() -> None:
    collector, clock, registry = _Collector(old=0), _Clock(), CollectorRegistry()
    freezer = HeapFreezer(
        above=10, settle_every=3600, collector=collector, clock=clock, registry=registry
    )
    clock.now += 4000
    assert freezer.check() is None  # nothing frozen: nothing to settle
    collector.old = 11
    assert freezer.check() == "freeze"
    clock.now += 3599
    assert freezer.check() is None
    clock.now += 1
    # Unfrozen, collected in full once, frozen again: a frozen cycle that became
    # garbage is collected at the latest an hour later.
    assert freezer.check() == "settle"
    assert collector.calls == ["freeze", "unfreeze", "collect", "freeze"]
    assert _sample(registry, "search_server_heap_freezes_total", kind="settle") == 1
    clock.now += 1
    assert freezer.check() is None


def test_a_threshold_of_zero_turns_it_off() -> None:
    collector = _Collector(old=10**6)
    freezer = HeapFreezer(above=0, collector=collector, clock=_Clock())
    assert freezer.check() is None
    assert collector.calls == []


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="above"):
        HeapFreezer(above=-1, collector=_Collector(0))
    with pytest.raises(ValueError, match="interval"):
        HeapFreezer(interval=0, collector=_Collector(0))
    with pytest.raises(ValueError, match="settle_every"):
        HeapFreezer(settle_every=0, collector=_Collector(0))


def test_the_interpreters_collector_skips_what_was_frozen() -> None:
    assert gc.get_freeze_count() == 0
    # No garbage in the old generation to start from: a full collection the allocations
    # below set off (when is the interpreter's: Python 3.13's thresholds differ) would
    # free it, and the growth measured would fall short of what the test holds.
    gc.collect()
    freezer = HeapFreezer(above=50_000)
    kept = [[] for _ in range(60_000)]  # tracked containers, alive
    try:
        # Promoted to the old generation (where a full collection walks them).
        gc.collect(1)
        gc.collect(1)
        assert freezer.check() == "freeze"
        assert gc.get_freeze_count() >= 60_000
        old = {id(o) for o in gc.get_objects(2)}
        assert not any(id(o) in old for o in kept)
    finally:
        gc.unfreeze()
    assert len(kept) == 60_000


async def test_it_checks_in_a_task_and_stops_with_its_context() -> None:
    collector = _Collector(old=0)
    freezer = HeapFreezer(above=5, interval=0.01, collector=collector, clock=_Clock())
    async with freezer:
        collector.old = 6
        async with asyncio.timeout(5):
            await collector.froze.wait()
    assert collector.calls == ["freeze"]

"""Injected faults, for simulating the failures the agent must catch.

``POST /admin/fault`` sets one of:

* ``{"mode":"slow","delay_ms":N}``: every search waits N ms before answering;
* ``{"mode":"error","rate":R}``: a fraction R (0..1) of searches answer HTTP 500;
* ``{"mode":"hang"}``: searches never answer (until the fault is cleared); with
  ``"block_loop":true`` (and optionally ``"duration_ms":N``, default 30000) the next
  search instead blocks the whole event loop, as a stuck C call or a GC storm would;
* ``{"mode":"none"}``: back to normal (releases hung requests).

The fault applies to ``/search`` only: health and admin endpoints keep working, so
an operator can still look at and repair a faulty server.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Fault", "FaultInjector", "FaultSpecError"]

MAX_DELAY_MS = 600_000


class FaultSpecError(ValueError):
    """A fault request that does not describe a fault; the message says why."""


@dataclass(frozen=True)
class Fault:
    mode: str = "none"
    delay_ms: int = 0
    rate: float = 0.0
    block_loop: bool = False
    duration_ms: int = 30_000

    @classmethod
    def from_json(cls, body: Any) -> Fault:
        """Validate a request body.

        Raises:
            FaultSpecError: not an object, unknown mode, or a bad parameter.
        """
        if not isinstance(body, dict):
            raise FaultSpecError("body must be a JSON object")
        mode = body.get("mode")
        allowed = {"none", "slow", "error", "hang"}
        if mode not in allowed:
            raise FaultSpecError(f"'mode' must be one of {sorted(allowed)}, got {mode!r}")
        unknown = set(body) - {"mode", "delay_ms", "rate", "block_loop", "duration_ms"}
        if unknown:
            raise FaultSpecError(f"unknown fields: {sorted(unknown)}")
        if mode == "slow":
            return cls(mode, delay_ms=_int_field(body, "delay_ms", 0, MAX_DELAY_MS, required=True))
        if mode == "error":
            rate = body.get("rate")
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
                raise FaultSpecError(f"'rate' must be a number in 0..1, got {rate!r}")
            return cls(mode, rate=float(rate))
        if mode == "hang":
            block = body.get("block_loop", False)
            if not isinstance(block, bool):
                raise FaultSpecError(f"'block_loop' must be a boolean, got {block!r}")
            duration = _int_field(body, "duration_ms", 1, MAX_DELAY_MS, required=False)
            return cls(mode, block_loop=block, duration_ms=duration or 30_000)
        return cls()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode}
        if self.mode == "slow":
            out["delay_ms"] = self.delay_ms
        elif self.mode == "error":
            out["rate"] = self.rate
        elif self.mode == "hang":
            out["block_loop"] = self.block_loop
            if self.block_loop:
                out["duration_ms"] = self.duration_ms
        return out


def _int_field(body: dict[str, Any], name: str, low: int, high: int, *, required: bool) -> int:
    value = body.get(name)
    if value is None and not required:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FaultSpecError(f"'{name}' must be an integer in {low}..{high}, got {value!r}")
    return value


class FaultInjector:
    """Applies the current fault to a search request. Lives on the server's loop."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._fault = Fault()
        self._rng = rng or random.Random()
        self._released = asyncio.Event()
        self._released.set()

    @property
    def fault(self) -> Fault:
        return self._fault

    def set(self, fault: Fault) -> None:
        self._fault = fault
        if fault.mode == "hang" and not fault.block_loop:
            self._released.clear()
        else:
            self._released.set()

    async def apply(self) -> bool:
        """Delay, hang or block as the fault says; return True if the request must fail."""
        fault = self._fault
        if fault.mode == "slow":
            await asyncio.sleep(fault.delay_ms / 1000)
        elif fault.mode == "error":
            return self._rng.random() < fault.rate
        elif fault.mode == "hang":
            if fault.block_loop:
                # Deliberately blocks the event loop: the failure the agent's own thread
                # exists to catch. One-shot, so the server recovers by itself afterwards.
                self._fault = Fault()
                time.sleep(fault.duration_ms / 1000)  # noqa: ASYNC251 - the point of the fault
            else:
                await self._released.wait()
        return False

"""Injected faults, for simulating the failures the agent must catch.

``POST /admin/fault`` sets ``slow``, ``error``, ``hang`` (``block_loop``: the event loop
itself) or ``none``. Only ``/search`` is affected: health and admin endpoints keep
working, so a faulty server can still be looked at and repaired.

Design: docs/design/data-server.md, "The data server".
"""

from __future__ import annotations

import asyncio
import random
import reprlib
import time
from dataclasses import dataclass
from typing import Any

from discovery.errors import BadRequestError

__all__ = ["Fault", "FaultInjector", "FaultSpecError"]

MAX_DELAY_MS = 600_000


class FaultSpecError(BadRequestError):
    """A fault request that does not describe a fault; the message names the field.

    A :class:`~discovery.errors.BadRequestError`, so the server's middleware answers
    it with 400 and counts it under the field's name.
    """

    def __init__(self, field: str, message: str, reason: str = "invalid") -> None:
        super().__init__(field, reason, message)


_MODES = ("error", "hang", "none", "slow")
_FIELDS = frozenset({"mode", "delay_ms", "rate", "block_loop", "duration_ms"})


def _short(value: object) -> str:
    # The value is echoed in the 400 answer and may be anything a client sent: a
    # 60 KiB string or a deeply nested list (whose plain repr could even recurse
    # too deep). reprlib bounds both length and depth.
    shortener = reprlib.Repr()
    shortener.maxstring = shortener.maxother = 40
    shortener.maxlevel = 3
    try:
        text = shortener.repr(value)
    except ValueError:  # an int beyond Python's str() digit limit
        return "a value too large to show"
    # Depth and element counts are bounded, total length is not: clip it too.
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Fault:
    mode: str = "none"
    delay_ms: int = 0
    rate: float = 0.0
    block_loop: bool = False
    duration_ms: int = 30_000

    @classmethod
    def from_json(cls, body: Any) -> Fault:
        """Validate a decoded request body (any JSON value).

        Raises:
            FaultSpecError: not an object, unknown mode or field, or a bad parameter;
                never any other exception.
        """
        if not isinstance(body, dict):
            raise FaultSpecError("body", "body must be a JSON object", "not_object")
        mode = body.get("mode")
        # Checked as a string first: a list or object is unhashable and would make
        # the membership test itself raise.
        if not isinstance(mode, str) or mode not in _MODES:
            raise FaultSpecError(
                "mode", f"'mode' must be one of {list(_MODES)}, got {_short(mode)}"
            )
        unknown = set(body) - _FIELDS
        if unknown:
            names = ", ".join(sorted(_short(name) for name in unknown)[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise FaultSpecError("body", f"unknown fields: {names}{more}", "unknown_field")
        if mode == "slow":
            return cls(mode, delay_ms=_int_field(body, "delay_ms", 0, MAX_DELAY_MS, required=True))
        if mode == "error":
            rate = body.get("rate")
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
                raise FaultSpecError("rate", f"'rate' must be a number in 0..1, got {_short(rate)}")
            return cls(mode, rate=float(rate))
        if mode == "hang":
            block = body.get("block_loop", False)
            if not isinstance(block, bool):
                raise FaultSpecError(
                    "block_loop", f"'block_loop' must be a boolean, got {_short(block)}"
                )
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
        raise FaultSpecError(
            name, f"'{name}' must be an integer in {low}..{high}, got {_short(value)}"
        )
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

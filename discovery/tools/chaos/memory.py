"""A process's resident memory, read from ``/proc``: what hostile faults bound.

Its peak (``VmHWM``) is reset through ``/proc/<pid>/clear_refs`` (Linux 4.0 on; its owner or
root) when a fault starts, so the read at its end sees any spike. A process gone reads as
None and resets as False; nothing raises.

Development: docs/development.md, "The chaos run" (invariant 7).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Memory", "read_memory", "reset_peak"]

_PROC = Path("/proc")


@dataclass(frozen=True)
class Memory:
    """Bytes resident now (``rss``) and at the peak (``peak``) of one process."""

    rss: int
    peak: int


def read_memory(pid: int, *, proc: Path = _PROC) -> Memory | None:
    """``pid``'s resident memory, or None if it cannot be read."""
    try:
        text = (proc / str(pid) / "status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return parse_status(text)


def parse_status(text: str) -> Memory | None:
    """``VmRSS`` and ``VmHWM`` of a ``/proc/<pid>/status`` text (in kB there), in bytes;
    None when either is missing (a kernel thread, a zombie)."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            number, _, unit = value.strip().partition(" ")
            with contextlib.suppress(ValueError):
                fields[name] = int(number) * (1024 if unit.strip() == "kB" else 1)
    if "VmRSS" not in fields or "VmHWM" not in fields:
        return None
    return Memory(rss=fields["VmRSS"], peak=fields["VmHWM"])


def reset_peak(pid: int, *, proc: Path = _PROC) -> bool:
    """Set ``pid``'s ``VmHWM`` to its current ``VmRSS``; False if that is not possible."""
    try:
        (proc / str(pid) / "clear_refs").write_text("5\n", encoding="ascii")
    except OSError:
        return False
    return True

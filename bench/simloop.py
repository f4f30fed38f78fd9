"""An asyncio event loop on virtual time, for simulations of the real code.

:class:`VirtualTimeLoop` is asyncio's own selector loop (futures, tasks, ``call_soon``,
``call_at``/``call_later``, ``await``, ``asyncio.sleep`` and ``asyncio.timeout`` all
work as usual) with two changes: :meth:`~VirtualTimeLoop.time` is a virtual clock,
and when no callback is ready the loop does not wait for its next timer, it jumps
there. Time passes only between loop iterations, never while a callback runs, so a
simulation is exactly reproducible and costs what its callbacks cost, whatever the
time it simulates (an hour's ``asyncio.sleep`` takes one iteration). A run of the
real fan-out against a simulated cluster (``bench/bench_dispatch.py``) needs nothing
else.

What it cannot do: wait for anything outside the loop. It has no real I/O (its
selector reports no events) and no threads (``run_in_executor``, ``to_thread``):
a loop with nothing ready and no timer would wait forever, and raises
:class:`SimulationDeadlock` instead. Not thread-safe, as any event loop.

Why a subclass and not a loop of our own: the tasks and futures the fan-out uses are
asyncio's, bound to its loop internals (``_run_once`` ordering, the ready queue, the
timer heap, cancellation); a subclass keeps them exactly as in production, changing
only where the loop reads the clock and how long it would block.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

__all__ = ["SimulationDeadlock", "VirtualTimeLoop", "run"]

T = TypeVar("T")


class SimulationDeadlock(RuntimeError):
    """The virtual-time loop has no callback ready and no timer left: every task waits
    for something only the outside world (I/O, a thread) could bring."""


class _JumpingSelector(selectors.BaseSelector):
    """A selector that never reports an event and, instead of blocking for ``timeout``
    seconds, advances its loop's virtual clock by that much.

    It keeps the loop's registrations (the self-pipe every selector loop registers)
    so that the loop can open and close as usual; nothing registered is ever read.
    """

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if fd in self._keys:
            raise KeyError(f"{fileobj!r} (fd {fd}) is already registered")
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            # The loop computes no timeout only when nothing is ready and no timer is
            # scheduled: it would block until I/O or another thread wakes it.
            raise SimulationDeadlock(
                "nothing is ready and no timer is scheduled: the simulation waits for "
                "something outside the virtual-time loop (I/O, a thread), or for a "
                "future nobody will resolve"
            )
        if timeout > 0:
            self._loop._advance(timeout)
        return []

    def get_map(self) -> Mapping[FileDescriptorLike, selectors.SelectorKey]:
        return MappingProxyType(self._keys)  # type: ignore[arg-type]

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose :meth:`time` is virtual, starting at ``start``
    seconds, and which jumps to its next timer when nothing is ready (see the module
    doc). Raises :class:`SimulationDeadlock` from ``run_until_complete`` (and the like)
    when nothing is ready and no timer is left."""

    def __init__(self, start: float = 0.0) -> None:
        # Set before the base class's __init__, which may read the clock.
        self._virtual_now = float(start)
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        """The virtual time, in seconds: it moves only between loop iterations."""
        return self._virtual_now

    def _advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on: what blocking that long would have taken.

        The loop asked to block until its earliest timer, computed as ``when - now``;
        ``now + (when - now)`` may round a hair below ``when`` in floating point, which
        the loop's clock resolution covers (it fires timers due within it), and at
        worst costs one more iteration of a sub-nanosecond jump.
        """
        self._virtual_now += seconds


def run(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``main`` to its end on a new :class:`VirtualTimeLoop` starting at ``start``
    (as :func:`asyncio.run` runs it on a real loop: tasks left are cancelled and the
    loop closed); return its result or raise what it raised."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)

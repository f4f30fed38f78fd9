"""Admission of searches on a data server: a cap on the searches in progress at once.

Why a cap: a data server runs its searches on one event loop, in slices of about half a
millisecond that take turns (see :mod:`.searching`). An ordinary search finishes in its
first slice and is never in progress beside another; only expensive ones (a shard's most
frequent terms) and searches held by an injected fault overlap. Every overlapping search
slows all the others down, since they share the loop: past a few, each of them is cut by
its budget before it ends, and the server does more work for worse answers while its
queue, and every search server waiting on it, grows. So a search that arrives while
``limit`` searches are in progress is refused at once, before any search work (the data
server answers HTTP 429 with ``Retry-After``), and the search server that sent it can go
to another replica while this one catches up: a busy minute stays a busy minute.

Priority requests (the agent's health probes, marked by the header
:data:`discovery.agent.probes.PROBE_HEADER`) are never refused and not counted against
the cap: a full server must not fail its own health check because it is full, or load
alone would take it offline. They are still real searches on the same loop, so a
blocked loop still fails them. They are counted apart (:attr:`SearchAdmission.priority`),
so that :attr:`SearchAdmission.total` is every search in progress.

:class:`SearchAdmission` is a plain object with no I/O and no clock: the server asks it
(``try_enter``) before the search and tells it (``leave``) after, in a ``finally``. It is
not thread-safe: it lives on the server's event loop, like the searches it counts.

Failure behaviour: ``leave`` without a matching ``enter`` raises :class:`RuntimeError`
(a bug in the caller, never a state to go on from); nothing else raises.
"""

from __future__ import annotations

__all__ = ["SearchAdmission"]


class SearchAdmission:
    """At most ``limit`` searches in progress at once, priority ones aside.

    Raises:
        ValueError: ``limit`` is not a positive integer.
    """

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"the search limit must be a positive integer, got {limit!r}")
        self._limit = limit
        self._in_progress = 0
        self._priority = 0

    @property
    def limit(self) -> int:
        """The most searches (priority ones aside) in progress at once."""
        return self._limit

    @property
    def in_progress(self) -> int:
        """Searches admitted and not yet left, priority ones aside: the ones the cap counts."""
        return self._in_progress

    @property
    def priority(self) -> int:
        """Priority searches (probes) in progress."""
        return self._priority

    @property
    def total(self) -> int:
        """Every search in progress, priority ones included."""
        return self._in_progress + self._priority

    @property
    def full(self) -> bool:
        """Whether an ordinary search arriving now would be refused."""
        return self._in_progress >= self._limit

    def try_enter(self, *, priority: bool = False) -> bool:
        """Admit one search, or refuse it (False) when ``limit`` are in progress.

        A ``priority`` search is always admitted and counted apart. Each admission must
        be paired with exactly one :meth:`leave` with the same ``priority``.
        """
        if priority:
            self._priority += 1
            return True
        if self._in_progress >= self._limit:
            return False
        self._in_progress += 1
        return True

    def leave(self, *, priority: bool = False) -> None:
        """One admitted search (of the kind ``priority`` says) has ended.

        Raises:
            RuntimeError: no such search is in progress (an unpaired ``leave``).
        """
        if priority:
            if self._priority == 0:
                raise RuntimeError("leave(priority=True) without a priority search in progress")
            self._priority -= 1
            return
        if self._in_progress == 0:
            raise RuntimeError("leave() without a search in progress")
        self._in_progress -= 1

    def __repr__(self) -> str:
        return (
            f"SearchAdmission(limit={self._limit}, in_progress={self._in_progress}, "
            f"priority={self._priority})"
        )

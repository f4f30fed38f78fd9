"""Admission of searches on a data server: a cap on the searches in progress at once.

:class:`SearchAdmission` refuses an ordinary search once ``limit`` are in progress and
always admits a priority one (the agent's probe), counted apart. No I/O, no clock, not
thread-safe (the server's loop only); an unpaired ``leave`` raises :class:`RuntimeError`.

Design: docs/design/overload.md, "Overload is an answer, not a failure".
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

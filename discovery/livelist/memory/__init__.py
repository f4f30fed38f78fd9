"""The in-memory live-list store (:class:`MemoryLiveStore`), for tests and one-process use.

Design: docs/design/live-list.md, "The live-list store".
"""

from discovery.livelist.memory.state import MemoryList, MemorySpace
from discovery.livelist.memory.store import MemoryAdmin, MemoryLiveStore

__all__ = ["MemoryAdmin", "MemoryList", "MemoryLiveStore", "MemorySpace"]

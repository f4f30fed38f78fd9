"""The in-memory live-list store, for tests and for embedding in one process.

* :mod:`~discovery.livelist.memory.state`: the shared list and its fence.
* :mod:`~discovery.livelist.memory.publisher`: the fenced writer of one term.
* :mod:`~discovery.livelist.memory.follower`: a search server's copy of the list.
* :mod:`~discovery.livelist.memory.store`: :class:`MemoryLiveStore` and its admin.
"""

from discovery.livelist.memory.state import MemoryList, MemorySpace
from discovery.livelist.memory.store import MemoryAdmin, MemoryLiveStore

__all__ = ["MemoryAdmin", "MemoryList", "MemoryLiveStore", "MemorySpace"]

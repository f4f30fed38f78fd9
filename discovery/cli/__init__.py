"""Command-line plumbing shared by the entry points: option tables, logging, stop signals.

The library never imports this package: an embedding application builds its settings in
code.

Design: docs/ARCHITECTURE.md, "Packages and layers".
"""

__all__: list[str] = []

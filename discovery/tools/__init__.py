"""The ``discovery`` operator command and its subcommands; the library never imports them.

Commands: docs/design/modules.md, "Commands"; operating them: docs/operating.md.
"""

__all__: list[str] = []

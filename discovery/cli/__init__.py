"""Command-line plumbing shared by every entry point: ``discovery``, ``data-server`` and
``search-server``.

* :mod:`discovery.cli.options` — every setting as a flag and an environment variable
  (one :class:`~discovery.cli.options.Option` table per concern) and the builders of the
  library's frozen settings (:mod:`discovery.config`) from a parsed namespace;
* :mod:`discovery.cli.entrypoint` — logging and stop signals, configured only by entry
  points.

The library never imports this package: an application that embeds the agent builds
:class:`~discovery.config.ZkConfig` and friends in code. The ``discovery`` operator
command itself is :mod:`discovery.tools.main`.
"""

__all__: list[str] = []

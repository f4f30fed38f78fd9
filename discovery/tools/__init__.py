"""The ``discovery`` operator command and what each subcommand does.

* :mod:`~discovery.tools.main` — the command (``discovery = discovery.tools.main:main``);
* :mod:`~discovery.tools.status` — ``status``: what is registered, who leads, what is
  published, and how they differ;
* :mod:`~discovery.tools.zkinit` — ``zk-init`` and ``zk-digest``: our ZooKeeper tree
  with access control;
* :mod:`~discovery.tools.devcluster` — ``devcluster``: a local ZooKeeper and Redis
  (:mod:`discovery.testing`) until Ctrl+C;
* :mod:`~discovery.tools.demo` — ``demo``: the 100-node demo and its failure scenario;
* :mod:`~discovery.tools.chaos` — ``chaos``: seeded faults under load, invariants checked.

Tools use the library and :mod:`discovery.testing`; the library never imports them.
"""

__all__: list[str] = []

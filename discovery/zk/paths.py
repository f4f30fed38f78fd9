"""The ZooKeeper paths of the contract in one place (docs/contracts.md, "ZooKeeper").

All paths are relative to the cluster's chroot, if the hosts string names one.
"""

from __future__ import annotations

__all__ = [
    "DATA_SERVERS_PATH",
    "MAINTENANCE_PATH",
    "SEARCH_ELECTION_PATH",
    "SEARCH_MEMBERS_PATH",
]

#: One EPHEMERAL child per data server, holding its ServiceInstance JSON.
DATA_SERVERS_PATH = "/data_servers"
#: One PERSISTENT child per data server an operator put in maintenance
#: (``discovery maint``), holding a JSON marker with the reason; the leader publishes
#: that server as ``maintenance`` until the marker is deleted.
MAINTENANCE_PATH = "/maintenance"
#: The search servers' leader-election recipe nodes.
SEARCH_ELECTION_PATH = "/search_servers/election"
#: One EPHEMERAL child per search server, for status and the dashboard.
SEARCH_MEMBERS_PATH = "/search_servers/members"

"""A search server: follows the data servers and, later, fans queries out to them.

For now it watches ``/data_servers`` directly and shows its view at ``/cluster``;
leader election, publishing to Redis and the fan-out come with the search-server
issue (only the leader will watch ZooKeeper then).
"""

__all__: list[str] = []

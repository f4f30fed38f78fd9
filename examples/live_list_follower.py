"""Follow the live list from any Python service, and print each change.

What it shows: the list the search servers' leader publishes to Redis, followed the way
the search servers follow it: one consistent load, then each change as it happens
(:meth:`discovery.LiveListFollower.changes`). Read-only, so a Redis user with the
reader's ACL rules is enough. The first change is the whole list, all of it added; then
one line per server added, changed (``state: draining`` when it leaves) or removed
(with the leader's reason). ``follower.current`` is the whole list at any time, and
``follower.current.routable`` the servers a search server would query.

Run it against ``discovery devcluster`` (paste the ``export`` lines it prints first),
with a search server leading (``search-server``, or examples/custom_picker.py) and a
data server or two registered (examples/aiohttp_data_server.py)::

    python examples/live_list_follower.py --cluster default
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os

from discovery import ClusterConfig, open_store


async def follow(cluster: ClusterConfig) -> None:
    async with (
        open_store(cluster, read_only=True) as store,  # the store the URL names
        store.follower() as follower,
    ):
        async for change in follower.changes():  # the first one: the whole list, added
            live = change.current
            source = f"leader {live.leader}" if live.version else "nothing published yet"
            print(f"list {live.epoch}.{live.version} ({source})", flush=True)
            for instance in change.added.values():
                print("added", instance.id, instance.address, instance.port, flush=True)
            for instance in change.changed.values():
                state, reason = instance.payload.state.value, instance.payload.reason or ""
                print("changed", instance.id, state, reason, flush=True)
            for instance_id, reason in change.removed.items():
                print("removed", instance_id, "-", reason, flush=True)
            print(f"  {len(follower.current.routable)} routable", flush=True)


def main() -> None:
    env = os.environ.get
    parser = argparse.ArgumentParser(description="Print the live list's changes.")
    redis = env("DISCOVERY_REDIS_URL", "redis://127.0.0.1:6379/0")
    parser.add_argument("--redis", default=redis, help="Redis URL ($DISCOVERY_REDIS_URL)")
    cluster = env("DISCOVERY_CLUSTER", "default")
    parser.add_argument("--cluster", default=cluster, help="cluster name ($DISCOVERY_CLUSTER)")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C: stop quietly
        asyncio.run(follow(ClusterConfig(cluster=args.cluster, redis_url=args.redis)))


if __name__ == "__main__":
    main()

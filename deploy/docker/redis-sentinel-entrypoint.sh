#!/bin/sh
# Write a sentinel.conf from the environment and run Redis Sentinel in the foreground.
# Sentinel rewrites its file as it learns the topology, so it lives in a writable place.
#
#   SENTINEL_MASTER_NAME  the primary's name, as clients ask for it (default: discovery)
#   SENTINEL_MASTER_HOST  where the primary starts (a compose service name)
#   SENTINEL_QUORUM       sentinels that must agree the primary is down (default 2)
#   SENTINEL_DOWN_AFTER_MS, SENTINEL_FAILOVER_TIMEOUT_MS
#   SENTINEL_ANNOUNCE     this sentinel's own name on the network
set -eu

NAME=${SENTINEL_MASTER_NAME:-discovery}
CONF=/conf/sentinel.conf
cat >"$CONF" <<CONF
port 26379
protected-mode no
dir /data
# Names, not addresses, in the configuration and in answers to clients: a restarted
# container comes back at another address under the same name.
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
${SENTINEL_ANNOUNCE:+sentinel announce-ip $SENTINEL_ANNOUNCE}
sentinel monitor $NAME ${SENTINEL_MASTER_HOST:?SENTINEL_MASTER_HOST is required} 6379 ${SENTINEL_QUORUM:-2}
sentinel down-after-milliseconds $NAME ${SENTINEL_DOWN_AFTER_MS:-5000}
sentinel failover-timeout $NAME ${SENTINEL_FAILOVER_TIMEOUT_MS:-30000}
sentinel parallel-syncs $NAME 1
CONF
exec redis-sentinel "$CONF"

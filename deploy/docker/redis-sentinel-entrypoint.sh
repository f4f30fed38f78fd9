#!/bin/sh
# Write a sentinel.conf from the environment and the container's secrets, and run Redis
# Sentinel in the foreground. Sentinel rewrites its file as it learns the topology, so
# it lives in a writable place (0600: it holds passwords).
#
#   SENTINEL_MASTER_NAME  the primary's name, as clients ask for it (default: discovery)
#   SENTINEL_MASTER_HOST  where the primary starts (a compose service name)
#   SENTINEL_QUORUM       sentinels that must agree the primary is down (default 2)
#   SENTINEL_DOWN_AFTER_MS, SENTINEL_FAILOVER_TIMEOUT_MS
#   SENTINEL_ANNOUNCE     this sentinel's own name on the network
#   SENTINEL_PASSWORD_FILE   the sentinels' own password, requirepass: every client
#                            and every other sentinel authenticates with it
#                            (default /run/secrets/sentinel_admin)
#   SENTINEL_USERS_FILE      ACL `user` lines of clients that may ask less (hashed;
#                            default /run/secrets/sentinel_users)
#   SENTINEL_AUTH_USER       the Redis nodes' user for Sentinel (default: sentinel)
#   SENTINEL_AUTH_PASS_FILE  its password (default /run/secrets/redis_sentinel)
set -eu

NAME=${SENTINEL_MASTER_NAME:-discovery}
PASSWORD_FILE=${SENTINEL_PASSWORD_FILE:-/run/secrets/sentinel_admin}
USERS=${SENTINEL_USERS_FILE:-/run/secrets/sentinel_users}
AUTH_PASS_FILE=${SENTINEL_AUTH_PASS_FILE:-/run/secrets/redis_sentinel}
for file in "$PASSWORD_FILE" "$USERS" "$AUTH_PASS_FILE"; do
    [ -r "$file" ] || { echo "sentinel: no secret file $file (make compose-secrets)" >&2; exit 1; }
done
PASSWORD=$(cat "$PASSWORD_FILE")
AUTH_PASS=$(cat "$AUTH_PASS_FILE")
for secret in "$PASSWORD" "$AUTH_PASS"; do
    case $secret in
    "" | *[!A-Za-z0-9._~+/=-]*)
        echo "sentinel: passwords must be of [A-Za-z0-9._~+/=-]" >&2
        exit 1
        ;;
    esac
done

CONF=/conf/sentinel.conf
umask 077
cat >"$CONF" <<CONF
port 26379
# With a password on the default user, protected mode refuses nobody who has it.
protected-mode yes
requirepass $PASSWORD
dir /data
# Names, not addresses, in the configuration and in answers to clients: a restarted
# container comes back at another address under the same name.
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
${SENTINEL_ANNOUNCE:+sentinel announce-ip $SENTINEL_ANNOUNCE}
sentinel monitor $NAME ${SENTINEL_MASTER_HOST:?SENTINEL_MASTER_HOST is required} 6379 ${SENTINEL_QUORUM:-2}
sentinel auth-user $NAME ${SENTINEL_AUTH_USER:-sentinel}
sentinel auth-pass $NAME $AUTH_PASS
sentinel down-after-milliseconds $NAME ${SENTINEL_DOWN_AFTER_MS:-5000}
sentinel failover-timeout $NAME ${SENTINEL_FAILOVER_TIMEOUT_MS:-30000}
sentinel parallel-syncs $NAME 1
CONF
cat "$USERS" >>"$CONF"
exec redis-sentinel "$CONF"

#!/bin/sh
# Write a redis.conf with the ACL users and replication credentials from the container's
# secrets, then run redis-server with it and this script's arguments (--replicaof ...).
#
#   REDIS_USERS_FILE        ACL `user` lines (passwords as SHA-256), the default user's
#                           among them (default /run/secrets/redis_users)
#   REDIS_MASTERUSER        the user a replica authenticates to its primary with (replica)
#   REDIS_MASTERAUTH_FILE   that user's password (default /run/secrets/redis_replica)
#
# Every node gets masterauth: after a failover any of them may be a replica. Protected
# mode stays on: with a password on the default user it refuses nobody who has one.
set -eu

USERS=${REDIS_USERS_FILE:-/run/secrets/redis_users}
AUTH_FILE=${REDIS_MASTERAUTH_FILE:-/run/secrets/redis_replica}
[ -r "$USERS" ] || { echo "redis: no ACL users file $USERS (make compose-secrets)" >&2; exit 1; }
[ -r "$AUTH_FILE" ] || { echo "redis: no password file $AUTH_FILE (make compose-secrets)" >&2; exit 1; }
grep -q '^user default ' "$USERS" || { echo "redis: $USERS defines no default user" >&2; exit 1; }
MASTERAUTH=$(cat "$AUTH_FILE")
case $MASTERAUTH in
"" | *[!A-Za-z0-9._~+/=-]*)
    echo "redis: $AUTH_FILE must hold a password of [A-Za-z0-9._~+/=-]" >&2
    exit 1
    ;;
esac

CONF=/conf/redis.conf
umask 077
{
    echo "protected-mode yes"
    echo "masteruser ${REDIS_MASTERUSER:-replica}"
    echo "masterauth $MASTERAUTH"
    cat "$USERS"
} >"$CONF"
exec redis-server "$CONF" "$@"

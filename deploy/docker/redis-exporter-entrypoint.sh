#!/bin/sh
# Run prometheus-redis-exporter with its password read from a file: in its environment
# (REDIS_PASSWORD), not on its command line, which ps shows.
#
#   REDIS_EXPORTER_PASSWORD_FILE  the password (default /run/secrets/redis_monitor)
set -eu

FILE=${REDIS_EXPORTER_PASSWORD_FILE:-/run/secrets/redis_monitor}
[ -r "$FILE" ] || { echo "redis-exporter: no password file $FILE (make compose-secrets)" >&2; exit 1; }
REDIS_PASSWORD=$(cat "$FILE")
export REDIS_PASSWORD
exec prometheus-redis-exporter "$@"

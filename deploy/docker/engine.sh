#!/bin/sh
# Make sure a Docker engine answers: on a machine with none (as here: root, no systemd),
# install Debian's docker.io and start dockerd in the background (base-image.sh installs
# debootstrap when it needs it).
# Where an engine already runs, this does nothing.
set -eu

if docker info >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "no Docker engine answers; start one (or run as root to have it started)" >&2
    exit 1
fi
missing=""
command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
if [ -n "$missing" ]; then
    echo "installing Debian packages:$missing"
    apt-get update -qq
    # shellcheck disable=SC2086  # a list of packages
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
fi
echo "starting dockerd (log: /var/log/dockerd.log)"
nohup dockerd >/var/log/dockerd.log 2>&1 &
tries=0
until docker info >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -gt 60 ]; then
        echo "dockerd did not answer within 60 s; its log:" >&2
        tail -n 20 /var/log/dockerd.log >&2
        exit 1
    fi
    sleep 1
done

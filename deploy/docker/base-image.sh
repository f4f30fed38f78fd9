#!/bin/sh
# Make sure the Debian base image the project's images start FROM exists locally.
#
# Usage: deploy/docker/base-image.sh [IMAGE]   (default debian:bookworm-slim)
#
# 1. Already in the local image store: nothing to do.
# 2. A registry answers: `docker pull` it.
# 3. No registry can be reached (a closed network that still reaches Debian's package
#    mirror): bootstrap a minimal bookworm with debootstrap and `docker import` it under
#    the same tag, and say so. Only the Debian mirror is needed.
#
# DEBIAN_MIRROR overrides the mirror (default http://deb.debian.org/debian).
set -eu

IMAGE=${1:-debian:bookworm-slim}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE: present"
    exit 0
fi

if docker pull "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE: pulled from the registry"
    exit 0
fi

echo "base image $IMAGE: no registry reachable; bootstrapping Debian $SUITE with debootstrap" \
     "from $MIRROR and importing it with docker import (this takes a few minutes)"
# Installed here, not only by engine.sh: most users already run an engine, and then
# engine.sh has nothing to do.
if ! command -v debootstrap >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "debootstrap is not installed: apt-get install debootstrap (as root)" >&2
        exit 1
    fi
    echo "installing Debian package: debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
fi

ROOTFS=$(mktemp -d "${TMPDIR:-/tmp}/discovery-rootfs.XXXXXX")
trap 'rm -rf "$ROOTFS"' EXIT INT TERM

debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
    echo "debootstrap failed; its log:" >&2
    tail -n 30 "$ROOTFS.log" >&2
    rm -f "$ROOTFS.log"
    exit 1
}
rm -f "$ROOTFS.log"

# What the official slim image does: the same three suites, no documentation or
# translations installed by later apt-get runs, no package lists or caches kept.
cat >"$ROOTFS/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
SOURCES
cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/docker-slim" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
DPKG
cat >"$ROOTFS/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT
echo 'Acquire::Languages "none";' >"$ROOTFS/etc/apt/apt.conf.d/docker-no-languages"
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin

tar --numeric-owner -C "$ROOTFS" -c . \
    | docker import --change 'CMD ["bash"]' --change 'ENV LANG=C.UTF-8' \
        --message "debootstrap --variant=minbase $SUITE $MIRROR" - "$IMAGE" >/dev/null
echo "base image $IMAGE: imported from debootstrap ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"

#!/usr/bin/env bash
# The test suite on Python 3.13: a Debian trixie root, made with debootstrap, that runs
# this repository's tests with trixie's python3 (3.13), ZooKeeper, Redis and Java.
#
# Usage (ensure and run as root):
#   deploy/py313/root.sh ensure [--full]        make or refresh the root and its venv
#   deploy/py313/root.sh run [--full] CMD ARG.. ensure, then run CMD in the root
#   deploy/py313/root.sh remove                 delete the root
#
# `make test-py313` and `make test-py313-ci` use it. `--full` adds the packages of
# packages-full (Chromium, docker-compose) for the browser and docker tiers.
#
# Where: PY313_ROOT (default /var/cache/search-discovery/trixie-root), outside the
# repository. DEBIAN_MIRROR overrides the mirror (default http://deb.debian.org/debian).
#
# Cached: the root is made once (debootstrap --variant=minbase, then apt-get install of
# `packages`), in PY313_ROOT.new, and renamed into place when complete; its stamp holds
# the hash of this script and of the list in `packages`, and a change of either makes
# it anew. The
# full tier's packages are added to it when first asked for (a stamp of their own). The
# venv (/opt/venv in the root) has the project installed editable from /src, which is
# where the repository is mounted at run time, with its `dev` extra; it is installed
# again when pyproject.toml changes (a stamp with its hash).
#
# Running: in a mount and PID namespace of its own (unshare), the root gets a fresh
# /proc, /sys and /dev from the host, a fresh tmpfs on /tmp and /dev/shm, the host's
# resolv.conf, and the repository bind-mounted read-write at /src; CMD runs there
# (chroot) in /src, with a clean environment: PATH starts with the venv's bin, and
# Python's bytecode cache is kept in the root (PYTHONPYCACHEPREFIX), not in the
# repository. Every mount belongs to that namespace only: when CMD ends, however it
# ends (Ctrl-C, a failure, SIGKILL of the script), the kernel ends every process left
# in the namespace (servers included) and the mounts with it; nothing is ever mounted
# in the host's namespace. The host's .venv is never used.
#
# Not in the root: iproute2 and iptables. The network partition tests would build
# their bridges and FORWARD rule in the machine's own network namespace, which the
# root shares; they skip there ("ip is not installed") and run in `make test` (3.11).
#
# A lock (PY313_ROOT.lock) keeps concurrent runs and a rebuild apart: a run holds it
# shared, making or changing the root holds it exclusively.
#
# Deleting: only what this script made. A root gets a marker file (.search-discovery-root
# at its top) the moment its directory is created, before debootstrap writes anything;
# `remove`, a rebuild after a stamp change and a leftover PY313_ROOT.new are deleted only
# with that marker (an empty directory is removed with rmdir). So PY313_ROOT=/srv by
# mistake is refused, naming PY313_ROOT, and /srv is left alone. A root made before the
# marker existed is refused too: delete it by hand once.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
REPO=$(cd "$HERE/../.." && pwd)
ROOT=${PY313_ROOT:-/var/cache/search-discovery/trixie-root}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie
PYTHON_VERSION=3.13
VENV=/opt/venv
SRC=/src
LOCK="$ROOT.lock"
MARKER=.search-discovery-root

say() { echo "py313: $*" >&2; }
die() {
    say "$*"
    exit 1
}

packages() { grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$1"; }

# The stamps: what the root, its full tier and its venv were made from.
root_hash() { { cat "$SELF" && packages "$HERE/packages"; } | sha256sum | cut -d' ' -f1; }
full_hash() { packages "$HERE/packages-full" | sha256sum | cut -d' ' -f1; }
venv_hash() { sha256sum <"$REPO/pyproject.toml" | cut -d' ' -f1; }
stamp_is() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# The mount points at or under a directory (in this namespace), deepest first.
mounts_in() { findmnt -rn -o TARGET | awk -v d="$1" '$0 == d || index($0, d "/") == 1' | sort -r; }

# Refuse (exit 1) unless $1 is absent, empty, or a root this script made (its marker).
require_ours() {
    local dir=$1
    [ -e "$dir" ] || [ -L "$dir" ] || return 0
    if [ -d "$dir" ] && [ ! -L "$dir" ]; then
        [ ! -f "$dir/$MARKER" ] || return 0
        [ -n "$(ls -A "$dir")" ] || return 0
    fi
    die "PY313_ROOT=$ROOT: $dir is not a root this script made (no $MARKER in it); not" \
        "deleting it. Point PY313_ROOT at a directory of its own (default" \
        "/var/cache/search-discovery/trixie-root), or delete $dir yourself if it is an" \
        "old root"
}

# rm -rf of a root this script made (require_ours), refusing if anything is mounted in
# it (in this namespace); an empty directory without the marker is only rmdir-ed.
remove_tree() {
    local dir=$1
    [ -e "$dir" ] || [ -L "$dir" ] || return 0
    require_ours "$dir"
    [ -z "$(mounts_in "$dir")" ] || die "$dir has something mounted in it; not deleting it"
    if [ ! -f "$dir/$MARKER" ]; then
        rmdir "$dir"
        return
    fi
    rm -rf --one-file-system "$dir"
}

# --- in a namespace of our own ---------------------------------------------------------

# Run this script's `inside` part in a fresh mount and PID namespace: when it ends, the
# kernel kills whatever it left running there and drops every mount it made.
in_namespace() {
    unshare --mount --propagation private --pid --fork --kill-child -- "$SELF" __inside "$@"
}

# Mount what a process in the root needs; the repository at /src if given.
mount_root() {
    local root=$1 repo=${2:-}
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
    # The host's network namespace is the root's: its names too (`localhost` may be
    # 127.0.0.1 alone on the host, and ::1 as well in a fresh root's /etc/hosts).
    local file
    for file in resolv.conf hosts; do
        if [ -L "$root/etc/$file" ] || [ ! -f "$root/etc/$file" ]; then
            rm -f "$root/etc/$file"
            : >"$root/etc/$file"
        fi
        mount --bind "$(readlink -f "/etc/$file")" "$root/etc/$file"
    done
    if [ -n "$repo" ]; then
        mkdir -p "$root$SRC"
        mount --bind "$repo" "$root$SRC"
    fi
}

# The namespace dies with us and takes its mounts along; this only makes it explicit.
unmount_root() {
    local root=$1 target
    mounts_in "$root" | while read -r target; do
        umount -l "$target" 2>/dev/null || true
    done
}

inside() {
    local root=$1 repo=$2
    shift 2
    # shellcheck disable=SC2064  # the root as it is now
    trap "unmount_root '$root'" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    mount_root "$root" "$repo"
    local env=(
        "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        HOME=/root
        LANG=C.UTF-8
        "TERM=${TERM:-dumb}"
        DEBIAN_FRONTEND=noninteractive
        PYTHONPYCACHEPREFIX=/var/cache/pycache
        # trixie's CA bundle, which includes the host's own CAs (copied in at build)
        PIP_CERT=/etc/ssl/certs/ca-certificates.crt
        PIP_DISABLE_PIP_VERSION_CHECK=1
        "PIP_DEFAULT_TIMEOUT=${PIP_DEFAULT_TIMEOUT:-60}"
    )
    local name
    for name in CI PIP_INDEX_URL PIP_EXTRA_INDEX_URL http_proxy https_proxy no_proxy \
        HTTP_PROXY HTTPS_PROXY NO_PROXY; do
        if [ -n "${!name:-}" ]; then env+=("$name=${!name}"); fi
    done
    local dir=/
    [ -z "$repo" ] || dir=$SRC
    local status=0
    # shellcheck disable=SC2016  # expanded by the root's sh
    chroot "$root" /usr/bin/env -i "${env[@]}" /bin/sh -c 'cd "$0" && exec "$@"' "$dir" "$@" ||
        status=$?
    return "$status"
}

# --- making the root -------------------------------------------------------------------

need_debootstrap() {
    command -v debootstrap >/dev/null 2>&1 && return 0
    say "installing Debian package: debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
}

# debootstrap, then trixie's packages and an empty venv, in ROOT.new; renamed to ROOT.
build_root() {
    local new="$ROOT.new" log="$ROOT.new.log" started=$SECONDS
    # Before minutes of work: the old root must be ours to replace.
    require_ours "$ROOT"
    need_debootstrap
    remove_tree "$new"
    mkdir -p "$(dirname "$ROOT")"
    # The marker first, so that whatever is left of a failed build is ours to delete.
    mkdir "$new"
    echo "a Debian $SUITE root made by $SELF; deleted by its remove" >"$new/$MARKER"
    say "making the Debian $SUITE root in $ROOT (debootstrap from $MIRROR; a few minutes)"
    # debootstrap mounts /proc and /sys in the root itself: in a namespace, so that none
    # of it outlives the run, whatever happens to it.
    if ! unshare --mount --propagation private --pid --fork --kill-child -- \
        debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$new" "$MIRROR" \
        >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "debootstrap failed (log: $log)"
    fi
    rm -f "$log"

    cat >"$new/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
SOURCES
    # No documentation, manual pages or translations; no package lists kept around.
    cat >"$new/etc/dpkg/dpkg.cfg.d/01-nodoc" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
DPKG
    echo 'Acquire::Languages "none";' >"$new/etc/apt/apt.conf.d/01-no-languages"
    # Services are started by the tests, never by a package's maintainer scripts.
    printf '#!/bin/sh\nexit 101\n' >"$new/usr/sbin/policy-rc.d"
    chmod 755 "$new/usr/sbin/policy-rc.d"
    # The host's own CAs (a TLS-inspecting proxy's, say) are trusted in the root too.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        mkdir -p "$new/usr/local/share/ca-certificates"
        cp /usr/local/share/ca-certificates/*.crt "$new/usr/local/share/ca-certificates/"
    fi

    # shellcheck disable=SC2046  # one word per package
    in_namespace "$new" "" sh -c '
        set -eu
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "$@" >/dev/null
        update-ca-certificates >/dev/null 2>&1
        apt-get clean
        rm -rf /var/lib/apt/lists/*
        python3 -m venv '"$VENV"'
        '"$VENV"'/bin/python -m pip install -q --upgrade pip
    ' packages $(packages "$HERE/packages")
    local version
    version=$(chroot "$new" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$version" = "$PYTHON_VERSION" ] || die "$SUITE's python3 is $version, not $PYTHON_VERSION"

    root_hash >"$new/.stamp"
    remove_tree "$ROOT"
    mv "$new" "$ROOT"
    say "root made in $((SECONDS - started)) s: Python $version, $(du -sh "$ROOT" | cut -f1)"
}

add_full_tier() {
    local started=$SECONDS
    say "adding the full tier's packages to the root: $(packages "$HERE/packages-full" | xargs)"
    # shellcheck disable=SC2046  # one word per package
    in_namespace "$ROOT" "" sh -c '
        set -eu
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "$@" >/dev/null
        apt-get clean
        rm -rf /var/lib/apt/lists/*
    ' packages $(packages "$HERE/packages-full")
    full_hash >"$ROOT/.stamp-full"
    say "full tier added in $((SECONDS - started)) s"
}

install_project() {
    local started=$SECONDS
    say "installing the project with its dev extra into the root's venv (pip)"
    in_namespace "$ROOT" "$REPO" "$VENV/bin/python" -m pip install -q -e "${SRC}[dev]"
    venv_hash >"$ROOT$VENV/.installed"
    say "venv ready in $((SECONDS - started)) s"
}

root_current() { stamp_is "$ROOT/.stamp" "$(root_hash)"; }
full_current() { stamp_is "$ROOT/.stamp-full" "$(full_hash)"; }
venv_current() { stamp_is "$ROOT$VENV/.installed" "$(venv_hash)"; }

up_to_date() {
    local full=$1
    root_current && venv_current && { [ "$full" = 0 ] || full_current; }
}

# Make whatever is missing or stale, under the exclusive lock.
ensure() {
    local full=$1
    up_to_date "$full" && return 0
    exec {lock}>"$LOCK"
    flock -x "$lock"
    root_current || build_root
    if [ "$full" = 1 ] && ! full_current; then add_full_tier; fi
    venv_current || install_project
    exec {lock}>&-
}

run() {
    local full=$1
    shift
    [ $# -gt 0 ] || die "run: no command"
    ensure "$full"
    exec {lock}>"$LOCK"
    flock -s "$lock"
    up_to_date "$full" || die "the root changed while starting; run again"
    local status=0
    in_namespace "$ROOT" "$REPO" "$@" || status=$?
    if [ -n "$(mounts_in "$ROOT")" ]; then
        say "warning: mounts left in $ROOT: $(mounts_in "$ROOT" | xargs)"
    fi
    return "$status"
}

main() {
    [ $# -gt 0 ] || die "usage: $0 ensure|run|remove [--full] [CMD...]"
    local command=$1
    shift
    if [ "$command" = __inside ]; then
        inside "$@"
        return
    fi
    # `remove` needs no more rights than the root's files ask (its tests run it unprivileged).
    if [ "$command" != remove ]; then
        [ "$(id -u)" = 0 ] || die "must run as root (debootstrap, mount, chroot)"
    fi
    mkdir -p "$(dirname "$ROOT")"
    local full=0
    if [ "${1:-}" = --full ]; then
        full=1
        shift
    fi
    case "$command" in
    ensure) ensure "$full" ;;
    run) run "$full" "$@" ;;
    remove)
        exec {lock}>"$LOCK"
        flock -x "$lock"
        remove_tree "$ROOT.new"
        remove_tree "$ROOT"
        ;;
    *) die "unknown command $command (ensure, run, remove)" ;;
    esac
}

main "$@"

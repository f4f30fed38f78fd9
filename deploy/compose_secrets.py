"""``make compose-secrets``: the credentials docker-compose.yml mounts, made on first use.

Usage: ``python deploy/compose_secrets.py [--dir deploy/compose/secrets] [--cluster demo]``.
``make image`` (and so ``make compose-check``) runs it first.

Each file is one compose secret, mounted only into the containers that need it
(docker-compose.yml's ``secrets:`` of each service). A password is made once, at random,
and kept: running this again changes nothing, so a ZooKeeper that was given the
identities keeps accepting them. What is derived from the passwords (the hashed ZooKeeper
identities zk-init grants, the Redis and Sentinel ACL lines) is written again each time.
Never committed: the directory is in .gitignore and .dockerignore.

The directory is 0700 so that no other user of the machine reaches the files; the files
are 0644 because compose mounts them as they are (no owner or mode of their own without
Swarm) and each container reads its secrets as its own non-root user.

==================== ===================================================== =====================
file                 what                                                  mounted in
==================== ===================================================== =====================
zk_admin             ZooKeeper admin ``admin:PASSWORD``                    zk-init
zk_data              the data servers' ``data:PASSWORD``                   fleet-1, fleet-2
zk_search            the search servers' ``search:PASSWORD``               search-1..3
zk_data_digest       ``digest:data:HASH`` (no password)                    zk-init
zk_search_digest     ``digest:search:HASH``                                zk-init
redis_users          ACL lines (hashed): default, reader, publisher,       redis-1, redis-2
                     replica, sentinel, monitor
redis_replica        the ``replica`` user's password (replication)        redis-1, redis-2
redis_reader         the ``reader`` user's password                        search-1..3
redis_publisher      the ``publisher`` user's password                     search-1..3
redis_sentinel       the ``sentinel`` user's password (Sentinel's link     sentinel-1..3
                     to the Redis nodes)
sentinel_admin       the sentinels' own password (``requirepass``)         sentinel-1..3
sentinel_users       ACL lines (hashed) of the sentinels: discovery,       sentinel-1..3
                     monitor
sentinel_discovery   the ``discovery`` sentinel user's password: asks     search-1..3
                     where the primary is, nothing else
redis_monitor        the ``monitor`` user's password (Redis and Sentinel)  redis-exporter
redis_admin          the ``default`` Redis user's password (operators)     none
==================== ===================================================== =====================

ZooKeeper serves clients over TLS only, requiring a client certificate
(``ssl.clientAuth=need``), and its members speak TLS to each other; two CAs, made here:

========================= ================================================ ====================
file                      what                                             mounted in
========================= ================================================ ====================
zk_ca.crt                 the clients' CA: signs the members' client-port  every ZooKeeper
                          certificates and every client certificate        member and client
zk_ca.key                 its key                                          none
zk1.pem .. zk3.pem        a member's key and certificate (``DNS:zkN``,     zk1 .. zk3, each
                          by zk_ca) for its client port 2281               its own
zk_quorum_ca.crt          the quorum CA: signs the members' quorum         zk1 .. zk3
                          certificates, nothing else
zk_quorum_ca.key          its key                                          none
zk1_quorum.pem ..         a member's key and certificate (server and      zk1 .. zk3, each
                          client use, by zk_quorum_ca) for ports 2888 and  its own
                          3888
zk_client_ROLE.crt/.key   a client certificate and key (by zk_ca), one     the role's
                          per role: ``init`` (zk-init), ``data``           containers
                          (fleets), ``search`` (search servers),
                          ``exporter`` (zk-exporter), ``check`` (the
                          observer of ``make compose-check``)
========================= ================================================ ====================

The client certificate proves only that a container may speak to ZooKeeper at all;
what it may do there is still its digest identity's (the ACLs zk-init sets). A
certificate is kept while it is signed by its CA and valid for 30 more days, and made
again otherwise (a CA made again: every certificate it signs too). The ``.key`` files of
the CAs stay 0600 and are mounted nowhere.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

from discovery.config import ClusterConfig
from discovery.livelist.redis.conn import acl_user_line, publisher_acl_rules, reader_acl_rules
from discovery.testing.tls import Authority, Usage, issue, make_authority, signed_by, valid_for
from discovery.tools.zkdigest import DigestId

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "deploy" / "compose" / "secrets"

#: Files holding one random password each (ZooKeeper ones as ``user:password``).
PASSWORDS = {
    "zk_admin": "admin",
    "zk_data": "data",
    "zk_search": "search",
    "redis_admin": None,
    "redis_reader": None,
    "redis_publisher": None,
    "redis_replica": None,
    "redis_sentinel": None,
    "redis_monitor": None,
    "sentinel_admin": None,
    "sentinel_discovery": None,
}
#: Files derived from the passwords, written again at every run.
DERIVED = ("zk_data_digest", "zk_search_digest", "redis_users", "sentinel_users")

#: The ZooKeeper members (their host names, as every client's --zk writes them).
ZK_MEMBERS = ("zk1", "zk2", "zk3")
#: ZooKeeper client roles, one certificate each (see the module docstring).
ZK_CLIENTS = ("init", "data", "search", "exporter", "check")
#: Validity of the CAs and of the certificates they sign, in days; a certificate valid
#: for less than RENEW_DAYS more is made again.
CA_DAYS = 3650
CERT_DAYS = 397
RENEW_DAYS = 30

#: What a replica needs of its primary (Redis's documented minimum).
REPLICA_RULES = "resetkeys resetchannels -@all +psync +replconf +ping"
#: What a sentinel needs of the Redis nodes it watches and fails over (Redis's documented
#: list for a Sentinel ACL user).
SENTINEL_RULES = (
    "resetkeys allchannels -@all +multi +slaveof +ping +exec +subscribe +config|rewrite "
    "+role +publish +info +client|setname +client|kill +script|kill"
)
#: The exporter on a Redis node: INFO and the read-only diagnostics, no keys, no CONFIG
#: (CONFIG GET would show the replication password).
MONITOR_RULES = (
    "resetkeys resetchannels -@all +info +ping +client|setname +dbsize +slowlog|get +slowlog|len "
    "+latency|latest +latency|histogram"
)
#: The exporter on a sentinel: INFO and what Sentinel reports of the primary.
SENTINEL_MONITOR_RULES = (
    "resetkeys resetchannels -@all +info +ping +client|setname +sentinel|masters +sentinel|master "
    "+sentinel|sentinels +sentinel|slaves +sentinel|replicas +sentinel|ckquorum"
)
#: A search server asks the sentinels where the primary is; it may change nothing there.
SENTINEL_DISCOVERY_RULES = (
    "resetkeys resetchannels -@all +ping +sentinel|masters +sentinel|master "
    "+sentinel|get-master-addr-by-name +sentinel|slaves +sentinel|replicas +sentinel|sentinels"
)


def _read(directory: Path, name: str) -> str:
    return (directory / name).read_text(encoding="utf-8").removesuffix("\n")


def _password(directory: Path, name: str, user: str | None) -> str:
    """The password in ``name`` (``user:`` stripped), made and written if it is missing."""
    path = directory / name
    if path.exists():
        text = _read(directory, name)
        return text.partition(":")[2] if user is not None else text
    password = secrets.token_urlsafe(24)  # [A-Za-z0-9_-]: safe in every config file
    _write(path, f"{user}:{password}" if user is not None else password)
    return password


def _write(path: Path, text: str) -> None:
    """``text`` and a newline into ``path`` (0644: see the module docstring), replaced whole."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(descriptor, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.chmod(temporary, 0o644)  # whatever the umask
    temporary.replace(path)


def _authority(directory: Path, name: str, subject: str) -> tuple[Authority, bool]:
    """The CA ``name`` (.crt and .key) in ``directory``, made if missing or expiring;
    returns it and whether it was made now."""
    authority = Authority(directory / f"{name}.crt", directory / f"{name}.key")
    if authority.key.is_file() and valid_for(authority.cert, RENEW_DAYS * 86400):
        return authority, False
    authority = make_authority(directory, name, subject=subject, days=CA_DAYS)
    authority.key.chmod(0o600)  # signs; never mounted
    os.chmod(authority.cert, 0o644)
    return authority, True


def _kept(cert: Path, authority: Authority) -> bool:
    return signed_by(cert, authority) and valid_for(cert, RENEW_DAYS * 86400)


def _keystore(directory: Path, name: str, authority: Authority, usage: Usage, member: str) -> bool:
    """``NAME.pem``: a member's key then its certificate naming ``member`` (ZooKeeper's PEM
    key store), made if missing, of another CA or expiring; True if made now."""
    path = directory / f"{name}.pem"
    if _kept(path, authority):
        return False
    cert, key = issue(
        authority,
        directory,
        name,
        usage=usage,
        subject=member,
        dns_names=(member,),
        days=CERT_DAYS,
    )
    _write(
        path,
        key.read_text(encoding="ascii").strip() + "\n" + cert.read_text(encoding="ascii").strip(),
    )
    cert.unlink()
    key.unlink()
    return True


def _client(directory: Path, role: str, authority: Authority) -> bool:
    """``zk_client_ROLE.crt`` and ``.key`` (0644, read by the container's user), made if
    missing, of another CA or expiring; True if made now."""
    name = f"zk_client_{role}"
    if (directory / f"{name}.key").is_file() and _kept(directory / f"{name}.crt", authority):
        return False
    cert, key = issue(
        authority, directory, name, usage="client", subject=f"discovery {role}", days=CERT_DAYS
    )
    for path in (cert, key):
        os.chmod(path, 0o644)
    return True


def zookeeper_tls(directory: Path) -> list[str]:
    """The ZooKeeper CAs and certificates of the module docstring in ``directory``, each
    kept or made; returns the names of those made now.

    Raises:
        DevClusterError: ``openssl`` is missing or failed.
    """
    made = []
    clients, new = _authority(directory, "zk_ca", "discovery compose ZooKeeper CA")
    made += ["zk_ca"] if new else []
    quorum, new = _authority(directory, "zk_quorum_ca", "discovery compose ZooKeeper quorum CA")
    made += ["zk_quorum_ca"] if new else []
    for member in ZK_MEMBERS:
        if _keystore(directory, member, clients, "server", member):
            made.append(member)
        if _keystore(directory, f"{member}_quorum", quorum, "peer", member):
            made.append(f"{member}_quorum")
    made += [f"zk_client_{role}" for role in ZK_CLIENTS if _client(directory, role, clients)]
    return made


def redis_users(prefix: str, passwords: dict[str, str]) -> list[str]:
    """The Redis nodes' ACL lines for the live list's key ``prefix``."""
    return [
        acl_user_line("default", passwords["redis_admin"], "~* &* +@all"),
        acl_user_line("reader", passwords["redis_reader"], reader_acl_rules(prefix)),
        acl_user_line("publisher", passwords["redis_publisher"], publisher_acl_rules(prefix)),
        acl_user_line("replica", passwords["redis_replica"], REPLICA_RULES),
        acl_user_line("sentinel", passwords["redis_sentinel"], SENTINEL_RULES),
        acl_user_line("monitor", passwords["redis_monitor"], MONITOR_RULES),
    ]


def sentinel_users(passwords: dict[str, str]) -> list[str]:
    """The sentinels' ACL lines (their ``default`` user has ``requirepass`` instead)."""
    return [
        acl_user_line("discovery", passwords["sentinel_discovery"], SENTINEL_DISCOVERY_RULES),
        acl_user_line("monitor", passwords["redis_monitor"], SENTINEL_MONITOR_RULES),
    ]


def ensure(directory: Path, cluster: str) -> list[str]:
    """Make the missing passwords, write the derived files and keep or make the
    ZooKeeper certificates in ``directory`` (made 0700); returns the names of the
    passwords and certificates made now.

    Raises:
        ConfigError: ``cluster`` is not a valid cluster name.
        ValueError: a ZooKeeper secret file is not ``user:password``.
        DevClusterError: ``openssl`` is missing or failed.
    """
    prefix = ClusterConfig(cluster=cluster).redis_prefix
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    made = [name for name in PASSWORDS if not (directory / name).exists()]
    passwords = {name: _password(directory, name, user) for name, user in PASSWORDS.items()}
    for role in ("data", "search"):
        identity = DigestId.parse(_read(directory, f"zk_{role}"))
        _write(directory / f"zk_{role}_digest", str(identity))
    _write(directory / "redis_users", "\n".join(redis_users(prefix, passwords)))
    _write(directory / "sentinel_users", "\n".join(sentinel_users(passwords)))
    return made + zookeeper_tls(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the files go")
    parser.add_argument("--cluster", default="demo", help="the compose file's DISCOVERY_CLUSTER")
    args = parser.parse_args(argv)
    made = ensure(args.dir, args.cluster)
    where = args.dir.relative_to(ROOT) if args.dir.is_relative_to(ROOT) else args.dir
    if made:
        print(f"compose secrets: made {', '.join(made)} in {where}/", flush=True)
    else:
        print(f"compose secrets: kept those in {where}/", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

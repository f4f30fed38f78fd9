"""Flags and environment variables: one table of options, and the builders of the settings.

A flag wins over its variable, the variable over the default; a bad value is reported by
its flag's or variable's name. The settings are built once, at start-up; only entry
points use this module.

Settings: docs/settings.md, "How settings are read".
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from discovery.address import NetworkPolicy, parse_networks, validate_address
from discovery.config import (
    AgentConfig,
    ClusterConfig,
    HttpEdgeConfig,
    RedisConfig,
    ZkConfig,
)
from discovery.errors import ConfigError, InvalidInstanceError
from discovery.instance import (
    MAX_GROUP_LENGTH,
    MAX_ZONE_LENGTH,
    validate_group,
    validate_instance_id,
    validate_zone,
)

__all__ = [
    "AGENT_OPTIONS",
    "COMMON_OPTIONS",
    "GROUP_RULE",
    "HTTP_EDGE_OPTIONS",
    "MEMBER_OPTIONS",
    "REDIS_OPTIONS",
    "RUNTIME_OPTIONS",
    "ZK_OPTIONS",
    "ZONE_RULE",
    "Option",
    "add_options",
    "advertised_address",
    "agent_config",
    "checked_address",
    "checked_id",
    "cluster_config",
    "env_flag",
    "group_name",
    "http_edge_config",
    "int_range",
    "listen_options",
    "log_level",
    "network_list",
    "non_negative_float",
    "non_negative_int",
    "parse_env",
    "port_number",
    "positive_float",
    "positive_int",
    "read_secret",
    "readable_file",
    "redis_config",
    "zk_auth",
    "zk_config",
]


#: What a zone name may be, as ``payload.zone`` allows (for help texts and errors).
ZONE_RULE = f"1..{MAX_ZONE_LENGTH} characters of [A-Za-z0-9._:-]"


def zone_name(text: str) -> str:
    """argparse type: a zone name (surrounding blanks ignored), as ``payload.zone`` allows.

    The data servers' zone and the search servers' own one follow the same rule: a zone
    a search server could never match is a typo, refused at start-up rather than
    silently never preferred.
    """
    try:
        return validate_zone(text.strip())
    except InvalidInstanceError:
        raise argparse.ArgumentTypeError(f"not a zone name ({ZONE_RULE}): {text!r}") from None


#: What a replica group's name may be, as ``payload.group`` allows (the zone's rule).
GROUP_RULE = f"1..{MAX_GROUP_LENGTH} characters of [A-Za-z0-9._:-]"


def group_name(text: str) -> str:
    """argparse type: a replica group's name (surrounding blanks ignored), as
    ``payload.group`` allows: refused at start-up naming the flag, rather than by every
    search server as a malformed registration."""
    try:
        return validate_group(text.strip())
    except InvalidInstanceError:
        raise argparse.ArgumentTypeError(f"not a group name ({GROUP_RULE}): {text!r}") from None


def network_list(text: str) -> NetworkPolicy:
    """argparse type: ``CIDR,CIDR,...`` as a :class:`~discovery.address.NetworkPolicy`
    (empty: no narrowing)."""
    try:
        return NetworkPolicy.of(parse_networks(text))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--allowed-networks: ")) from None


def checked_address(value: str, flag: str) -> str:
    """An address this process will register (``--advertise``), validated as the
    contract requires of a registration's ``address``.

    Raises:
        ConfigError: naming ``flag`` and the rule broken.
    """
    checked_setting(validate_address, value, flag)
    return value


def checked_setting(check: Callable[[Any, str], object], value: object, flag: str) -> None:
    """Run a payload validator (``validate_zone``…) on a setting of a config built in
    code; raise :class:`ConfigError` naming ``flag``."""
    try:
        check(value, flag)
    except InvalidInstanceError as exc:
        raise ConfigError(str(exc).removeprefix("invalid ServiceInstance: ")) from None


def positive_float(text: str) -> float:
    """argparse type: a float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``low..high`` (no upper bound if ``high`` is None)."""
    bounds = f"{low}..{high}" if high is not None else f">= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text!r}")
        return value

    parse.__name__ = f"int {bounds}"
    return parse


#: argparse type: a TCP port, 0 meaning "any free port".
port_number = int_range(0, 65535)
#: argparse type: an integer >= 1.
positive_int = int_range(1)
#: argparse type: an integer >= 0.
non_negative_int = int_range(0)


def env_flag(text: str) -> bool:
    """The environment form of a boolean option: 1/true/yes/on or 0/false/no/off."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false (1/0, yes/no, on/off), got {text!r}")


def readable_file(text: str) -> str:
    """argparse type: the path of an existing, readable file (kept as given)."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"file not readable: {text!r}")
    return text


@dataclass(frozen=True)
class Option:
    """One setting: its flag, environment variable, type, default and help.

    A ``boolean`` option is a switch: ``--flag`` / ``--no-flag`` on the command line,
    and its variable is parsed by ``type`` (use :func:`env_flag`).
    """

    flag: str
    env: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    metavar: str | None = None
    boolean: bool = False

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def parse_env(options: Iterable[Option], environ: Mapping[str, str]) -> dict[str, Any]:
    """Read the options' environment variables, converted by each option's type.

    Raises:
        ConfigError: a variable is set to a value its type rejects; the message
            names the variable.
    """
    values: dict[str, Any] = {}
    for option in options:
        raw = environ.get(option.env)
        if raw is None or raw == "":
            continue
        try:
            values[option.dest] = option.type(raw)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ConfigError(f"{option.env}={raw!r}: {exc}") from None
    return values


def add_options(
    parser: argparse.ArgumentParser,
    options: Iterable[Option],
    environ: Mapping[str, str] | None = None,
) -> None:
    """Add ``options`` to ``parser`` with defaults taken from the environment.

    A bad environment value becomes a parser error naming the variable, so every
    entry point reports it the same way argparse reports a bad flag.
    """
    options = list(options)
    env = os.environ if environ is None else environ
    try:
        from_env = parse_env(options, env)
    except ConfigError as exc:
        parser.error(str(exc))
    for option in options:
        default = from_env.get(option.dest, option.default)
        shown = "unset" if option.default is None else repr(option.default)
        if option.boolean:
            parser.add_argument(
                option.flag,
                dest=option.dest,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{option.help} [env {option.env}; default {shown}]",
            )
            continue
        parser.add_argument(
            option.flag,
            dest=option.dest,
            type=option.type,
            default=default,
            metavar=option.metavar,
            help=f"{option.help} [env {option.env}; default {shown}]",
        )


ZK_OPTIONS: tuple[Option, ...] = (
    Option(
        "--zk",
        "DISCOVERY_ZK_HOSTS",
        "ZooKeeper hosts in kazoo form, host:port[,host:port...][/chroot]",
        default="127.0.0.1:2181",
        metavar="HOSTS",
    ),
    Option(
        "--session-timeout",
        "DISCOVERY_SESSION_TIMEOUT",
        "ZooKeeper session timeout in seconds: how long a dead process stays registered",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
    ),
    Option(
        "--zk-connect-timeout",
        "DISCOVERY_ZK_CONNECT_TIMEOUT",
        "give up start-up if no ZooKeeper server answers within this many seconds",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
    ),
    Option(
        "--zk-auth",
        "DISCOVERY_ZK_AUTH",
        "ZooKeeper digest credentials user:password (the role `discovery zk-init` "
        "granted); directories we create are then writable only by them, our ephemeral "
        "nodes only by this process, and everything is readable by all. A flag is "
        "visible in ps: prefer the variable or --zk-auth-file",
        metavar="USER:PASSWORD",
    ),
    Option(
        "--zk-auth-file",
        "DISCOVERY_ZK_AUTH_FILE",
        "file holding the --zk-auth credentials user:password (one trailing newline ignored)",
        type=readable_file,
        metavar="PATH",
    ),
    Option(
        "--zk-tls",
        "DISCOVERY_ZK_TLS",
        "connect to ZooKeeper over TLS (its secureClientPort); the server's certificate "
        "chain and its name (each host as written in --zk) are always verified",
        type=env_flag,
        default=False,
        boolean=True,
    ),
    Option(
        "--zk-tls-ca",
        "DISCOVERY_ZK_TLS_CA",
        "PEM file of the CA certificates that verify ZooKeeper (unset: the system's); "
        "needs --zk-tls",
        type=readable_file,
        metavar="PATH",
    ),
    Option(
        "--zk-tls-cert",
        "DISCOVERY_ZK_TLS_CERT",
        "PEM client certificate, for an ensemble with ssl.clientAuth=need; needs --zk-tls "
        "and --zk-tls-key",
        type=readable_file,
        metavar="PATH",
    ),
    Option(
        "--zk-tls-key",
        "DISCOVERY_ZK_TLS_KEY",
        "PEM private key (unencrypted) of --zk-tls-cert",
        type=readable_file,
        metavar="PATH",
    ),
)


#: How members are read from ZooKeeper: the search server's (leader, ZooKeeper fallback)
#: and the tools' that judge registrations as the leader does (``discovery status``,
#: ``discovery maint``).
MEMBER_OPTIONS: tuple[Option, ...] = (
    Option(
        "--allow-persistent-members",
        "DISCOVERY_ALLOW_PERSISTENT_MEMBERS",
        "route persistent (non-ephemeral) registrations that say PERMANENT or STATIC, as "
        "Curator writes them; by default every persistent node under /data_servers is "
        "skipped and counted (reason persistent): it outlives whatever wrote it, and no "
        "data server can delete it. A persistent node saying DYNAMIC is refused either way",
        type=env_flag,
        default=False,
        boolean=True,
    ),
)


def log_level(text: str) -> str:
    """argparse type: a logging level name."""
    level = text.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise argparse.ArgumentTypeError(f"not a logging level: {text!r}")
    return level


#: Credentials and TLS for Redis (:class:`RedisConfig`); part of :data:`COMMON_OPTIONS`.
REDIS_OPTIONS: tuple[Option, ...] = (
    Option(
        "--redis-username",
        "DISCOVERY_REDIS_USERNAME",
        "Redis ACL user for reading the live list (unset: the URL's, else 'default')",
        metavar="USER",
    ),
    Option(
        "--redis-password",
        "DISCOVERY_REDIS_PASSWORD",
        "Redis password for reading; a flag is visible in ps: prefer the variable or "
        "--redis-password-file",
        metavar="PASSWORD",
    ),
    Option(
        "--redis-password-file",
        "DISCOVERY_REDIS_PASSWORD_FILE",
        "file holding the Redis password for reading (one trailing newline ignored)",
        type=readable_file,
        metavar="PATH",
    ),
    Option(
        "--redis-publish-username",
        "DISCOVERY_REDIS_PUBLISH_USERNAME",
        "Redis ACL user the leader publishes with (unset: the reading user)",
        metavar="USER",
    ),
    Option(
        "--redis-publish-password",
        "DISCOVERY_REDIS_PUBLISH_PASSWORD",
        "Redis password the leader publishes with (unset: the reading password)",
        metavar="PASSWORD",
    ),
    Option(
        "--redis-publish-password-file",
        "DISCOVERY_REDIS_PUBLISH_PASSWORD_FILE",
        "file holding the password the leader publishes with",
        type=readable_file,
        metavar="PATH",
    ),
    Option(
        "--redis-sentinel-username",
        "DISCOVERY_REDIS_SENTINEL_USERNAME",
        "ACL user to authenticate to the sentinels of a redis+sentinel:// URL with "
        "(unset: 'default' when a sentinel password is given)",
        metavar="USER",
    ),
    Option(
        "--redis-sentinel-password",
        "DISCOVERY_REDIS_SENTINEL_PASSWORD",
        "password of the sentinels themselves (their requirepass), separate from the "
        "data servers'; a flag is visible in ps: prefer the variable or "
        "--redis-sentinel-password-file",
        metavar="PASSWORD",
    ),
    Option(
        "--redis-sentinel-password-file",
        "DISCOVERY_REDIS_SENTINEL_PASSWORD_FILE",
        "file holding the sentinels' password (one trailing newline ignored)",
        type=readable_file,
        metavar="PATH",
    ),
    Option(
        "--redis-tls",
        "DISCOVERY_REDIS_TLS",
        "connect to Redis with TLS (implied by a rediss:// URL)",
        type=env_flag,
        default=False,
        boolean=True,
    ),
    Option(
        "--redis-tls-ca",
        "DISCOVERY_REDIS_TLS_CA",
        "PEM file of the CA certificates that verify Redis (unset: the system's)",
        type=readable_file,
        metavar="PATH",
    ),
    Option(
        "--redis-tls-cert",
        "DISCOVERY_REDIS_TLS_CERT",
        "PEM client certificate, for a Redis with tls-auth-clients",
        type=readable_file,
        metavar="PATH",
    ),
    Option(
        "--redis-tls-key",
        "DISCOVERY_REDIS_TLS_KEY",
        "PEM private key of --redis-tls-cert (unset: in the certificate file)",
        type=readable_file,
        metavar="PATH",
    ),
    Option(
        "--redis-tls-verify-hostname",
        "DISCOVERY_REDIS_TLS_VERIFY_HOSTNAME",
        "check that Redis's certificate names the URL's host (the chain is always verified)",
        type=env_flag,
        default=True,
        boolean=True,
    ),
)


def event_loop(text: str) -> str:
    """``uvloop`` or ``asyncio``."""
    value = text.strip().lower()
    if value not in ("uvloop", "asyncio"):
        raise argparse.ArgumentTypeError(f"must be uvloop or asyncio, got {text!r}")
    return value


#: The long-running servers' runtime: which event loop runs them.
RUNTIME_OPTIONS: tuple[Option, ...] = (
    Option(
        "--event-loop",
        "DISCOVERY_EVENT_LOOP",
        "event loop: uvloop (libuv; about half the CPU per request of asyncio's) or asyncio",
        type=event_loop,
        default="uvloop",
    ),
)


COMMON_OPTIONS: tuple[Option, ...] = (
    Option("--log-level", "DISCOVERY_LOG_LEVEL", "logging level", type=log_level, default="INFO"),
    Option(
        "--redis",
        "DISCOVERY_REDIS_URL",
        "Redis URL for the published live list: redis:// or rediss:// (TLS), "
        "[user[:password]@]host:port/db; behind Sentinel "
        "redis+sentinel://host:port[,host:port...]/<primary name>[/db]; on Redis Cluster "
        "redis+cluster://host:port[,host:port...] (rediss+... for TLS)",
        default="redis://127.0.0.1:6379/0",
        metavar="URL",
    ),
    *REDIS_OPTIONS,
    Option(
        "--cluster",
        "DISCOVERY_CLUSTER",
        "cluster name; the Redis key prefix is discovery:{<cluster>}",
        default="default",
    ),
    Option(
        "--admin-token",
        "DISCOVERY_ADMIN_TOKEN",
        "bearer token required by admin endpoints (visible ASCII); unset, they answer "
        "only loopback requests carrying the header 'X-Discovery-Admin: 1'. A flag is "
        "visible in ps: prefer the variable or --admin-token-file",
        metavar="TOKEN",
    ),
    Option(
        "--admin-token-file",
        "DISCOVERY_ADMIN_TOKEN_FILE",
        "file holding the admin token (one trailing newline ignored)",
        type=readable_file,
        metavar="PATH",
    ),
)


#: The HTTP servers' edge (:class:`~discovery.config.HttpEdgeConfig`): how long a client
#: may take to send a request head, how many connections may be doing so at once, and
#: how many may be open at all.
HTTP_EDGE_OPTIONS: tuple[Option, ...] = (
    Option(
        "--header-timeout",
        "DISCOVERY_HEADER_TIMEOUT",
        "seconds a client may take to send a request's headers in full (from the "
        "connection's opening, or from the first byte of a further request on a kept-alive "
        "connection); slower ones are closed",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
    ),
    Option(
        "--max-pending-headers",
        "DISCOVERY_MAX_PENDING_HEADERS",
        "connections that may be waiting for a request's headers at once; one more closes "
        "the one that has waited longest",
        type=positive_int,
        default=256,
    ),
    Option(
        "--max-connections",
        "DISCOVERY_MAX_CONNECTIONS",
        "connections that may be open at once; one more closes the longest idle "
        "kept-alive one (else the longest waiting for its headers), or is answered 503 "
        "if every other has a request in progress. Unset: the open-file limit (ulimit -n) "
        "less a quarter of it (at least 64, at most half) for everything else",
        type=positive_int,
    ),
    Option(
        "--pressure-keepalive",
        "DISCOVERY_PRESSURE_KEEPALIVE",
        "seconds an idle kept-alive connection is kept while more than 75%% of "
        "--max-connections are open (75 s otherwise); the longest idle go first",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
    ),
)


AGENT_OPTIONS: tuple[Option, ...] = (
    Option(
        "--probe-interval",
        "DISCOVERY_PROBE_INTERVAL",
        "seconds between health probes",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
    ),
    Option(
        "--probe-timeout",
        "DISCOVERY_PROBE_TIMEOUT",
        "a probe not answered within this many seconds fails",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
    ),
    Option(
        "--probe-max-latency",
        "DISCOVERY_PROBE_MAX_LATENCY",
        "a probe answered slower than this many seconds fails",
        type=positive_float,
        default=0.5,
        metavar="SECONDS",
    ),
    Option(
        "--probe-busy-grace",
        "DISCOVERY_PROBE_BUSY_GRACE",
        "seconds for which slow or timed-out probes are excused (counted as neither "
        "failed nor good) while load explains their slowness: the server's own thread "
        "waited for a CPU (its Linux schedstat run delay: the machine was busy) or was "
        "busy 90%% of the time (a loop saturated by its work), from the first excused "
        "probe until a good one; a hung, blocked or sleeping server is never excused "
        "(0: never excuse)",
        type=non_negative_float,
        default=120.0,
        metavar="SECONDS",
    ),
    Option(
        "--fall",
        "DISCOVERY_PROBE_FALL",
        "consecutive failed probes that take the server offline",
        type=positive_int,
        default=3,
    ),
    Option(
        "--rise",
        "DISCOVERY_PROBE_RISE",
        "consecutive good probes that bring it back",
        type=positive_int,
        default=2,
    ),
    Option(
        "--flap-max",
        "DISCOVERY_FLAP_MAX",
        "re-admissions allowed within --flap-window before a cool-down",
        type=positive_int,
        default=3,
    ),
    Option(
        "--flap-window",
        "DISCOVERY_FLAP_WINDOW",
        "seconds over which re-admissions are counted",
        type=positive_float,
        default=300.0,
        metavar="SECONDS",
    ),
    Option(
        "--flap-cooldown",
        "DISCOVERY_FLAP_COOLDOWN",
        "seconds a flapping server is held offline",
        type=positive_float,
        default=120.0,
        metavar="SECONDS",
    ),
    Option(
        "--drain-grace",
        "DISCOVERY_DRAIN_GRACE",
        "seconds a draining server keeps serving before it leaves",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
    ),
    Option(
        "--verify-interval",
        "DISCOVERY_VERIFY_INTERVAL",
        "seconds between the slow sweep's checks that our registration still exists "
        "in ZooKeeper (jittered; it is also checked about 2, 10 and 30 s after every "
        "connection)",
        type=positive_float,
        default=120.0,
        metavar="SECONDS",
    ),
)


def listen_options(default_port: int, id_prefix: str) -> tuple[Option, ...]:
    """``--host``, ``--port``, ``--advertise`` and ``--id`` of a server process."""
    return (
        Option("--host", "DISCOVERY_HOST", "address to listen on", default="127.0.0.1"),
        Option(
            "--port",
            "DISCOVERY_PORT",
            "port to listen on (0: any free port)",
            type=port_number,
            default=default_port,
        ),
        Option(
            "--advertise",
            "DISCOVERY_ADVERTISE",
            "address to publish in ZooKeeper (unset: --host, or this host's name for 0.0.0.0)",
        ),
        Option(
            "--id",
            "DISCOVERY_ID",
            f"instance id (unset: {id_prefix}-<advertised address>-<port>)",
        ),
    )


def advertised_address(host: str, advertise: str | None) -> str:
    """The address other machines reach us at: ``advertise``, else ``host`` if specific."""
    if advertise:
        return advertise
    return socket.gethostname() if host in ("0.0.0.0", "::", "") else host


def checked_id(value: str | None) -> str | None:
    """``--id`` validated as a znode name (None stays None).

    Raises:
        ConfigError: naming the flag and the rule broken.
    """
    if value is None:
        return None
    try:
        return validate_instance_id(value)
    except ValueError as exc:
        raise ConfigError(f"--id / DISCOVERY_ID: {exc}") from None


# -- building the settings ----------------------------------------------------


def agent_config(args: argparse.Namespace) -> AgentConfig:
    """The AgentConfig of a namespace parsed with :data:`AGENT_OPTIONS`."""
    return AgentConfig(
        probe_interval=args.probe_interval,
        probe_timeout=args.probe_timeout,
        max_latency=args.probe_max_latency,
        busy_grace=args.probe_busy_grace,
        fall=args.fall,
        rise=args.rise,
        flap_max=args.flap_max,
        flap_window=args.flap_window,
        flap_cooldown=args.flap_cooldown,
        drain_grace=args.drain_grace,
        verify_interval=args.verify_interval,
    )


def zk_auth(args: argparse.Namespace) -> str | None:
    """The ZooKeeper credentials of a namespace parsed with :data:`ZK_OPTIONS`:
    ``--zk-auth``, or the contents of ``--zk-auth-file`` (read here, once).

    Raises:
        ConfigError: both given, or the file unreadable or empty; naming the flag.
    """
    return read_secret(args.zk_auth, args.zk_auth_file, "--zk-auth", "DISCOVERY_ZK_AUTH")


def zk_config(args: argparse.Namespace) -> ZkConfig:
    """The ZkConfig of a namespace parsed with :data:`ZK_OPTIONS` (see :func:`zk_auth`).

    Raises:
        ConfigError: bad credentials or TLS settings (see :class:`ZkConfig`), naming the flag.
    """
    return ZkConfig(
        hosts=args.zk,
        session_timeout=args.session_timeout,
        connect_timeout=args.zk_connect_timeout,
        auth=zk_auth(args),
        tls=args.zk_tls,
        tls_ca=args.zk_tls_ca,
        tls_cert=args.zk_tls_cert,
        tls_key=args.zk_tls_key,
    )


def http_edge_config(args: argparse.Namespace) -> HttpEdgeConfig:
    """The HttpEdgeConfig of a namespace parsed with :data:`HTTP_EDGE_OPTIONS`."""
    return HttpEdgeConfig(
        header_timeout=args.header_timeout,
        max_pending_headers=args.max_pending_headers,
        max_connections=args.max_connections,
        pressure_keepalive=args.pressure_keepalive,
    )


def redis_config(args: argparse.Namespace) -> RedisConfig:
    """The :class:`~discovery.config.RedisConfig` of a namespace parsed with :data:`REDIS_OPTIONS`.

    Password files are read here, once.

    Raises:
        ConfigError: a password given twice, or a password file unreadable or empty.
    """
    return RedisConfig(
        username=args.redis_username,
        password=read_secret(
            args.redis_password,
            args.redis_password_file,
            "--redis-password",
            "DISCOVERY_REDIS_PASSWORD",
        ),
        publish_username=args.redis_publish_username,
        publish_password=read_secret(
            args.redis_publish_password,
            args.redis_publish_password_file,
            "--redis-publish-password",
            "DISCOVERY_REDIS_PUBLISH_PASSWORD",
        ),
        tls=args.redis_tls,
        tls_ca=args.redis_tls_ca,
        tls_cert=args.redis_tls_cert,
        tls_key=args.redis_tls_key,
        tls_verify_hostname=args.redis_tls_verify_hostname,
        sentinel_username=args.redis_sentinel_username,
        sentinel_password=read_secret(
            args.redis_sentinel_password,
            args.redis_sentinel_password_file,
            "--redis-sentinel-password",
            "DISCOVERY_REDIS_SENTINEL_PASSWORD",
        ),
    )


def cluster_config(args: argparse.Namespace) -> ClusterConfig:
    """The ClusterConfig of a namespace parsed with :data:`COMMON_OPTIONS`.

    Secret files (``--admin-token-file``, the Redis password files) are read here, once.

    Raises:
        ConfigError: a secret given twice, or a secret file unreadable or empty.
    """
    return ClusterConfig(
        cluster=args.cluster,
        redis_url=args.redis,
        admin_token=read_secret(
            args.admin_token, args.admin_token_file, "--admin-token", "DISCOVERY_ADMIN_TOKEN"
        ),
        redis=redis_config(args),
    )


def read_secret(value: str | None, path: str | None, flag: str, env: str) -> str | None:
    """A secret given directly (``flag`` / ``env``) or as a file (``flag-file`` /
    ``env_FILE``, read here, once: call it at start-up); not both. One trailing newline
    of the file is dropped.

    Raises:
        ConfigError: both given, or the file unreadable or empty; naming the flags and
            the path, never the secret.
    """
    if path is None:
        return value
    if value is not None:
        raise ConfigError(f"{flag} and {flag}-file ({env}, {env}_FILE): give only one")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag}-file / {env}_FILE: cannot read {path!r}: {exc}") from None
    # Editors and `echo` add a newline; a password never ends in one.
    secret = text.removesuffix("\n").removesuffix("\r")
    if not secret:
        raise ConfigError(f"{flag}-file / {env}_FILE: {path!r} is empty")
    return secret


def add_log_level_override(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` on a one-shot subcommand of ``discovery`` (``status``, ``maint``).

    Given there, it overrides ``discovery --log-level``; not given, the value parsed by
    ``discovery`` (or its environment default) stands instead of being overwritten by
    the subcommand's own default (``argparse.SUPPRESS``).
    """
    level = next(o for o in COMMON_OPTIONS if o.flag == "--log-level")
    parser.add_argument(
        level.flag,
        dest=level.dest,
        type=level.type,
        default=argparse.SUPPRESS,
        help=f"{level.help} (as `discovery --log-level`) [env {level.env}; default WARNING]",
    )

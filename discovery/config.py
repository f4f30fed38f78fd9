"""Settings: one table of options, each with a flag and an environment variable.

Every process builds its configuration once, at start-up, from flags and the
environment (a flag wins over the variable, the variable over the default) into
frozen dataclasses, and passes those down. Nothing reads ``os.environ`` later.

An :class:`Option` names its flag, variable, type and help once; :func:`add_options`
puts a group of them on an :mod:`argparse` parser (the help text shows the variable
and the default), and :func:`parse_env` validates the variables so that a bad value
is reported with the variable's name instead of a traceback.
"""

from __future__ import annotations

import argparse
import os
import socket
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .errors import ConfigError
from .instance import validate_instance_id

__all__ = [
    "AGENT_OPTIONS",
    "COMMON_OPTIONS",
    "REDIS_OPTIONS",
    "ZK_OPTIONS",
    "AgentConfig",
    "ClusterConfig",
    "Option",
    "RedisConfig",
    "ZkConfig",
    "add_options",
    "advertised_address",
    "checked_id",
    "env_flag",
    "int_range",
    "listen_options",
    "log_level",
    "non_negative_int",
    "parse_env",
    "port_number",
    "positive_float",
    "positive_int",
    "readable_file",
    "redact_url",
]


def positive_float(text: str) -> float:
    """argparse type: a float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
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
        "nodes only by this process, and everything is readable by all",
        metavar="USER:PASSWORD",
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


COMMON_OPTIONS: tuple[Option, ...] = (
    Option("--log-level", "DISCOVERY_LOG_LEVEL", "logging level", type=log_level, default="INFO"),
    Option(
        "--redis",
        "DISCOVERY_REDIS_URL",
        "Redis URL for the published live list: redis:// or rediss:// (TLS), "
        "[user[:password]@]host:port/db",
        default="redis://127.0.0.1:6379/0",
        metavar="URL",
    ),
    *REDIS_OPTIONS,
    Option(
        "--cluster",
        "DISCOVERY_CLUSTER",
        "cluster name; the Redis key prefix is discovery:<cluster>",
        default="default",
    ),
    Option(
        "--admin-token",
        "DISCOVERY_ADMIN_TOKEN",
        "bearer token required by admin endpoints",
        metavar="TOKEN",
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


@dataclass(frozen=True)
class AgentConfig:
    """How the agent probes its server and when it takes it offline.

    The defaults detect a dead or hung server in about ``fall * interval`` = 3 s
    (well inside a typical 10 s session timeout, which only catches dead processes),
    need two good probes in a row before re-admitting (one lucky answer from a
    struggling server is not health), and hold a server that was re-admitted more
    than three times in five minutes out for two minutes, so a flapping server does
    not keep dragging every query's latency up on its bad swings.

    Attributes:
        probe_interval: seconds between probes.
        probe_timeout: a probe not answered in this many seconds fails.
        max_latency: a probe answered slower than this fails ("slow").
        fall: consecutive failures that force the server offline.
        rise: consecutive successes that bring it back.
        flap_max: re-admissions allowed within ``flap_window``; one more starts a
            cool-down of ``flap_cooldown`` seconds.
        drain_grace: seconds a draining server keeps serving (while search servers
            stop routing to it) before it removes its node.
    """

    probe_interval: float = 1.0
    probe_timeout: float = 1.0
    max_latency: float = 0.5
    fall: int = 3
    rise: int = 2
    flap_max: int = 3
    flap_window: float = 300.0
    flap_cooldown: float = 120.0
    drain_grace: float = 5.0

    def __post_init__(self) -> None:
        for name in ("probe_interval", "probe_timeout", "max_latency", "flap_window"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("flap_cooldown", "drain_grace"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)!r}")
        for name in ("fall", "rise", "flap_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)!r}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AgentConfig:
        """Build from a namespace parsed with :data:`AGENT_OPTIONS`."""
        return cls(
            probe_interval=args.probe_interval,
            probe_timeout=args.probe_timeout,
            max_latency=args.probe_max_latency,
            fall=args.fall,
            rise=args.rise,
            flap_max=args.flap_max,
            flap_window=args.flap_window,
            flap_cooldown=args.flap_cooldown,
            drain_grace=args.drain_grace,
        )


@dataclass(frozen=True)
class ZkConfig:
    """How to reach ZooKeeper and how long our session lives without us.

    Attributes:
        hosts: kazoo connection string, optionally with a chroot
            (``zk1:2181,zk2:2181/prod-search``).
        session_timeout: seconds ZooKeeper keeps our session (and ephemeral nodes)
            after it last heard from us; the bound on how long a dead process
            stays registered.
        connect_timeout: seconds :meth:`ZkSession.start` keeps trying before it fails.
        operation_timeout: seconds one operation may wait (for a reconnect, say)
            before it fails with :class:`~discovery.errors.ZkConnectionError`;
            defaults to the session timeout.
        auth: digest credentials ``user:password`` or None.
    """

    hosts: str
    session_timeout: float = 10.0
    connect_timeout: float = 30.0
    operation_timeout: float | None = None
    auth: str | None = None

    def __post_init__(self) -> None:
        if not self.hosts or not self.hosts.strip():
            raise ConfigError("--zk / DISCOVERY_ZK_HOSTS: empty ZooKeeper hosts string")
        for name in ("session_timeout", "connect_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.operation_timeout is not None and not self.operation_timeout > 0:
            raise ConfigError(f"operation_timeout must be positive, got {self.operation_timeout}")
        if self.auth is not None and ":" not in self.auth:
            raise ConfigError("--zk-auth / DISCOVERY_ZK_AUTH: expected user:password")

    @property
    def effective_operation_timeout(self) -> float:
        return (
            self.operation_timeout if self.operation_timeout is not None else self.session_timeout
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ZkConfig:
        """Build from a namespace parsed with :data:`ZK_OPTIONS`."""
        return cls(
            hosts=args.zk,
            session_timeout=args.session_timeout,
            connect_timeout=args.zk_connect_timeout,
            auth=args.zk_auth,
        )


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and reprs."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>"
    if password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _read_secret(value: str | None, path: str | None, flag: str, env: str) -> str | None:
    """A secret given directly or as a file (read once, at start-up); not both."""
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


_REDIS_SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True)
class RedisConfig:
    """Credentials and TLS for Redis, beyond what the URL (:class:`ClusterConfig`) says.

    Two roles use Redis: every search server *reads* the live list (GET, HMGET,
    SUBSCRIBE, PING) with ``username``/``password``; the leader *publishes* it (the
    fence script) with ``publish_username``/``publish_password``, each of which
    defaults to its reading counterpart. So a cluster can give non-leaders a user that
    cannot write (see :mod:`discovery.redisconn` for the ACL rules of both roles).
    Reading credentials may instead be in the URL (``redis://user:pw@host``), but not
    in both places.

    TLS is on with ``tls`` or a ``rediss://`` URL. The server's certificate chain is
    always verified (against ``tls_ca``, else the system's CAs); ``tls_verify_hostname``
    also checks that it names the URL's host. ``tls_cert``/``tls_key`` are a client
    certificate for servers that require one.

    The repr never shows a password. Raises :class:`ConfigError` naming the flag for
    an inconsistent combination.
    """

    username: str | None = None
    password: str | None = None
    publish_username: str | None = None
    publish_password: str | None = None
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_verify_hostname: bool = True

    def __post_init__(self) -> None:
        for name in ("username", "password", "publish_username", "publish_password"):
            if getattr(self, name) == "":
                flag = "--redis-" + name.replace("_", "-")
                raise ConfigError(f"{flag}: must not be empty (leave it unset instead)")
        if self.tls_key is not None and self.tls_cert is None:
            raise ConfigError("--redis-tls-key needs --redis-tls-cert")

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("password") and value is not None:
                shown.append(f"{f.name}='***'")
            else:
                shown.append(f"{f.name}={value!r}")
        return f"RedisConfig({', '.join(shown)})"

    def uses_tls(self, url: str) -> bool:
        """True if connections to ``url`` use TLS (``tls`` or a ``rediss://`` URL)."""
        return self.tls or urllib.parse.urlsplit(url).scheme == "rediss"

    def check_url(self, url: str) -> None:
        """Check these settings against the Redis URL they go with.

        Raises:
            ConfigError: an unknown scheme, credentials both in the URL and in flags,
                TLS files without TLS, or TLS over a unix socket.
        """
        where = "--redis / DISCOVERY_REDIS_URL"
        try:
            parts = urllib.parse.urlsplit(url)
            in_url = parts.username or parts.password
        except ValueError as exc:
            raise ConfigError(f"{where}: {redact_url(url)!r}: {exc}") from None
        if parts.scheme not in _REDIS_SCHEMES:
            raise ConfigError(
                f"{where}: {redact_url(url)!r} must start with redis://, rediss:// or unix://"
            )
        if in_url and (self.username is not None or self.password is not None):
            raise ConfigError(
                f"{where} carries credentials and so do --redis-username/--redis-password: "
                "give them in one place"
            )
        if parts.scheme == "unix" and self.tls:
            raise ConfigError("--redis-tls: not possible over a unix:// socket")
        if (self.tls_ca or self.tls_cert) and not self.uses_tls(url):
            raise ConfigError(
                "--redis-tls-ca / --redis-tls-cert need TLS: use a rediss:// URL or --redis-tls"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RedisConfig:
        """Build from a namespace parsed with :data:`REDIS_OPTIONS`; reads password files.

        Raises:
            ConfigError: a password given twice, or a password file unreadable or empty.
        """
        return cls(
            username=args.redis_username,
            password=_read_secret(
                args.redis_password,
                args.redis_password_file,
                "--redis-password",
                "DISCOVERY_REDIS_PASSWORD",
            ),
            publish_username=args.redis_publish_username,
            publish_password=_read_secret(
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
        )


@dataclass(frozen=True)
class ClusterConfig:
    """Cluster-wide names: the cluster, the Redis URL and key prefix, the admin token.

    ``redis`` holds the Redis credentials and TLS settings that go with ``redis_url``;
    :func:`discovery.redisconn.make_redis` builds clients from both. The repr hides
    the URL's password and the admin token.
    """

    cluster: str = "default"
    redis_url: str = "redis://127.0.0.1:6379/0"
    admin_token: str | None = None
    redis: RedisConfig = RedisConfig()

    def __post_init__(self) -> None:
        if not self.cluster or any(c in self.cluster for c in " :/\n\t"):
            raise ConfigError(
                f"--cluster / DISCOVERY_CLUSTER: {self.cluster!r} must be a non-empty name "
                "without spaces, ':' or '/'"
            )
        self.redis.check_url(self.redis_url)

    def __repr__(self) -> str:
        token = None if self.admin_token is None else "***"
        return (
            f"ClusterConfig(cluster={self.cluster!r}, redis_url={redact_url(self.redis_url)!r}, "
            f"admin_token={token!r}, redis={self.redis!r})"
        )

    @property
    def redis_prefix(self) -> str:
        return f"discovery:{self.cluster}"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ClusterConfig:
        """Build from a namespace parsed with :data:`COMMON_OPTIONS`."""
        return cls(
            cluster=args.cluster,
            redis_url=args.redis,
            admin_token=args.admin_token,
            redis=RedisConfig.from_args(args),
        )

"""docker-compose.yml as the compose tests read it: resolved by ``docker-compose config``,
its secrets made by deploy/compose_secrets.py in a temporary directory, and each service
that runs one of our console scripts as a :class:`Process` whose argv and environment
our real parsers and settings accept (:func:`settings`).

Shared by tests/scenarios/test_compose.py (the topology and its credentials) and
tests/scenarios/test_compose_zk_tls.py (ZooKeeper over TLS).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from data_server.config import DataServerConfig, FleetConfig
from data_server.config import build_fleet_parser as build_fleet_parser
from data_server.config import build_parser as build_data_server_parser
from discovery.tools import main as discovery_cli
from search_server.config import SearchServerConfig
from search_server.config import build_parser as build_search_server_parser
from tests.support import REPO_ROOT

ROOT = REPO_ROOT
COMPOSE_FILE = ROOT / "docker-compose.yml"

# Where compose mounts a service's secrets.
RUN_SECRETS = "/run/secrets/"
# The compose file's own key for the secrets made for it here (not compose's).
MADE = "x-test-made-secrets"


def _load_compose_secrets() -> Any:
    """deploy/compose_secrets.py (a script, not a package module), as `make` runs it."""
    path = ROOT / "deploy" / "compose_secrets.py"
    spec = importlib.util.spec_from_file_location("compose_secrets", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compose_secrets = _load_compose_secrets()


def scripts() -> set[str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return set(tomllib.load(f)["project"]["scripts"])


# -- the compose file, as docker-compose resolves it -------------------------------------


def load(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """docker-compose.yml as ``docker-compose config`` resolves it, with its secrets made
    by ``make compose-secrets``'s own code in a temporary directory (:func:`secret_files`).
    A test module's fixture calls it once."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(
            "docker-compose is not installed: `make setup` installs it (the Debian package "
            "docker-compose), then rerun the tests"
        )
    # Our own DISCOVERY_* settings must not leak into the interpolation of the file.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISCOVERY_", "COMPOSE_"))}
    result = subprocess.run(
        [exe, "-f", str(COMPOSE_FILE), "config"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    config = yaml.safe_load(result.stdout)
    assert isinstance(config, dict)
    assert config.get("services"), "no services in docker-compose.yml"
    # The secrets, made as `make compose-secrets` makes them, for the cluster named here.
    clusters = {
        env["DISCOVERY_CLUSTER"]
        for service in config["services"].values()
        if "DISCOVERY_CLUSTER" in (env := environment(service))
    }
    assert len(clusters) == 1, clusters
    made = tmp_path_factory.mktemp("compose-secrets")
    compose_secrets.ensure(made, clusters.pop())
    config[MADE] = made
    return config


def secret_files(compose: dict[str, Any]) -> dict[str, Path]:
    """Each secret the file declares -> the file made for it (by its ``file:``'s name)."""
    made: Path = compose[MADE]
    files = {}
    for name, secret in (compose.get("secrets") or {}).items():
        source = Path(str(secret["file"]))
        assert source.parent == ROOT / "deploy" / "compose" / "secrets", (name, source)
        files[name] = made / source.name
    return files


def mounted(service: dict[str, Any]) -> dict[str, str]:
    """The service's secrets: path in the container -> the secret's name."""
    mounted = {}
    for item in service.get("secrets") or []:
        source, target = (
            (item, item) if isinstance(item, str) else (item["source"], item.get("target"))
        )
        target = target or source
        mounted[target if target.startswith("/") else RUN_SECRETS + target] = source
    return mounted


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose["services"]
    return services


def argv(service: dict[str, Any]) -> list[str]:
    """What the container runs: entrypoint + command (our image sets no ENTRYPOINT)."""
    argv: list[str] = []
    for key in ("entrypoint", "command"):
        value = service.get(key)
        if value is None:
            continue
        argv += shlex.split(value) if isinstance(value, str) else [str(v) for v in value]
    return argv


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    # A variable without a value is passed through from the host: unset here.
    return {k: str(v) for k, v in env.items() if v is not None}


def image(service: dict[str, Any]) -> str:
    return str(service.get("image", ""))


@dataclass(frozen=True)
class Process:
    """One service that runs one of our console scripts.

    ``argv`` and ``env`` name the service's secrets by the files made for this module
    (``/run/secrets/x`` -> ``.../x``), but only those it mounts: a path of a secret it
    does not mount stays as it is, and so does not exist here either.
    """

    service: str
    argv: list[str]
    env: dict[str, str]
    secrets: frozenset[str]

    @property
    def subcommand(self) -> str | None:
        return self.argv[1] if len(self.argv) > 1 and not self.argv[1].startswith("-") else None

    @property
    def kind(self) -> str:
        """``search-server``, ``data-server``, ``data-server fleet``, ``data-server loadgen``…"""
        return self.argv[0] if self.subcommand is None else f"{self.argv[0]} {self.subcommand}"


def processes(compose: dict[str, Any]) -> list[Process]:
    """Every service that runs one of our console scripts."""
    ours = scripts()
    files = secret_files(compose)
    found = []
    for name, service in services(compose).items():
        command = argv(service)
        if not command or command[0] not in ours:
            continue
        mounts = mounted(service)
        local = {path: str(files[secret]) for path, secret in mounts.items()}
        found.append(
            Process(
                name,
                [local.get(a, a) for a in command],
                {k: local.get(v, v) for k, v in environment(service).items()},
                frozenset(mounts.values()),
            )
        )
    return found


def of_kind(compose: dict[str, Any], kind: str) -> list[Process]:
    return [p for p in processes(compose) if p.kind == kind]


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """Exactly the container's DISCOVERY_* variables (our parsers read them when built)."""
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("DISCOVERY_"):
                mp.delenv(key)
        for key, value in env.items():
            mp.setenv(key, value)
        yield


def parse(
    process: Process, build: Callable[[], argparse.ArgumentParser], args: list[str]
) -> argparse.Namespace:
    """Parse ``args`` as the container would: its environment applied, the real parser."""
    err = io.StringIO()
    with environ(process.env), contextlib.redirect_stderr(err):
        try:
            return build().parse_args(args)
        except SystemExit:
            pass
    pytest.fail(
        f"service {process.service}: `{shlex.join(process.argv)}` is refused:\n"
        f"{err.getvalue().strip()}"
    )


# Parsers of our subcommands, by (script, subcommand); loadgen has a test of its own.
_PARSERS: dict[tuple[str, str | None], Callable[[], argparse.ArgumentParser]] = {
    ("search-server", None): build_search_server_parser,
    ("data-server", None): build_data_server_parser,
    ("data-server", "fleet"): build_fleet_parser,
}


def settings(process: Process) -> object:
    """The settings object the process would run with (parsed and validated)."""
    script, sub = process.argv[0], process.subcommand
    if script == "discovery":
        return parse(process, discovery_cli.build_parser, process.argv[1:])
    build = _PARSERS.get((script, sub))
    assert build is not None, f"service {process.service}: no parser known for {process.kind}"
    args = parse(process, build, process.argv[2:] if sub else process.argv[1:])
    with environ(process.env):
        if sub == "fleet":
            return FleetConfig.from_args(args)
        if script == "data-server":
            return DataServerConfig.from_args(args)
        return SearchServerConfig.from_args(args)


APP_IMAGE = "search-discovery:local"


def built_from(service: dict[str, Any]) -> str:
    """The Dockerfile a service's image is built from, relative to the repository."""
    build = service.get("build")
    assert isinstance(build, dict), f"no build section: {build!r}"
    context = Path(str(build.get("context", ".")))
    context = context if context.is_absolute() else ROOT / context
    dockerfile = context / str(build.get("dockerfile", "Dockerfile"))
    return str(dockerfile.relative_to(ROOT))


def zk_init(compose: dict[str, Any]) -> tuple[Process, argparse.Namespace]:
    (process,) = [p for p in processes(compose) if p.argv[:2] == ["discovery", "zk-init"]]
    args = settings(process)
    assert isinstance(args, argparse.Namespace)
    return process, args


def servers(compose: dict[str, Any]) -> list[tuple[Process, object]]:
    """Every data and search server process with its settings (fleets as such)."""
    return [
        (p, settings(p))
        for p in processes(compose)
        if p.kind in ("search-server", "data-server", "data-server fleet")
    ]


def template(settings: object) -> DataServerConfig | SearchServerConfig:
    """A server's settings; a fleet's are those its servers are made from."""
    if isinstance(settings, FleetConfig):
        return settings.template
    assert isinstance(settings, DataServerConfig | SearchServerConfig), settings
    return settings

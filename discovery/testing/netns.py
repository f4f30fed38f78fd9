"""Real network partitions on one machine: hosts in network namespaces, cuts by iptables.

Needs root. A cut drops (never rejects) inside one host's namespace, so nothing outside the
lab is touched; a reaper removes the lab however its creator ends, SIGKILL included.

Development: docs/development.md, "The chaos run".
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import itertools
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from discovery.errors import DevClusterError

__all__ = ["Cut", "Host", "NetworkLab", "netns_available"]

log = logging.getLogger(__name__)

#: RFC 2544's benchmarking range: never routed, safe to create on any machine.
_TEST_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
_PREFIX = "dl"  # interface names are limited to 15 characters: dl<pid>b, dl<pid>h<n>
_NAME = re.compile(rf"^{_PREFIX}(\d+)")
_counter = itertools.count()
#: Held while a lab picks its /24 and puts the bridge's address on it. The root namespace
#: is the machine's, so labs of parallel test workers, of concurrent test runs and of a
#: chaos run all pick from the same addresses; between ``ip addr show`` and ``ip addr
#: add`` another lab could take the same /24 (Linux accepts one address on two bridges).
_SUBNET_LOCK = "discovery-netns.lock"  # in /run/lock, else the temporary directory


def netns_available() -> str | None:
    """None if network namespaces can be used here, else why not (for a skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise DevClusterError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


@dataclass
class Host:
    """One namespace on the lab's bridge."""

    name: str
    namespace: str
    address: str
    lab: NetworkLab = field(repr=False)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as a command that runs inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside this host's namespace (``subprocess.Popen`` arguments)."""
        return subprocess.Popen(self.wrap(argv), **kwargs)  # type: ignore[call-overload,no-any-return]

    def iptables(self, *rule: str, check: bool = True) -> None:
        _run("ip", "netns", "exec", self.namespace, "iptables", "-w", *rule, check=check)


@dataclass
class Cut:
    """Rules in one host's namespace; :meth:`heal` removes them (idempotent)."""

    host: Host
    rules: list[tuple[str, ...]]
    description: str
    healed: bool = False

    def heal(self) -> None:
        if self.healed:
            return
        for rule in self.rules:
            self.host.iptables("-D", *rule, check=False)
        self.healed = True
        log.info("healed: %s", self.description)


class NetworkLab:
    """A bridge, hosts in namespaces, and cuts between them. A context manager.

    Args:
        reap: start the reaper process (tests and chaos runs want it; the reaper's own
            sweep passes False).
    """

    def __init__(self, *, reap: bool = True) -> None:
        reason = netns_available()
        if reason is not None:
            raise DevClusterError(f"cannot build a network lab: {reason}")
        self.tag = f"{_PREFIX}{os.getpid()}"
        serial = next(_counter)
        if serial:
            # A later lab of the same process: its names must differ.
            self.tag += chr(ord("a") + serial % 26)
        self.bridge = f"{self.tag}b"
        self._reap = reap
        self._reaper: subprocess.Popen[bytes] | None = None
        self._network: ipaddress.IPv4Network | None = None
        self.hosts: dict[str, Host] = {}
        self._cuts: list[Cut] = []

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge: bind servers here."""
        assert self._network is not None, "start() first"
        return str(self._network.network_address + 1)

    def start(self) -> NetworkLab:
        sweep_stale()
        if self._reap:
            self._reaper = subprocess.Popen(
                [sys.executable, "-m", "discovery.testing.netns", self.tag],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C meant for us must not kill it first
            )
        try:
            with _subnet_lock():
                self._network = _free_subnet()
                _run("ip", "link", "add", self.bridge, "type", "bridge")
                _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            _run("iptables", "-w", "-I", "FORWARD", *_forward_rule(self.bridge, self.tag))
        except BaseException:
            self.close()
            raise
        log.info("network lab %s on %s", self.tag, self._network)
        return self

    def add_host(self, name: str) -> Host:
        """A new namespace on the bridge, with the next address."""
        assert self._network is not None, "start() first"
        index = len(self.hosts) + 1
        namespace = f"{self.tag}-{name}"
        address = str(self._network.network_address + 1 + index)
        outside, inside = f"{self.tag}h{index}", f"{self.tag}n{index}"
        _run("ip", "netns", "add", namespace)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", inside, "netns", namespace)
        _run("ip", "link", "set", outside, "master", self.bridge)
        _run("ip", "link", "set", outside, "up")
        _run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
        _run("ip", "-n", namespace, "link", "set", inside, "up")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")
        host = Host(name, namespace, address, self)
        self.hosts[name] = host
        return host

    def cut(
        self,
        host: Host,
        *,
        address: str | None = None,
        port: int | None = None,
        served: bool = False,
    ) -> Cut:
        """Drop ``host``'s traffic with ``address`` (default: anyone), in both directions.

        ``port`` narrows it to one TCP service: by default a service on the other side
        that ``host`` connects to; with ``served=True`` ``host``'s own listening port,
        which the others connect to.
        """
        out_rule: list[str] = ["OUTPUT"]
        in_rule: list[str] = ["INPUT"]
        if address is not None:
            out_rule += ["-d", address]
            in_rule += ["-s", address]
        if port is not None:
            # Leaving the host, the service port is the source if it is ours, else the
            # destination; arriving, the other way round.
            out_rule += ["-p", "tcp", "--sport" if served else "--dport", str(port)]
            in_rule += ["-p", "tcp", "--dport" if served else "--sport", str(port)]
        rules = [(*out_rule, "-j", "DROP"), (*in_rule, "-j", "DROP")]
        for rule in rules:
            host.iptables("-A", *rule)
        what = f"{address or 'everyone'}" + (f" port {port}" if port is not None else "")
        side = "serving" if served else "reaching"
        cut = Cut(host, rules, f"{host.name} cut from {side} {what}")
        self._cuts.append(cut)
        log.info("cut: %s", cut.description)
        return cut

    def heal_all(self) -> None:
        for cut in self._cuts:
            cut.heal()
        self._cuts.clear()

    def close(self) -> None:
        """Delete every namespace (their veth ends go with them) and the bridge."""
        remove_tagged(self.tag)
        self.hosts.clear()
        self._cuts.clear()
        if self._reaper is not None:
            with contextlib.suppress(OSError):
                assert self._reaper.stdin is not None
                self._reaper.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._reaper.wait(10)
            self._reaper = None

    def __enter__(self) -> NetworkLab:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    """Hold :data:`_SUBNET_LOCK` (an exclusive ``flock``, released if we die)."""
    directory = "/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir()
    with open(os.path.join(directory, _SUBNET_LOCK), "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def _free_subnet() -> ipaddress.IPv4Network:
    used = _run("ip", "-o", "-4", "addr", "show").stdout
    for subnet in _TEST_RANGE.subnets(new_prefix=24):
        if str(subnet.network_address + 1) + "/" not in used:
            return subnet
    raise DevClusterError("no free /24 left in 198.18.0.0/15")


def _forward_rule(bridge: str, tag: str) -> tuple[str, ...]:
    """The root namespace's FORWARD rule that lets the lab's bridged frames through."""
    return ("-i", bridge, "-o", bridge, "-m", "comment", "--comment", tag, "-j", "ACCEPT")


def _remove_forward_rules(owned: Callable[[str], bool]) -> None:
    """Delete the FORWARD rules whose comment (a lab's tag) ``owned`` accepts."""
    listed = _run("iptables", "-w", "-S", "FORWARD", check=False).stdout
    for line in listed.splitlines():
        match = re.match(r"^-A FORWARD (.*--comment (\S+) .*)$", line)
        if match and owned(match.group(2)):
            _run("iptables", "-w", "-D", "FORWARD", *match.group(1).split(), check=False)


def remove_tagged(tag: str) -> None:
    """Delete the namespaces, links and FORWARD rules whose names start with ``tag``."""
    _remove_forward_rules(lambda comment: comment == tag)
    namespaces = _run("ip", "netns", "list", check=False).stdout.split()
    for namespace in namespaces:
        if namespace.startswith(f"{tag}-"):
            _run("ip", "netns", "del", namespace, check=False)
    links = _run("ip", "-o", "link", "show", check=False).stdout
    for match in re.finditer(r"^\d+: ([^:@\s]+)", links, flags=re.M):
        name = match.group(1)
        if name.startswith(tag) and name[len(tag) :][:1] in ("b", "h", "n"):
            _run("ip", "link", "del", name, check=False)


def sweep_stale() -> None:
    """Remove what labs of processes that no longer exist left behind."""

    def gone(name: str) -> bool:
        match = _NAME.match(name)
        return match is not None and not os.path.exists(f"/proc/{match.group(1)}")

    _remove_forward_rules(gone)
    names = _run("ip", "netns", "list", check=False).stdout.split()
    links = _run("ip", "-o", "link", "show", check=False).stdout
    names += re.findall(r"^\d+: ([^:@\s]+)", links, flags=re.M)
    for name in names:
        match = _NAME.match(name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            log.warning("removing %s, left by a network lab of a process that is gone", name)
            if name in links:
                _run("ip", "link", "del", name, check=False)
            _run("ip", "netns", "del", name, check=False)


def _reaper_main(tag: str) -> None:
    """Wait for the lab's creator to go (our stdin closes), then remove the lab."""
    with contextlib.suppress(OSError):
        sys.stdin.buffer.read()
    remove_tagged(tag)


if __name__ == "__main__":
    _reaper_main(sys.argv[1])

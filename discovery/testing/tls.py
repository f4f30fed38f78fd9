"""TLS certificates made with ``openssl``: a CA and the certificates it signs.

:func:`make_dev_pki` makes throwaway ones for a local Redis or ZooKeeper: a CA, a server
and a client certificate, unencrypted keys, a few days' validity; the server certificate
names ``localhost`` and ``127.0.0.1``. :func:`make_authority` and :func:`issue` are its
parts, for a set of certificates of one's own (``make compose-secrets`` makes the compose
topology's with them); :func:`valid_for` and :func:`signed_by` say whether a kept
certificate can stay.

For development, tests and the demo topology only: the keys are never encrypted and
nobody else trusts the CA.

Design: docs/design/security.md, "Redis security: passwords, ACL users, TLS".
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from discovery.errors import DevClusterError

__all__ = [
    "Authority",
    "DevPki",
    "Usage",
    "issue",
    "make_authority",
    "make_dev_pki",
    "signed_by",
    "valid_for",
]

_DAYS = 7
# EC keys: generated in milliseconds, where RSA takes noticeable CPU on a shared box.
_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")

#: What a certificate may be used for: ``server`` (serverAuth), ``client`` (clientAuth),
#: or ``peer``, both (a member of a ZooKeeper quorum is each in turn).
Usage = Literal["server", "client", "peer"]
_EXTENDED_USAGE = {"server": "serverAuth", "client": "clientAuth", "peer": "serverAuth,clientAuth"}


@dataclass(frozen=True)
class DevPki:
    """Paths of the PEM files made by :func:`make_dev_pki`."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


@dataclass(frozen=True)
class Authority:
    """A CA made by :func:`make_authority`: its certificate and its (unencrypted) key."""

    cert: Path
    key: Path


def _openssl(directory: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    binary = shutil.which("openssl")
    if binary is None:
        raise DevClusterError("no `openssl` on PATH; it is needed to make TLS certificates")
    try:
        return subprocess.run(
            [binary, *args],
            cwd=directory,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=True,
            timeout=60,
        )
    except subprocess.CalledProcessError as exc:
        stderr = exc.stderr.decode("utf-8", errors="replace").strip()
        raise DevClusterError(f"openssl {args[0]} failed: {stderr}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DevClusterError(f"openssl {args[0]} failed: {exc}") from exc


def _directory(where: Path) -> Path:
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DevClusterError(f"cannot create {where} for TLS certificates: {exc}") from exc
    return where


def make_authority(
    directory: str | Path, name: str = "ca", *, subject: str, days: int = _DAYS
) -> Authority:
    """Make a CA in ``directory``: ``NAME.crt`` and ``NAME.key`` (replaced if present),
    its subject ``/CN=subject``.

    Raises:
        DevClusterError: ``openssl`` is missing or failed (its message included).
    """
    where = _directory(Path(directory).absolute())
    authority = Authority(cert=where / f"{name}.crt", key=where / f"{name}.key")
    _openssl(
        where,
        "req",
        "-x509",
        *_KEY,
        "-keyout",
        authority.key.name,
        "-out",
        authority.cert.name,
        "-days",
        str(days),
        "-subj",
        f"/CN={subject}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    return authority


def issue(
    authority: Authority,
    directory: str | Path,
    name: str,
    *,
    usage: Usage,
    subject: str,
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    days: int = _DAYS,
) -> tuple[Path, Path]:
    """Make a key and a certificate signed by ``authority`` in ``directory``:
    ``NAME.crt`` and ``NAME.key`` (replaced if present), for ``usage``, its subject
    ``/CN=subject``, naming ``dns_names`` and ``ip_addresses`` (subjectAltName; none:
    no such extension). Returns (certificate, key).

    Raises:
        DevClusterError: ``openssl`` is missing or failed (its message included).
    """
    where = _directory(Path(directory).absolute())
    cert, key = where / f"{name}.crt", where / f"{name}.key"
    csr, extensions = where / f"{name}.csr", where / f"{name}.ext"
    names = [f"DNS:{dns}" for dns in dns_names] + [f"IP:{ip}" for ip in ip_addresses]
    extensions.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage={_EXTENDED_USAGE[usage]}\n"
        + (f"subjectAltName={','.join(names)}\n" if names else ""),
        encoding="utf-8",
    )
    try:
        _openssl(
            where, "req", *_KEY, "-keyout", key.name, "-out", csr.name, "-subj", f"/CN={subject}"
        )
        _openssl(
            where,
            "x509",
            "-req",
            "-in",
            csr.name,
            "-CA",
            str(authority.cert),
            "-CAkey",
            str(authority.key),
            "-CAcreateserial",
            "-out",
            cert.name,
            "-days",
            str(days),
            "-extfile",
            extensions.name,
        )
    finally:
        csr.unlink(missing_ok=True)
        extensions.unlink(missing_ok=True)
    return cert, key


def valid_for(cert: Path, seconds: int) -> bool:
    """Whether the certificate in ``cert`` loads and is still valid ``seconds`` from now
    (False for a missing or unreadable file).

    Raises:
        DevClusterError: ``openssl`` is missing.
    """
    return _passes(cert.parent, "x509", "-noout", "-in", str(cert), "-checkend", str(seconds))


def signed_by(cert: Path, authority: Authority) -> bool:
    """Whether ``cert`` verifies against ``authority``'s certificate (False for a missing
    file, one of another CA, or an expired one).

    Raises:
        DevClusterError: ``openssl`` is missing.
    """
    return _passes(cert.parent, "verify", "-CAfile", str(authority.cert), str(cert))


def _passes(directory: Path, *args: str) -> bool:
    """Whether ``openssl args`` exits 0 (in ``directory``, if it exists)."""
    if shutil.which("openssl") is None:
        raise DevClusterError("no `openssl` on PATH; it is needed to check TLS certificates")
    if not directory.is_dir():
        return False
    try:
        _openssl(directory, *args)
    except DevClusterError:
        return False
    return True


def make_dev_pki(
    directory: str | Path,
    *,
    dns_names: tuple[str, ...] = ("localhost",),
    ip_addresses: tuple[str, ...] = ("127.0.0.1",),
) -> DevPki:
    """Make a CA and a server and a client certificate signed by it in ``directory``.

    Existing files of a previous call are reused (a restarted server keeps its
    certificate, so clients holding the CA stay valid).

    Raises:
        DevClusterError: ``openssl`` is missing or failed (its message included).
    """
    where = Path(directory).absolute()
    pki = DevPki(
        ca_cert=where / "ca.crt",
        server_cert=where / "server.crt",
        server_key=where / "server.key",
        client_cert=where / "client.crt",
        client_key=where / "client.key",
    )
    if all(
        path.is_file()
        for path in (pki.ca_cert, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key)
    ):
        return pki
    authority = make_authority(where, subject="discovery development CA")
    issue(
        authority,
        where,
        "server",
        usage="server",
        subject="discovery server",
        dns_names=dns_names,
        ip_addresses=ip_addresses,
    )
    issue(authority, where, "client", usage="client", subject="discovery client")
    return pki

"""Throwaway TLS certificates for a local Redis or ZooKeeper: a CA, a server and a client one.

For development and tests only: unencrypted keys, a CA nobody else trusts, a few days'
validity; the server certificate names ``localhost`` and ``127.0.0.1``.

Design: docs/design/security.md, "Redis security: passwords, ACL users, TLS".
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from discovery.errors import DevClusterError

__all__ = ["DevPki", "make_dev_pki"]

_DAYS = "7"
# EC keys: generated in milliseconds, where RSA takes noticeable CPU on a shared box.
_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class DevPki:
    """Paths of the PEM files made by :func:`make_dev_pki`."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(directory: Path, *args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise DevClusterError("no `openssl` on PATH; it is needed to make TLS certificates")
    try:
        subprocess.run(
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
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DevClusterError(f"cannot create {where} for TLS certificates: {exc}") from exc
    _openssl(
        where,
        "req",
        "-x509",
        *_KEY,
        "-keyout",
        "ca.key",
        "-out",
        pki.ca_cert.name,
        "-days",
        _DAYS,
        "-subj",
        "/CN=discovery development CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    names = [f"DNS:{name}" for name in dns_names] + [f"IP:{ip}" for ip in ip_addresses]
    for role, usage, cert, key in (
        ("server", "serverAuth", pki.server_cert, pki.server_key),
        ("client", "clientAuth", pki.client_cert, pki.client_key),
    ):
        extensions = where / f"{role}.ext"
        extensions.write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage={usage}\n"
            + (f"subjectAltName={','.join(names)}\n" if role == "server" else ""),
            encoding="utf-8",
        )
        _openssl(
            where,
            "req",
            *_KEY,
            "-keyout",
            key.name,
            "-out",
            f"{role}.csr",
            "-subj",
            f"/CN=discovery {role}",
        )
        _openssl(
            where,
            "x509",
            "-req",
            "-in",
            f"{role}.csr",
            "-CA",
            pki.ca_cert.name,
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            cert.name,
            "-days",
            _DAYS,
            "-extfile",
            extensions.name,
        )
    return pki

"""Build the image's wheelhouse on the host: every wheel the project needs, for the image's Python.

Usage: ``python deploy/docker/wheelhouse.py --runtime-image IMAGE [--dest DIR]``

Containers here reach no Python package index, so ``make image`` downloads the wheels
on the host and the image installs them with ``pip install --no-index``. The wheels
must suit the image's interpreter, not the host's:

- **tags:** ``pip download`` is told the image's Python version, ABI and glibc
  (``--python-version``, ``--abi``, ``--platform manylinux_2_X_<arch>``);
- **markers:** ``pip download`` still evaluates environment markers against the *host*
  interpreter (pip documents ``--python-version`` for tags and ``Requires-Python``
  only). Debian bookworm's Python is 3.11.2, so ``redis``'s
  ``async-timeout; python_full_version < "3.11.3"`` is needed in the image but not on
  a newer host. So the marker environment is read from the runtime image itself
  (``docker run IMAGE python3``), every wheel's ``Requires-Dist`` is evaluated against
  it, and whatever is missing is downloaded too, until nothing is.

The project's build requirements (``[build-system].requires``) go in as well: the image
builds the project from its sources with no index. Old wheels of a package are removed
when a newer one arrives, so the directory does not grow with every run.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DEST = Path(__file__).resolve().parent / "wheelhouse"

# Printed by the runtime image's python3: its marker environment (PEP 508) and glibc.
_PROBE = r"""
import json, os, platform, sys
impl = sys.implementation
version = "{0.major}.{0.minor}.{0.micro}".format(impl.version)
print(json.dumps({
    "markers": {
        "implementation_name": impl.name,
        "implementation_version": version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    },
    "glibc": os.confstr("CS_GNU_LIBC_VERSION"),
}))
"""


def probe_runtime(image: str) -> tuple[dict[str, str], tuple[int, int]]:
    """Return the runtime image's marker environment and its glibc (major, minor)."""
    result = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "python3", image, "-c", _PROBE],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        sys.exit(f"wheelhouse: could not run python3 in {image}:\n{result.stderr.strip()}")
    found = json.loads(result.stdout)
    match = re.fullmatch(r"glibc (\d+)\.(\d+)", found["glibc"] or "")
    if match is None:
        sys.exit(f"wheelhouse: {image} is not a glibc system ({found['glibc']!r})")
    return found["markers"], (int(match.group(1)), int(match.group(2)))


def project_requirements() -> list[str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)
    return [*project["project"]["dependencies"], *project["build-system"]["requires"]]


def download(
    dest: Path, requirements: list[str], env: dict[str, str], glibc: tuple[int, int]
) -> None:
    """``pip download`` binary wheels for the image's interpreter (tags, not markers)."""
    machine = env["platform_machine"]
    major, minor = glibc
    platforms = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 4, -1)]
    platforms += [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}"]
    py = env["python_full_version"]
    abi = "cp" + "".join(env["python_version"].split("."))
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--dest",
        str(dest),
        "--only-binary=:all:",
        "--python-version",
        py,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for platform_tag in platforms:
        command += ["--platform", platform_tag]
    subprocess.run([*command, *requirements], check=True)


def wheels(dest: Path) -> dict[str, list[tuple[Version, Path]]]:
    found: dict[str, list[tuple[Version, Path]]] = {}
    for path in dest.glob("*.whl"):
        name, version, _build, _tags = parse_wheel_filename(path.name)
        found.setdefault(canonicalize_name(name), []).append((version, path))
    return found


def requires_dist(path: Path) -> list[Requirement]:
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = HeaderParser().parsestr(archive.read(name).decode("utf-8"))
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def missing_for_target(dest: Path, env: dict[str, str]) -> list[str]:
    """Requirements of the wheelhouse's wheels that apply in the image and nothing meets."""
    available = wheels(dest)
    missing: set[str] = set()
    for versions in available.values():
        for _version, path in versions:
            for req in requires_dist(path):
                # Extras are not installed: a requirement with an extra marker is skipped.
                if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                    continue
                have = available.get(canonicalize_name(req.name), [])
                if not any(req.specifier.contains(v, prereleases=True) for v, _ in have):
                    missing.add(str(Requirement(f"{req.name}{req.specifier}")))
    return sorted(missing)


def prune(dest: Path) -> None:
    """Keep only the newest wheel of each package."""
    for versions in wheels(dest).values():
        for _version, path in sorted(versions)[:-1]:
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runtime-image", required=True, help="the image whose python3 installs the wheels"
    )
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="the wheelhouse directory")
    args = parser.parse_args(argv)

    env, glibc = probe_runtime(args.runtime_image)
    print(
        f"wheelhouse: for Python {env['python_full_version']} on {env['platform_machine']}, "
        f"glibc {glibc[0]}.{glibc[1]} (read from {args.runtime_image})"
    )
    args.dest.mkdir(parents=True, exist_ok=True)
    download(args.dest, project_requirements(), env, glibc)
    # Markers the host evaluated differently: fetch until the closure is complete.
    for _round in range(10):
        prune(args.dest)
        missing = missing_for_target(args.dest, env)
        if not missing:
            break
        print(f"wheelhouse: needed by the image's markers, not the host's: {', '.join(missing)}")
        download(args.dest, missing, env, glibc)
    else:
        sys.exit(f"wheelhouse: still missing after 10 rounds: {', '.join(missing)}")
    count = len(list(args.dest.glob("*.whl")))
    size = sum(p.stat().st_size for p in args.dest.glob("*.whl")) / 1e6
    print(f"wheelhouse: {count} wheels, {size:.1f} MB in {args.dest.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

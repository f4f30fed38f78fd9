"""The documentation site (``mkdocs.yml``, ``make docs``): it builds strict and offline,
shows what the repository holds (the examples as they are, each command's ``--help``),
loads nothing from another host, and the API reference page of ``Agent`` renders in a
real headless Chromium (Debian's ``chromium``, driven by Playwright) with every link on
it resolving, to a page that exists and, for a fragment, to an element of that page.
Every repository path the pages and the README name exists, and so does every test a
page names by its node id.

The site is built once per module into a temporary directory, so the tests depend on
no earlier ``make docs``; where a network namespace can be made (``unshare``), the build
runs in one with no network at all.
"""

from __future__ import annotations

import fnmatch
import functools
import html
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urldefrag, urlsplit

import pytest
import yaml

from tests.browser import CHROMIUM, CHROMIUM_ARGS, UI_TIMEOUT_MS, playwright_api
from tests.support import REPO_ROOT

ROOT = REPO_ROOT
# The programs the embedding, search-server and live-list pages include whole.
EXAMPLES = {
    "embedding": [
        "examples/aiohttp_data_server.py",
        "examples/threaded_data_server.py",
        "examples/custom_probe.py",
    ],
    "aggregator": ["examples/custom_picker.py"],
    "live-list": ["examples/live_list_follower.py"],
}
# Tags whose attribute makes the browser fetch something as the page loads.
ASSET_ATTRIBUTES = {
    "script": "src",
    "link": "href",
    "img": "src",
    "iframe": "src",
    "source": "src",
    "video": "src",
    "audio": "src",
    "embed": "src",
    "object": "data",
}
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)
# The pages whose repository paths must exist (CHANGELOG.md names paths of its time).
PAGES_NAMING_PATHS = ("docs/**/*.md", "README.md")
# Files a run writes and the repository does not keep: `make soak`'s reports and plot,
# and the screenshot tests/integration/test_dashboard.py takes (docs/dashboard.png is
# the kept copy).
WRITTEN_BY_RUNS = (
    "bench/results/soak-*.json",
    "bench/results/soak*.png",
    "bench/results/dashboard.png",
    # make compose-secrets (deploy/compose_secrets.py), never committed.
    "deploy/compose/secrets*",
)
# A code span or a link target, outside fenced code blocks.
NAMED = re.compile(r"`([^`\n]+)`|\]\(([^)\s]+)\)")
FENCED = re.compile(r"^```.*?^```", re.S | re.M)


def _offline_prefix() -> list[str]:
    """``unshare`` into a network namespace of its own (no interface up), if allowed."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    for prefix in ([unshare, "--net"], [unshare, "--net", "--map-root-user"]):
        if subprocess.run([*prefix, "true"], capture_output=True, check=False).returncode == 0:
            return prefix
    return []


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built strict (a warning fails it) into a temporary directory."""
    out = tmp_path_factory.mktemp("site")
    command = [
        *_offline_prefix(),
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "--config-file",
        str(ROOT / "mkdocs.yml"),
        "--site-dir",
        str(out),
    ]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    started = time.monotonic()
    # cwd elsewhere: nothing in the configuration may depend on where it is built from.
    done = subprocess.run(
        command, cwd=out.parent, env=env, capture_output=True, text=True, timeout=300
    )
    took = time.monotonic() - started
    assert done.returncode == 0, f"mkdocs build failed ({took:.1f} s):\n{done.stderr[-6000:]}"
    return out


def _text(page: str) -> str:
    """A page's text: tags dropped, entities decoded (code blocks keep their lines)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


class _Assets(HTMLParser):
    """What a page makes the browser fetch: (tag, URL) pairs, and ``url(...)`` in styles."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        name = ASSET_ATTRIBUTES.get(tag)
        if name and values.get(name):
            self.urls.append((tag, values[name] or ""))
        for url in re.findall(r"url\(\s*['\"]?([^'\")]+)", values.get("style") or ""):
            self.urls.append((f"{tag} style", url))


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(value for name, value in attrs if name == "id" and value)


def _ids(page: str) -> set[str]:
    """The ids of a page's elements."""
    parser = _Ids()
    parser.feed(page)
    return parser.ids


def test_site_builds_strict_and_offline_with_the_repositorys_own_text(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert (site / "reference" / "agent" / "index.html").is_file()
    for page in ("getting-started", "embedding", "aggregator", "live-list", "contracts"):
        assert (site / page / "index.html").is_file(), page
    for page in ("operating", "commands-json", "BENCHMARKS", "ARCHITECTURE"):
        assert (site / page / "index.html").is_file(), page
    for page in ("settings", "development", "design/modules", "design/overload"):
        assert (site / page / "index.html").is_file(), page

    # Nothing is loaded from another host: no web fonts, no CDN, by any page or style.
    external: list[str] = []
    for path in pages:
        parser = _Assets()
        parser.feed(path.read_text(encoding="utf-8"))
        external += [
            f"{path.relative_to(site)}: <{tag}> {url}"
            for tag, url in parser.urls
            if EXTERNAL.match(url)
        ]
    for path in site.rglob("*.css"):
        for url in re.findall(r"(?:url\(|@import)\s*['\"]?([^'\")\s]+)", path.read_text()):
            if EXTERNAL.match(url):
                external.append(f"{path.relative_to(site)}: {url}")
    assert not external, "assets from another host:\n" + "\n".join(external)

    # The example programs are shown as the repository holds them, every line.
    for page, files in EXAMPLES.items():
        text = _text((site / page / "index.html").read_text(encoding="utf-8"))
        for name in files:
            lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
            missing = [line for line in lines if line.strip() and line.rstrip() not in text]
            assert not missing, f"{page}: {name} lines not shown: {missing[:3]}"

    # The commands' --help as the installed commands print it, and every alert's rule.
    operating = _text((site / "operating" / "index.html").read_text(encoding="utf-8"))
    for command in ("discovery status", "discovery maint set", "discovery fence repair"):
        assert f"usage: {command}" in operating, command
    rules = yaml.safe_load((ROOT / "deploy" / "alerts.yml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert f'id="{rule["alert"].lower()}"' in (site / "operating" / "index.html").read_text(
                encoding="utf-8"
            ), rule["alert"]
    schemas = _text((site / "commands-json" / "index.html").read_text(encoding="utf-8"))
    assert '"title": "discovery status --json"' in schemas


# -- the Agent reference page in a real browser ----------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Files of the site; a directory without ``index.html`` is a 404, not a listing."""

    def list_directory(self, path: str | os.PathLike[str]) -> None:
        self.send_error(404, "no index.html")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on a free loopback port (directory URLs as on a host)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="docs-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.browser
async def test_agent_reference_renders_in_chromium_and_every_link_resolves(
    served: str,
) -> None:
    async_playwright = playwright_api()
    from playwright.async_api import expect

    origin = served
    url = f"{origin}/reference/agent/"
    offsite: list[str] = []

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})

            async def only_this_site(route: Any) -> None:
                if route.request.url.startswith(origin + "/"):
                    await route.continue_()
                else:  # the site must not need another host: note it, never fetch it
                    offsite.append(route.request.url)
                    await route.abort()

            await context.route("**/*", only_this_site)
            page = await context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            response = await page.goto(url, wait_until="load", timeout=UI_TIMEOUT_MS)
            assert response is not None
            assert response.status == 200

            # Agent's heading, signature and docstring, and methods of the real API.
            heading = page.locator('[id="discovery.Agent"]')
            await expect(heading).to_contain_text("Agent", timeout=UI_TIMEOUT_MS)
            body = page.locator("article")
            await expect(body).to_contain_text(
                "Keep one data server registered exactly while it is healthy."
            )
            await expect(body).to_contain_text("instance: ServiceInstance")
            for method in ("start", "astart", "set_ready", "drain", "adrain", "stop", "astop"):
                await expect(page.locator(f'[id="discovery.Agent.{method}"]')).to_have_count(1)
            await expect(page.locator('[id="discovery.AgentConfig"]')).to_have_count(1)
            text = await body.inner_text()
            for role in (":class:`", ":meth:`", ":func:`", ":mod:`"):
                assert role not in text, f"an unconverted Sphinx role {role} on the page"

            # The cross-references resolve between reference pages, not only within one.
            hrefs: list[str] = await page.eval_on_selector_all(
                "a[href]", "links => links.map(a => a.href)"
            )
            assert any("/reference/zookeeper/#discovery.ZkSession" in h for h in hrefs), hrefs
            assert any("/reference/errors/#discovery.errors." in h for h in hrefs), hrefs

            # Every link: same site, a page that answers 200, and its fragment an element.
            foreign = [h for h in hrefs if not h.startswith(origin + "/")]
            assert not foreign, f"links to other sites: {foreign}"
            ids: dict[str, set[str]] = {}
            broken: list[str] = []
            for href in sorted(set(hrefs)):
                target, fragment = urldefrag(href)
                if target not in ids:
                    answer = await context.request.get(target, timeout=UI_TIMEOUT_MS)
                    ids[target] = set()
                    if answer.status != 200:
                        broken.append(f"{href}: HTTP {answer.status}")
                        continue
                    if answer.headers.get("content-type", "").startswith("text/html"):
                        ids[target] = _ids(await answer.text())
                if fragment and unquote(fragment) not in ids[target]:
                    broken.append(f"{href}: no element with id {unquote(fragment)!r}")
            assert not broken, "links that do not resolve:\n" + "\n".join(broken)
            internal = {urlsplit(h).path for h in hrefs}
            assert len(internal) > 10, internal  # the nav, the reference pages, the guides
            assert not errors, f"script errors on the page: {errors}"
        finally:
            await browser.close()
    assert not offsite, f"requests to other hosts: {offsite}"


# -- every repository path the docs name exists ------------------------------------------


def _tracked_files() -> list[str]:
    """The repository's files as git knows them (the test needs a git checkout)."""
    try:
        done = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout: {exc}")
    return done.stdout.split()


def _named_paths(text: str) -> Iterator[str]:
    """Each word with a ``/`` in a code span or a link target of ``text``."""
    for match in NAMED.finditer(FENCED.sub("", text)):
        for word in (match.group(1) or match.group(2)).split():
            word = word.strip(",;:()'\"").split("#")[0]
            if "/" in word and "://" not in word:
                yield word


def _missing(path: str, root: Path) -> str | None:
    """Why ``path`` (repository-relative; ``<x>`` and ``...`` any name; ``file::test``
    a pytest node id) names nothing in ``root``, or None if it names something."""
    path, _, test = path.partition("::")
    pattern = re.sub(r"<[^>]*>|\.\.\.|…", "*", path)
    if any(fnmatch.fnmatch(pattern, written) for written in WRITTEN_BY_RUNS):
        return None
    found = sorted(root.glob(pattern)) if "*" in pattern else [root / path]
    if not any(candidate.exists() for candidate in found):
        return "no such file or directory"
    name = test.split("[")[0].split("::")[-1]
    if name and not re.search(
        rf"^\s*(?:async )?def {re.escape(name)}\(", found[0].read_text(), re.M
    ):
        return f"no test {name}"
    return None


def test_every_repository_path_the_docs_name_exists() -> None:
    tracked = _tracked_files()
    top = {name.split("/")[0] for name in tracked}
    # `zk/session.py` in a page is the core's: discovery/zk/session.py.
    subpackages = {
        name.split("/")[1]
        for name in tracked
        if name.count("/") >= 2 and name.startswith("discovery/")
    }
    pages = sorted({page for pattern in PAGES_NAMING_PATHS for page in ROOT.glob(pattern)})
    assert len(pages) > 10, pages
    stale: list[str] = []
    for page in pages:
        for word in _named_paths(page.read_text(encoding="utf-8")):
            first = word.split("/")[0]
            if first in top:
                path = word
            elif first in subpackages:
                path = f"discovery/{word}"
            else:  # a page of the site (checked by the strict build), a URL path, ...
                continue
            problem = _missing(path, ROOT)
            if problem:
                stale.append(f"{page.relative_to(ROOT)}: `{word}`: {problem}")
    assert not stale, "paths the docs name that the repository does not hold:\n" + "\n".join(stale)


def test_every_module_has_a_row_in_the_module_map() -> None:
    """docs/design/modules.md names every module of the three packages (a module of
    ``discovery`` by its path below ``discovery/``), and no module that is gone."""
    table = (ROOT / "docs" / "design" / "modules.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([^`]+\.py)` \|", table, re.MULTILINE))
    modules = set()
    for package in ("discovery", "search_server", "data_server"):
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT)
            name = relative.relative_to("discovery") if package == "discovery" else relative
            modules.add(name.as_posix())
    assert not modules - rows, f"modules with no row: {sorted(modules - rows)}"
    assert not rows - modules, f"rows of modules that are gone: {sorted(rows - modules)}"

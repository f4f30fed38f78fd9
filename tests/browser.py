"""Chromium for the browser tests (marker ``browser``): Debian's binary, driven by
Playwright, launched the same way by every test that opens a page."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

#: Debian's Chromium (``make setup`` installs it); the fast tier points this nowhere.
CHROMIUM = os.environ.get("DISCOVERY_TEST_CHROMIUM", "/usr/bin/chromium")
#: Headless, as root, and quiet on a closed network: without the background-networking
#: flags Chromium keeps dialling Google's hosts, many connections at a time.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Browser waits (ms): generous for a loaded CI box; each ends as soon as the page agrees.
UI_TIMEOUT_MS = 20_000


def playwright_api() -> Any:
    """Playwright's ``async_playwright``, with Chromium present; a clear failure otherwise."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: `make setup` installs the Debian package "
            "`chromium` (or: apt-get install chromium)",
            pytrace=False,
        )
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.fail(
            "the Python package `playwright` is missing: `make setup` installs the dev "
            "extra (pip install -e '.[dev]')",
            pytrace=False,
        )
    return async_playwright

"""The harness's HTTP calls to the run's servers, from outside as a client would.

:class:`ServerClient` asks a server's ``/readyz``, ``/cluster`` and ``/metrics`` and
posts to a data server's admin endpoints. A server that does not answer in time, or
answers badly, is an answer of its own (False or None), never an exception.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from discovery.adminauth import admin_headers

from .processes import Member

__all__ = ["ServerClient", "parse_metrics"]

log = logging.getLogger(__name__)


class ServerClient:
    """HTTP calls to the members over ``session`` (the caller's to close).

    ``admin_token`` is sent to a member in a namespace of its own (a run with
    partitions): it is then no longer called from loopback.
    """

    def __init__(self, session: aiohttp.ClientSession, admin_token: str) -> None:
        self._http = session
        self._admin_token = admin_token

    async def ready(self, member: Member) -> bool:
        """True if ``member`` answers ``GET /readyz`` with 200 (within the session's timeout)."""
        try:
            async with self._http.get(f"{member.url}/readyz") as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def admin(
        self, member: Member, path: str, body: object = None, *, timeout: float = 5.0
    ) -> bool:
        """POST to a data server's admin endpoint; True if 2xx within ``timeout`` s."""
        headers = admin_headers(self._admin_token if member.host is not None else None)
        try:
            async with self._http.post(
                f"{member.url}/admin/{path}",
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                await response.read()
                return response.status < 300
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("admin %s on %s failed: %s", path, member.name, exc)
            return False

    async def view(self, member: Member) -> dict[str, Any] | None:
        """A search server's ``GET /cluster``, or None if it does not answer quickly."""
        if not member.running or member.paused:
            return None
        try:
            async with self._http.get(
                f"{member.url}/cluster", timeout=aiohttp.ClientTimeout(total=1)
            ) as response:
                if response.status != 200:
                    return None
                view: dict[str, Any] = await response.json()
                return view
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def metrics(self, member: Member) -> dict[str, float] | None:
        """A server's ``GET /metrics`` as ``{"name{label=value,...}": value}`` (labels
        sorted), or None if it does not answer."""
        if not member.running or member.paused:
            return None
        try:
            async with self._http.get(
                f"{member.url}/metrics", timeout=aiohttp.ClientTimeout(total=2)
            ) as response:
                if response.status != 200:
                    return None
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None
        return parse_metrics(text)

    async def leader(self, search: Mapping[str, Member]) -> Member | None:
        """The search server of ``search`` that says it leads (None if none does, or
        several)."""
        views = await asyncio.gather(*(self.view(m) for m in search.values()))
        leaders = [
            search[view["self"]]
            for view in views
            if view is not None and view.get("is_leader") and view.get("self") in search
        ]
        return leaders[0] if len(leaders) == 1 else None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus' text format as ``{"name{label=value,...}": value}`` (labels sorted);
    lines it cannot read are left out."""
    samples: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    except ValueError as exc:
        log.warning("unreadable metrics: %s", exc)
    return samples

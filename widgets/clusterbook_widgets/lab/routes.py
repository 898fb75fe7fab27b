"""The REST API under ``/clusterbook/api/``, on Jupyter Server's :class:`APIHandler`: its
authentication on every route (``@tornado.web.authenticated``) and its XSRF check on every
request that is not a GET.

=========================================================  ===================================
``GET clusters``                                           every cluster of this user
``POST clusters`` ``{"profile": NAME}``                    a new detached cluster of a profile
``POST clusters/ID/stop``                                  stop a cluster
``GET clusters/ID/jobs``                                   its jobs, newest first
``GET clusters/ID/jobs/JOB/logs?after=N&limit=L``          lines from position N on, ``next``
``GET clusters/ID/resources?window=S``                     the head's resource history
``GET profiles``                                           the user's profiles
=========================================================  ===================================

An error answers JSON ``{"message": ..., "error": NAME}``: 404 for an unknown cluster, job or
profile (or a job whose files are gone), 409 for a cluster that is not running, 400 for bad
input, 500 for the rest.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from clusterbook.errors import ClusterError, ClusterStateError, ConfigError, RecordError
from clusterbook_widgets.lab.service import ClusterService

__all__ = ["PREFIX", "handlers", "status_of"]

PREFIX = "clusterbook/api"
_ID = r"(?P<cluster>[^/]+)"
_JOB = r"(?P<job>[^/]+)"


def status_of(exc: ClusterError) -> int:
    """The HTTP status that answers ``exc`` (pure)."""
    if isinstance(exc, (LookupError, RecordError)):  # no such cluster, job, profile or files
        return 404
    if isinstance(exc, ClusterStateError):
        return 409
    if isinstance(exc, ConfigError):
        return 400
    return 500


class _Handler(APIHandler):
    """A route: its service's call, run on the service's threads, answered as JSON."""

    def initialize(self, service: ClusterService, pool: ThreadPoolExecutor) -> None:
        self.service = service
        self.pool = pool

    async def answer(self, call: Callable[..., Any], *args: Any, status: int = 200) -> None:
        loop = asyncio.get_running_loop()
        try:
            value = await loop.run_in_executor(self.pool, call, *args)
        except ClusterError as exc:
            self.set_status(status_of(exc))
            self.finish(json.dumps({"message": str(exc), "error": type(exc).__name__}))
            return
        self.set_status(status)
        self.finish(json.dumps(value))

    def number(self, name: str, kind: Callable[[str], Any]) -> Any:
        """Query argument ``name`` as a ``kind`` (None when not given); 400 if it is not one."""
        text = self.get_query_argument(name, None)
        if text is None:
            return None
        try:
            return kind(text)
        except ValueError:
            raise tornado.web.HTTPError(
                400, f"{name}={text!r} is not a number; give {name}=10, for instance."
            ) from None


class Clusters(_Handler):
    @tornado.web.authenticated
    async def get(self) -> None:
        await self.answer(self.service.clusters)

    @tornado.web.authenticated
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            raise tornado.web.HTTPError(
                400, 'The body is not JSON; send {"profile": NAME}.'
            ) from None
        profile = body.get("profile") if isinstance(body, dict) else None
        await self.answer(self.service.new, profile, status=201)


class Stop(_Handler):
    @tornado.web.authenticated
    async def post(self, cluster: str) -> None:
        await self.answer(self.service.stop, cluster)


class Jobs(_Handler):
    @tornado.web.authenticated
    async def get(self, cluster: str) -> None:
        await self.answer(self.service.jobs, cluster)


class Logs(_Handler):
    @tornado.web.authenticated
    async def get(self, cluster: str, job: str) -> None:
        after = self.number("after", int) or 0
        limit = self.number("limit", int)
        args = (cluster, job, after) if limit is None else (cluster, job, after, limit)
        await self.answer(self.service.logs, *args)


class Resources(_Handler):
    @tornado.web.authenticated
    async def get(self, cluster: str) -> None:
        await self.answer(self.service.resources, cluster, self.number("window", float))


class Profiles(_Handler):
    @tornado.web.authenticated
    async def get(self) -> None:
        await self.answer(self.service.profiles)


def handlers(
    base_url: str, service: ClusterService, pool: ThreadPoolExecutor
) -> list[tuple[str, type[_Handler], dict[str, Any]]]:
    """Tornado's routes of the API under ``base_url``."""
    args = {"service": service, "pool": pool}
    routes: list[tuple[str, type[_Handler]]] = [
        ("clusters", Clusters),
        (f"clusters/{_ID}/stop", Stop),
        (f"clusters/{_ID}/jobs", Jobs),
        (f"clusters/{_ID}/jobs/{_JOB}/logs", Logs),
        (f"clusters/{_ID}/resources", Resources),
        ("profiles", Profiles),
    ]
    return [(url_path_join(base_url, PREFIX, path), cls, args) for path, cls in routes]

"""A real Jupyter Server with clusterbook's extension, in a home of its own, and a detached
cluster started from another process (as from a terminal) in the same home: what the
server-extension tests and the sidebar's browser tests share."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pytest

from tests.browser.lab import free_port, tail
from tests.conftest import served_url

# Starts a detached local cluster and a job on it, prints the cluster's id and exits: the
# cluster runs on in its supervisor, as one started from a terminal does.
STARTER = textwrap.dedent("""\
    import sys
    import clusterbook as cb
    python, name, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    cluster = cb.Cluster.local(1, 2, python=python, name=name, detached=True).start()
    if argv:
        cluster.mpirun(argv, np=2)
    print(cluster.id, flush=True)
    """)


def start_detached(env: Mapping[str, str], name: str, argv: Sequence[str] = ()) -> str:
    """Start a detached cluster (and a 2-rank job of ``argv``) in another process; its id."""
    done = subprocess.run(
        [sys.executable, "-c", STARTER, sys.executable, name, *argv],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def stop_all(env: Mapping[str, str]) -> None:
    """Stop every cluster of the home (those a test left running)."""
    listed = subprocess.run(
        [sys.executable, "-m", "clusterbook", "ls"],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    for line in listed.stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] in ("starting", "running", "stopping", "stale"):
            subprocess.run(
                [sys.executable, "-m", "clusterbook", "stop", fields[0]],
                env=dict(env),
                capture_output=True,
                timeout=60,
            )


@dataclass
class Server:
    url: str
    token: str

    def call(
        self, path: str, method: str = "GET", body: Any = None, *, token: bool = True
    ) -> tuple[int, str]:
        """The status and body of a request to the API (``token``: with the server's)."""
        headers = {"Authorization": f"token {self.token}"} if token else {}
        data = None if body is None else json.dumps(body).encode()
        if method != "GET" and data is None:
            data = b"{}"
        request = urllib.request.Request(  # noqa: S310 (http, to the server the test started)
            f"{self.url}/clusterbook/api/{path}", data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def browser(self) -> tuple[urllib.request.OpenerDirector, CookieJar]:
        """An opener logged in as a browser is: by the token once, then by cookies."""
        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with opener.open(f"{self.url}/login?token={self.token}", timeout=30):
            pass
        return opener, jar


def _status(server: Server) -> int | None:
    try:
        return server.call("clusters")[0]
    except OSError:  # not listening yet (urllib's URLError is one)
        return None


@contextlib.contextmanager
def jupyter_server(env: Mapping[str, str], root: Path, log_path: Path) -> Iterator[Server]:
    """``jupyter server`` with this checkout's extension, killed at the end if it does not
    shut down."""
    port, token = free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1",
            f"--port={port}", f"--IdentityProvider.token={token}", "--allow-root",
            f"--ServerApp.root_dir={root}"]  # fmt: skip
    log = log_path.open("wb")
    server = subprocess.Popen(
        argv, env=dict(env), cwd=root, stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    running = Server(url, token)
    try:
        deadline = time.monotonic() + 60
        while (said := served_url(log_path)) is None or _status(Server(said, token)) != 200:
            if server.poll() is not None:
                pytest.fail(f"jupyter server exited with {server.returncode}: {tail(log_path)}")
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter server's clusters API did not answer: {tail(log_path)}")
            time.sleep(0.2)
        running = Server(said, token)  # not the port asked for: see served_url
        yield running
    finally:
        server.send_signal(signal.SIGINT)
        with contextlib.suppress(ProcessLookupError):
            server.send_signal(signal.SIGINT)  # the second one skips the "are you sure"
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()

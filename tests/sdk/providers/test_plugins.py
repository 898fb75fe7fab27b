"""Third parties add cluster kinds and rendezvous stores through entry points: a package
installed beside clusterbook (here a dist-info on sys.path) is found by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PLUGIN = """\
from clusterbook.rendezvous.backends.memory import MemoryBackend
from clusterbook.testing import FakeProvider


def make(nodes=1, slots=1):
    return FakeProvider(nodes=nodes, slots=slots, bounds=(1, 4))


def backend(url, secret, *, node, timeout):
    return MemoryBackend()
"""
ENTRY_POINTS = """\
[clusterbook.providers]
pretend = plugin_pkg:make

[clusterbook.rendezvous_backends]
mem = plugin_pkg:backend
"""
CHECK = """\
import clusterbook as cb
from clusterbook.providers.registry import provider_kinds
from clusterbook.rendezvous.registry import backend_for, parse_join_url, schemes

print("pretend" in provider_kinds(), "mem" in schemes())
cluster = cb.Cluster.from_spec({"kind": "pretend", "nodes": 3, "slots": 2})
print(cluster.kind, len(cluster._provider._nodes), cluster.snapshot().max_nodes)
print(type(backend_for("mem://anywhere", b"s" * 32)).__name__)
print(parse_join_url("mem://anywhere/run7?min=2&max=3")[1].run_id)
try:
    cb.Cluster.from_spec({"kind": "pretends"})
except cb.ConfigError as exc:
    print("pretend" in str(exc))
"""


def test_kinds_and_stores_of_an_installed_plugin_are_found_by_name(tmp_path: Path) -> None:
    (tmp_path / "plugin_pkg").mkdir()
    (tmp_path / "plugin_pkg" / "__init__.py").write_text(PLUGIN)
    info = tmp_path / "plugin_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    out = subprocess.run(
        [sys.executable, "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "True True",
        "fake 3 4",
        "MemoryBackend",
        "run7",
        "True",
    ]

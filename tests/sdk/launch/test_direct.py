"""Starting Open MPI's prterun as its mpirun would: what is learned, when a job uses it, the
command line it makes (and the real mpirun's own word on what it sets)."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from clusterbook.launch.command import build_command
from clusterbook.launch.direct import OWN, added, learn, prterun_start
from tests.sdk.launch.test_command import OMPI, plan

SETS = (
    ("OMPI_VERSION", "5.0.11"),
    ("OPAL_PREFIX", "/opt/mpi"),
    ("PRTE_MCA_schizo_proxy", "ompi"),
)
DIRECT = replace(OMPI, prterun_sets=SETS)


def test_what_mpirun_adds_is_what_it_sets_or_changes_but_where_it_was_told_to_exec() -> None:
    before = {"HOME": "/home/me", "OPAL_PREFIX": "/old"}
    after = {**before, "OPAL_PREFIX": "/opt/mpi", "OMPI_VERSION": "5.0.11", OWN: "/usr/bin/env"}
    assert added(before, after) == {"OPAL_PREFIX": "/opt/mpi", "OMPI_VERSION": "5.0.11"}


def test_a_job_starts_the_prterun_beside_mpirun_with_what_mpirun_sets() -> None:
    assert prterun_start("/opt/mpi/bin/mpirun", SETS, {"FOO": "1"}) == (
        "/opt/mpi/bin/prterun",
        dict(SETS),
    )


@pytest.mark.parametrize("env", [{"OPAL_PREFIX": "/elsewhere"}, {OWN: "/my/prterun"}])
def test_a_job_that_sets_what_mpirun_sets_starts_mpirun(env: dict[str, str]) -> None:
    assert prterun_start("/opt/mpi/bin/mpirun", SETS, env) is None


def test_nothing_learned_starts_mpirun() -> None:
    assert prterun_start("/opt/mpi/bin/mpirun", None, {}) is None


def test_the_command_line_is_mpiruns_with_prterun_first_and_its_variables_added() -> None:
    through_mpirun = build_command(plan())
    direct = build_command(plan(launcher=DIRECT))
    assert through_mpirun.argv[0] == "/opt/mpi/bin/mpirun"
    assert direct.argv == ["/opt/mpi/bin/prterun", *through_mpirun.argv[1:]]
    assert direct.env == {**through_mpirun.env, **dict(SETS)}


def test_a_job_env_setting_opal_prefix_goes_through_mpirun() -> None:
    command = build_command(plan(launcher=DIRECT, env={"OPAL_PREFIX": "/mine"}))
    assert command.argv[0] == "/opt/mpi/bin/mpirun"
    assert command.env["OPAL_PREFIX"] == "/mine"


def test_before_open_mpi_5_or_without_prterun_nothing_is_learned(tmp_path: Path) -> None:
    assert learn("/usr/bin/mpirun", "4.1.5") is None
    fake = tmp_path / "mpirun"  # no prterun beside it
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert learn(str(fake), "5.0.11") is None


def test_the_real_mpirun_says_what_it_sets() -> None:
    mpirun = Path(sys.executable).with_name("mpirun")
    if not mpirun.exists():
        pytest.skip("no Open MPI beside this Python")
    learned = learn(str(mpirun), "5.0.11")
    assert learned is not None
    sets = dict(learned)
    prefix = os.path.realpath(Path(sys.executable).parent.parent)
    assert sets["PRTE_MCA_schizo_proxy"] == "ompi"
    assert sets["OMPI_TOOL_NAME"] == "mpirun"
    assert sets["PRTE_PREFIX"] == sets["PMIX_PREFIX"] == os.environ.get("OPAL_PREFIX", prefix)
    assert OWN not in sets

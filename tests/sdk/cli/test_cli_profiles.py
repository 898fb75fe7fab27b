"""``clusterbook profiles`` (list, show) and ``--profile NAME`` of ``run`` and ``demo``: the
config directory named by ``CLUSTERBOOK_CONFIG`` in the command's environment; ``run`` and
``demo`` start real local clusters from a profile."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clusterbook.cli.main import main
from clusterbook.cli.profiles import toml_table
from clusterbook.config import FILE_NAME, parse_profiles

CLI = [sys.executable, "-m", "clusterbook"]

PROFILES = """
[profiles.pair]
kind = "local"
workers = 2
slots = 1
env = { GREETING = "from the profile", SEED = "7" }
life_span = "2h"
detached = false

[profiles.lab]
kind = "ssh"
hosts = ["node1:4", "node2:4"]
usr = "alice"
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "config"
    directory.mkdir(mode=0o700)
    (directory / FILE_NAME).write_text(PROFILES)
    monkeypatch.setenv("CLUSTERBOOK_CONFIG", str(directory))
    return directory


def cli(args: list[str], config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CLUSTERBOOK_CONFIG": str(config)}
    env["CLUSTERBOOK_RUN_ROOT"] = str(tmp_path / "runs")
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=180, check=False
    )


def test_profiles_lists_each_profile_with_its_kind_and_options(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"# {config / FILE_NAME}"
    assert re.fullmatch(r"pair +local +workers=2 slots=1 env=\{ .* \} .*", out[1]), out
    assert re.fullmatch(r"lab +ssh +hosts=\[\"node1:4\", \"node2:4\"\] usr=\"alice\"", out[2])
    assert main(["profiles", "list"]) == 0
    assert capsys.readouterr().out.splitlines() == out


def test_show_prints_the_profile_as_toml_that_reads_back_the_same(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profiles", "show", "pair"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"# {config / FILE_NAME}\n[profiles.pair]\n")
    again = parse_profiles(shown, config / FILE_NAME)
    original = parse_profiles(PROFILES, config / FILE_NAME)
    assert again["pair"].spec == original["pair"].spec


def test_a_table_reads_back_the_same_whatever_its_keys_and_values() -> None:
    values = {
        "kind": "local",
        "a key": 'q"uote\\',
        "n": [1, 2.5, True, "x"],
        "t": {"é": {"deep": False}, "ok_key-1": []},
    }
    text = toml_table("profiles.x", values)
    assert dict(parse_profiles(text, Path("shown.toml"))["x"].spec) == values


def test_show_of_a_missing_profile_lists_those_there_are(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profiles", "show", "par"]) == 2
    err = capsys.readouterr().err
    assert "No profile 'par': the profiles in" in err
    assert "are 'pair', 'lab'. Did you mean 'pair'?" in err


def test_profiles_without_a_file_says_where_it_would_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CLUSTERBOOK_CONFIG", str(tmp_path))
    assert main(["profiles"]) == 0
    assert f"No profiles: there is no {tmp_path / FILE_NAME}." in capsys.readouterr().err


def test_run_with_a_profile_of_a_bad_key_names_it_and_starts_nothing(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "-n", "1", "--profile", "lab", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert f"Profile 'lab' ({config / FILE_NAME}) makes a cluster of kind 'ssh'" in err
    assert "did you mean 'user'?" in err


@pytest.mark.parametrize(
    ("more", "said"),
    [
        (["--hosts", "a:1"], "--profile pair says where the nodes come from; --hosts too"),
        (["--slurm", "2"], "--slurm too"),
        (["--via", "ssh"], "--via too"),
    ],
)
def test_run_with_a_profile_and_other_nodes_says_to_give_one(
    config: Path, capsys: pytest.CaptureFixture[str], more: list[str], said: str
) -> None:
    assert main(["run", "-n", "1", "--profile", "pair", *more, "--", "true"]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.mpi
def test_run_starts_the_profile_s_cluster(
    config: Path, tmp_path: Path, openmpi_python: str
) -> None:
    code = "import os; print(os.environ['GREETING'])"
    proc = cli(
        ["run", "-n", "2", "--profile", "pair", "--", "python", "-c", code], config, tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] from the profile", "[1] from the profile"]
    # Two slots in all: a third rank is more than the profile's cluster has...
    proc = cli(["run", "-n", "3", "--profile", "pair", "--", "true"], config, tmp_path)
    assert proc.returncode == 2
    assert "more than the cluster's 2 slots" in proc.stderr
    # ...unless the command line gives each node more (it overrides the profile's slots).
    more = ["run", "-n", "3", "--profile", "pair", "--slots", "2", "--", "true"]
    assert cli(more, config, tmp_path).returncode == 0


@pytest.mark.mpi
def test_demo_runs_on_the_profile_s_cluster(
    config: Path, tmp_path: Path, openmpi_python: str
) -> None:
    proc = cli(["demo", "--profile", "pair"], config, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "local-0" in proc.stdout
    assert "local-1" in proc.stdout
    found = re.findall(r"rank \d/2 on \S+: allreduce\(rank\+1\) = 3 \(expected 3\)", proc.stdout)
    assert len(found) == 2, proc.stdout

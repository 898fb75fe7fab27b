"""GPUs: what ``nvidia-smi -L`` says, read without CUDA, with a stand-in ``nvidia-smi`` first
on PATH (this machine has no GPU): parsing, the probe (also failing, missing and hanging),
``CUDA_VISIBLE_DEVICES`` where it is probed, and how a node's GPUs travel."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from clusterbook.gpus import (
    GPU,
    NO_GPUS,
    GPUInfo,
    gpu_info,
    parse_nvidia_smi,
    probe_gpus,
    visible_gpus,
)
from clusterbook.nodes.tasks.probe import probe
from clusterbook.rendezvous.report import NodeReport
from clusterbook.ssh.preflight import NodeFacts
from clusterbook.testing import fake_nvidia_smi

LISTING = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-6e9c3bd4-8f2a-4b1c-9d3e-0a1b2c3d4e5f)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-1f2e3d4c-5b6a-4978-8a9b-0c1d2e3f4a5b)
  MIG 3g.20gb     Device  0: (UUID: MIG-8a7b6c5d-4e3f-5a2b-9c1d-0e1f2a3b4c5d)
GPU 2: Tesla T4 (UUID: GPU-aaaabbbb-cccc-4ddd-8eee-ffff00001111)

GPU 3: Quadro RTX 8000
"""


@pytest.fixture
def smi_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Put a stand-in nvidia-smi first on PATH: ``smi_path(gpus, exit_code=..., delay=...)``;
    without it, PATH has no nvidia-smi at all."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def put(gpus: int | list[str] = 2, **how: float) -> Path:
        where = fake_nvidia_smi(tmp_path / f"smi{len(list(tmp_path.iterdir()))}", gpus, **how)
        monkeypatch.setenv("PATH", f"{where}{os.pathsep}/usr/bin:/bin")
        return where

    return put


def test_the_listing_is_read_gpu_lines_only() -> None:
    gpus = parse_nvidia_smi(LISTING)
    assert [g.index for g in gpus] == [0, 1, 2, 3]  # the MIG line and the blank one skipped
    assert gpus[0] == GPU(0, "NVIDIA A100-SXM4-40GB", "GPU-6e9c3bd4-8f2a-4b1c-9d3e-0a1b2c3d4e5f")
    assert gpus[2].model == "Tesla T4"
    assert gpus[3] == GPU(3, "Quadro RTX 8000", "")  # no UUID listed
    assert parse_nvidia_smi("No devices were found\n") == ()


def test_a_record_says_count_models_uuids_and_ids() -> None:
    info = GPUInfo(parse_nvidia_smi(LISTING))
    assert info.count == 4
    assert info.models[:3] == ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "Tesla T4")
    assert info.uuids[3] == ""
    assert info.ids == ("0", "1", "2", "3")
    assert info.model == "NVIDIA A100-SXM4-40GB (2), Tesla T4 (1), Quadro RTX 8000 (1)"
    assert GPUInfo(info.devices[:2]).model == "NVIDIA A100-SXM4-40GB"
    assert NO_GPUS.count == 0
    assert NO_GPUS.model is None


@pytest.mark.parametrize(
    ("value", "indices"),
    [
        (None, [0, 1, 2, 3]),  # not set: every GPU
        ("2,0", [2, 0]),  # in its order
        ("1,1,3", [1, 3]),
        ("GPU-aaaabbbb", [2]),  # a UUID prefix, as CUDA takes them
        (" 3 , GPU-1f2e", [3, 1]),
        ("0,7,1", [0]),  # CUDA reads up to the first entry that names no GPU
        ("-1", []),
        ("", []),  # set but empty: no GPU
        ("GPU-", []),  # a prefix of several is no GPU
    ],
)
def test_cuda_visible_devices_where_probed_restricts_the_gpus(
    value: str | None, indices: list[int]
) -> None:
    gpus = parse_nvidia_smi(LISTING)
    assert [g.index for g in visible_gpus(gpus, value)] == indices


def test_the_machines_gpus_are_shared_out_in_order() -> None:
    four = GPUInfo(parse_nvidia_smi(LISTING))
    assert [four.share(i, 2).ids for i in range(2)] == [("0", "1"), ("2", "3")]
    assert [four.share(i, 3).ids for i in range(3)] == [("0", "1"), ("2",), ("3",)]
    last = four.share(4, 5)
    assert last.count == 0
    assert "4 GPU(s) all went to the workers before it" in (last.problem or "")
    assert NO_GPUS.share(0, 2) == NO_GPUS


def test_a_record_travels_as_json_and_garbage_reads_as_none() -> None:
    info = GPUInfo(parse_nvidia_smi(LISTING))
    assert GPUInfo.from_json(info.to_json()) == info
    assert GPUInfo.from_json({"devices": [], "problem": "nvidia-smi is not on PATH"}) == GPUInfo(
        problem="nvidia-smi is not on PATH"
    )
    for bad in (None, "x", {"devices": [["0", "m", "u"], [1, 2]], "problem": 3}):
        assert GPUInfo.from_json(bad) == NO_GPUS


def test_nodes_without_gpus_read_as_one_shared_value_per_reason() -> None:
    # A head reads 100,000 reports: most say "no GPU", for one of a few reasons.
    none = {"devices": [], "problem": "nvidia-smi is not on PATH"}
    assert GPUInfo.from_json(dict(none)) is GPUInfo.from_json(dict(none))
    assert GPUInfo.from_json({"devices": [], "problem": None}) is NO_GPUS
    info = GPUInfo(parse_nvidia_smi(LISTING))
    assert GPUInfo.from_json(info.to_json()) is not GPUInfo.from_json(info.to_json())


def test_the_probe_lists_the_gpus_nvidia_smi_lists(smi_path) -> None:
    smi_path(2)
    two = probe_gpus()
    assert (two.count, two.model, two.problem) == (2, "NVIDIA A100-SXM4-40GB", None)
    smi_path(["NVIDIA H100 80GB HBM3"] * 3 + ["Tesla T4"])
    four = probe_gpus()
    assert four.count == 4
    assert four.models[-1] == "Tesla T4"
    assert len(set(four.uuids)) == 4


def test_without_nvidia_smi_there_is_no_gpu_and_it_says_why(smi_path) -> None:
    assert probe_gpus() == GPUInfo(problem="nvidia-smi is not on PATH")


def test_a_failing_nvidia_smi_means_no_gpu_and_its_last_words(smi_path) -> None:
    smi_path(2, exit_code=9)
    info = probe_gpus()
    assert info.count == 0
    assert info.problem is not None
    assert info.problem.startswith("nvidia-smi -L exited with 9: NVIDIA-SMI has failed")


def test_a_hanging_nvidia_smi_is_given_up_on(smi_path) -> None:
    smi_path(2, delay=30)
    start = time.monotonic()
    info = probe_gpus(timeout=0.5)
    assert time.monotonic() - start < 5
    assert info == GPUInfo(problem="nvidia-smi -L did not answer within 0.5 s")


def test_an_empty_listing_and_a_hiding_cuda_visible_devices_say_so() -> None:
    assert gpu_info({"stdout": "No devices were found\n"}).problem == "nvidia-smi -L lists no GPU"
    hidden = gpu_info({"stdout": LISTING, "cuda_visible_devices": ""})
    assert hidden.count == 0
    assert hidden.problem == "CUDA_VISIBLE_DEVICES='' where it was probed hides all 4 of its GPUs"
    assert gpu_info({"stdout": LISTING, "cuda_visible_devices": "3"}).ids == ("3",)


def test_the_node_probe_reports_the_gpus_and_the_visible_ones_only(smi_path, monkeypatch) -> None:
    smi_path(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    facts = NodeFacts.from_json(probe({"prefix": sys.prefix, "flavour": "openmpi"}))
    assert facts.gpus.ids == ("3", "1")
    assert facts.gpus.model == "NVIDIA A100-SXM4-40GB"
    assert NodeFacts.from_json({"cores": 2}).gpus == NO_GPUS  # a probe that said nothing


def test_an_agents_report_carries_its_gpus(smi_path) -> None:
    smi_path(2)
    report = NodeReport.here(2)
    assert report.gpus.count == 2
    back = NodeReport.from_json(report.with_load().to_json())
    assert back.gpus == report.gpus
    assert NodeReport.from_json({"hostname": "n"}).gpus == NO_GPUS  # an older agent's

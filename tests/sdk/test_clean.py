"""The clean policy (``clean=``): a result that lists the processes a failed job kept."""

from __future__ import annotations

import json
from dataclasses import replace

from clusterbook.launch.result import JobResult, KeptProcess, RankFailure

KEPT = (
    KeptProcess(101, "vm", "python", 0),
    KeptProcess(100, "vm", "prterun", None),
    KeptProcess(102, "vm", "sh", None),
)


def test_a_result_lists_the_processes_kept_and_survives_its_file() -> None:
    result = JobResult(
        "job-0001",
        -19,
        {0: None, 1: 1},
        (RankFailure(1, "vm", 1, ("RuntimeError: boom",)),),
        1.5,
        kept=KEPT,
    )
    summary = result.summary()
    assert (
        "Kept stopped for inspection (clean='none'): rank 0 pid 101 on vm; 2 other process(es) "
        "of the job; job.cleanup() or the cluster's stop() ends them." in summary
    )
    back = JobResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back == result
    assert JobResult.from_dict({**result.to_dict(), "kept": []}).kept == ()
    assert "Kept" not in replace(result, kept=()).summary()

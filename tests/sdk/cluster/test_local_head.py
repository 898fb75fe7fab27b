"""The head that runs a cluster in this process, against the shipped FakeProvider: what the
provider's change callback does (the jobs' policy) and what a plain change does (the news only),
a job's label from its start to the snapshot and the record, and the head's services working
for it as a head state. No agent, no sshd; jobs run a stand-in launcher."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.cluster.local_head import LocalHead
from clusterbook.cluster.options import ClusterOptions
from clusterbook.head.record import read_record
from clusterbook.testing import FakeProvider
from tests.sdk.cluster.test_facade import STAND_IN


class AskedProvider(FakeProvider):
    """A FakeProvider that counts what it is asked of its nodes' reachability."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.asked = 0

    def unreachable(
        self, names: Sequence[str], *, lost_only: bool = False, ended: bool = False
    ) -> dict[str, str]:
        self.asked += 1
        return super().unreachable(names, lost_only=lost_only, ended=ended)


@pytest.fixture
def make(tmp_path: Path) -> Iterator:
    launcher = tmp_path / "bin" / "mpirun"
    launcher.parent.mkdir()
    launcher.write_text(STAND_IN)
    launcher.chmod(0o755)
    made: list[LocalHead] = []

    def head(provider: FakeProvider) -> LocalHead:
        options = ClusterOptions.make(
            provider.kind, launcher=str(launcher), run_dir=tmp_path / f"run{len(made)}"
        )
        made.append(LocalHead(provider, options))
        return made[-1]

    yield head
    for h in made:
        h.stop()


def test_a_change_tells_only_and_the_providers_callback_runs_the_jobs_policy(make) -> None:
    fake = AskedProvider(nodes=2)
    head = make(fake)
    head.start()
    seen: list[cb.ClusterSnapshot] = []
    head.subscribe(seen.append)
    job = head.mpirun(["true"], np=2, env={"FAKE_MPIRUN_SLEEP": "60"})
    asked = fake.asked
    head.changed(record=True)  # what a job's start or end, or a served request, calls
    assert fake.asked == asked  # the news asks the provider nothing of its nodes
    assert seen
    assert not job.done()
    fake.lose("fake-1")  # the provider's callback: head.nodes_changed
    assert isinstance(job.wait(timeout=30), cb.JobResult)
    assert isinstance(job.error, cb.NodeLostError)
    assert fake.asked > asked


def test_a_jobs_label_reaches_its_snapshot_and_the_record(make) -> None:
    head = make(FakeProvider(nodes=1))
    head.start()
    labelled = head.mpirun(["true"], np=1, label="my service")
    plain = head.mpirun(["true"], np=1)
    assert labelled.wait(30).ok
    assert plain.wait(30).ok
    shown = {j.id: j.label for j in head.snapshot().jobs}
    assert shown == {labelled.id: "my service", plain.id: None}
    recorded = {j.id: j.label for j in read_record(head.run_dir).jobs}
    assert recorded == shown
    raw = json.loads((head.run_dir / "cluster.json").read_text())
    assert [j["label"] for j in raw["jobs"]] == ["my service", None]


def test_the_head_answers_for_its_jobs_by_id(make) -> None:
    head = make(FakeProvider(nodes=1))
    head.start()
    with pytest.raises(cb.ClusterStateError, match="has run no job yet"):
        head.job()
    first = head.mpirun(["true"], np=1)
    second = head.mpirun(["true"], np=1)
    assert head.job() is second
    assert head.job(first.id) is first
    with pytest.raises(cb.ClusterStateError, match=r"no job 'job-9'; its jobs: job-0001, job-"):
        head.job("job-9")
    for job in (first, second):
        job.wait(30)


def test_a_stop_for_a_reason_is_recorded_with_it(make) -> None:
    head = make(FakeProvider(nodes=1))
    head.start()
    head.stop_for("the life span passed")
    record = read_record(head.run_dir)
    assert (record.state, record.stop_reason) == ("stopped", "the life span passed")
    assert record.address is None  # the control server is gone with the cluster


def test_a_snapshot_without_jobs_still_shows_the_ranks_a_running_job_holds(make) -> None:
    head = make(FakeProvider(nodes=1, slots=2))
    head.start()
    job = head.mpirun(["true"], np=2, env={"FAKE_MPIRUN_SLEEP": "60"})
    try:
        full, bare = head.snapshot(), head.snapshot(jobs=False)
        assert [j.id for j in full.jobs] == [job.id]
        assert bare.jobs == ()  # what the record asks for: it makes its own entries
        assert bare.nodes == full.nodes
        assert [n.ranks for n in bare.nodes] == [(0, 1)]
        assert [j.state for j in read_record(head.run_dir).jobs] == ["running"]
    finally:
        job.cancel()
        job.wait(30)

"""The contract every provider passes (``clusterbook.providers.base``): its lifecycle, its
nodes and their statuses, its watch and its reach.

A provider's test module subclasses :class:`ProviderContract` and provides the ``case``
fixture: a :class:`ProviderCase` that makes the provider (and one whose start fails), brings
its nodes up where something outside it must (an elastic cluster's agents), can make one
node go missing, and says what else of a cluster could be left behind. Each test starts its
own provider; the ``started`` fixture stops it and checks that nothing of the cluster is left
(no process, no file in its directory here, nothing the case knows of), even when the test
failed.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from clusterbook.launch.flavour import find_launcher
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.nodes.transfer import outgoing
from clusterbook.paths import cluster_dir
from clusterbook.providers.base import Provider, StartContext

#: How long a provider gets to have its nodes ready, and what it leaves to go after a stop.
READY = 60.0
GONE = 10.0
#: The states of a node that runs jobs.
UP = ("ready", "joined", "running")

_ids = itertools.count()


class ProviderCase:
    """How the contract meets one kind of provider (the defaults fit a fixed set of nodes
    whose start needs nothing from outside)."""

    #: The provider's kind, in the clusters' ids.
    kind = "?"
    #: Whether its nodes come once started (the batch job of a Slurm that never runs its
    #: jobs, FakeSlurm's, never brings them).
    comes_up = True
    #: A directory each node sees as its own (``put`` sends there, ``gather`` takes from
    #: there); the nodes that share this machine's files see this machine's.
    scratch: Path

    def make(self) -> Provider:
        """A new provider, not started."""
        raise NotImplementedError

    def failing(self) -> Provider:
        """A new provider whose start fails (a :class:`cb.ClusterError`)."""
        raise NotImplementedError

    def bring_up(self, provider: Provider, ctx: StartContext) -> None:
        """What brings the nodes of a started ``provider`` besides itself (agents that join)."""

    def miss(self, provider: Provider) -> str | None:
        """Make a node of a started, ready ``provider`` go missing (it stops answering) and
        return, once the provider noticed, words that ``wait_ready``'s timeout must then say;
        None where no node can go missing once started (a fixed set)."""
        return None

    def mend(self) -> None:
        """Undo what :meth:`miss` did (before the provider stops)."""

    def leftovers(self, cluster_id: str) -> list[str]:
        """What of cluster ``cluster_id`` the case finds left beyond this machine's processes
        and the cluster's directory here (on nodes, in a queue)."""
        return []


def running(cluster_id: str) -> list[str]:
    """Processes of cluster ``cluster_id`` on this machine (and the fake hosts, which share
    its processes): those naming it on their command line, or tagged with it."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            argv = proc.info["cmdline"] or []
            tag = proc.environ().get("CLUSTERBOOK_JOB", "")
        except psutil.Error:
            continue
        if tag.startswith(cluster_id) or any(cluster_id in arg for arg in argv):
            found.append(f"pid {proc.pid}: {' '.join(argv)[:200]} (tag {tag!r})")
    return found


def lost(provider: Provider, name: str, within: float = 20.0) -> None:
    """Return once ``provider`` says node ``name`` was lost (fail after ``within`` s)."""
    deadline = time.monotonic() + within
    while not provider.watch.unreachable([name], lost_only=True):
        assert time.monotonic() < deadline, f"{name} was not seen lost within {within:g} s"
        time.sleep(0.05)


def left_behind(case: ProviderCase, cluster_id: str) -> list[str]:
    """Everything of the cluster still there, once its processes had ``GONE`` s to end."""
    deadline = time.monotonic() + GONE
    while (procs := running(cluster_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    here = cluster_dir(cluster_id)
    files = [str(p) for p in here.rglob("*")] if here.exists() else []
    return procs + files + case.leftovers(cluster_id)


def nothing_left(case: ProviderCase, cluster_id: str) -> None:
    """Fail naming what :func:`left_behind` found (pytest rewrites no assertion in this
    module, which is no test module: a bare ``assert`` would say nothing)."""
    left = left_behind(case, cluster_id)
    assert left == [], f"left behind: {left}"


class ProviderContract:
    """What every provider does; subclasses give the ``case`` fixture."""

    @pytest.fixture
    def case(self) -> ProviderCase:
        raise NotImplementedError("a provider's test module gives its case")

    @pytest.fixture
    def ctx(self, case: ProviderCase, tmp_path: Path) -> StartContext:
        # Random, not the pid: a pytest-xdist worker's pid is the same in each worker's PID
        # namespace, and the cluster's directory (~/.clusterbook/clusters/ID) is shared.
        cluster_id = f"contract-{case.kind}-{secrets.token_hex(3)}-{next(_ids)}"
        launcher = find_launcher(sys.executable)
        return StartContext(cluster_id, sys.executable, launcher, {}, run_dir=tmp_path)

    @pytest.fixture
    def started(self, case: ProviderCase, ctx: StartContext) -> Iterator[Provider]:
        """A started provider whose nodes are up (where they come); stopped afterwards, and
        then nothing of its cluster may be left."""
        provider = case.make()
        try:
            provider.start(ctx)
            case.bring_up(provider, ctx)
            if case.comes_up:
                provider.watch.wait_ready(READY)
            yield provider
        finally:
            case.mend()
            provider.stop()
        nothing_left(case, ctx.cluster_id)

    # -- lifecycle ------------------------------------------------------------------------

    def test_stop_before_start_does_nothing_again_and_again(self, case: ProviderCase) -> None:
        provider = case.make()
        provider.stop()
        provider.stop()
        assert [s for s in provider.watch.node_statuses() if s.state in UP] == []

    def test_stop_twice_after_a_start_leaves_nothing(
        self, case: ProviderCase, ctx: StartContext
    ) -> None:
        provider = case.make()
        try:
            provider.start(ctx)
            case.bring_up(provider, ctx)
        finally:
            provider.stop()
        provider.stop()  # again: nothing to do, nothing raised
        nothing_left(case, ctx.cluster_id)

    def test_a_failed_start_is_a_cluster_error_and_leaves_nothing(
        self, case: ProviderCase, ctx: StartContext
    ) -> None:
        provider = case.failing()
        with pytest.raises(cb.ClusterError):
            provider.start(ctx)
        provider.stop()
        provider.stop()
        nothing_left(case, ctx.cluster_id)
        assert [s for s in provider.watch.node_statuses() if s.state in UP] == []

    # -- nodes and statuses -----------------------------------------------------------------

    def test_before_the_start_no_node_is_up_and_the_planned_ones_show(
        self, case: ProviderCase
    ) -> None:
        provider = case.make()
        rows = provider.watch.node_statuses()
        assert [s for s in rows if s.state in UP] == []
        planned = provider.planned
        if planned is not None:
            assert {n.name for n in planned} <= {s.name for s in rows}

    def test_the_nodes_planned_and_their_statuses_agree(
        self, case: ProviderCase, ctx: StartContext
    ) -> None:
        provider = case.make()
        planned = provider.planned
        try:
            provider.start(ctx)
            case.bring_up(provider, ctx)
            if case.comes_up:
                provider.watch.wait_ready(READY)
            nodes = provider.nodes
            rows = {s.name: s for s in provider.watch.node_statuses()}
            assert len(rows) == len(provider.watch.node_statuses())  # a row per node
            assert bool(nodes) == case.comes_up
            assert len({n.name for n in nodes}) == len(nodes)
            for node in nodes:
                assert rows[node.name].state in UP
                assert rows[node.name].slots == node.slots
            if planned is not None:
                assert [n.name for n in nodes] == [n.name for n in planned]
        finally:
            provider.stop()
        assert [s for s in provider.watch.node_statuses() if s.state in UP] == []
        nothing_left(case, ctx.cluster_id)

    # -- the watch --------------------------------------------------------------------------

    def test_wait_ready_before_the_start_times_out_saying_what_it_waits_for(
        self, case: ProviderCase
    ) -> None:
        provider = case.make()
        with pytest.raises(cb.ReadyTimeoutError) as info:
            provider.watch.wait_ready(0.2)
        assert info.value.timeout == 0.2
        assert info.value.reason
        assert info.value.reason in str(info.value)
        for node in provider.planned or ():
            assert node.name in str(info.value)

    def test_wait_ready_once_a_node_went_missing_says_who(
        self, case: ProviderCase, started: Provider
    ) -> None:
        words = case.miss(started)
        if words is None:  # a fixed set: nothing goes missing, nothing to wait for
            started.watch.wait_ready(1.0)
            return
        # Not there in time, or (once its agent gave up) not coming back: either way, named.
        with pytest.raises((cb.ReadyTimeoutError, cb.ClusterStateError)) as info:
            started.watch.wait_ready(0.5)
        assert words in str(info.value)

    def test_names_it_does_not_know_are_not_unreachable(
        self, case: ProviderCase, started: Provider
    ) -> None:
        assert case.make().watch.unreachable(["no-such-node"]) == {}
        assert started.watch.unreachable(["no-such-node"]) == {}
        assert started.watch.unreachable(["no-such-node"], lost_only=True) == {}
        assert started.watch.unreachable([n.name for n in started.nodes]) == {}
        assert started.watch.problem() is None

    # -- the reach --------------------------------------------------------------------------

    def test_remote_is_none_exactly_when_every_node_is_this_machine(
        self, case: ProviderCase, started: Provider
    ) -> None:
        remote = started.reach.remote()
        assert (remote is None) == all(n.here for n in started.nodes)
        assert remote is None or isinstance(remote, RemoteLaunch)

    def test_run_on_nodes_runs_once_on_every_node(
        self, case: ProviderCase, started: Provider
    ) -> None:
        runs = started.reach.run_on_nodes(["sh", "-c", "echo ran on $(hostname)"], 30.0)
        assert [r.node for r in runs] == [n.name for n in started.nodes]
        for run in runs:
            assert (run.returncode, run.stderr) == (0, "")
            assert run.stdout.startswith("ran on ")

    def test_put_brings_files_to_every_node_and_gather_brings_theirs_here(
        self, case: ProviderCase, started: Provider
    ) -> None:
        scratch = case.scratch
        sent = scratch / "sent.txt"
        sent.write_text("from the head\n")
        assert started.reach.put(outgoing([sent])) == {}
        runs = started.reach.run_on_nodes(["cat", str(sent)], 30.0)
        assert [r.stdout for r in runs] == ["from the head\n"] * len(started.nodes)
        made = started.reach.run_on_nodes(["mktemp", f"{scratch}/made-XXXXXX"], 30.0)
        assert [r.returncode for r in made] == [0] * len(started.nodes)
        _, failed = started.reach.gather(scratch, ["sent.txt"])
        assert failed == {}
        assert len(list(scratch.glob("made-*"))) == len(started.nodes)

    def test_run_on_nodes_runs_on_the_nodes_named_only(
        self, case: ProviderCase, started: Provider
    ) -> None:
        if not started.nodes:  # a batch job that never runs (FakeSlurm's): none to name
            assert started.reach.run_on_nodes(["true"], 30.0, nodes=[]) == []
            return
        last = started.nodes[-1].name
        runs = started.reach.run_on_nodes(["echo", "here"], 30.0, nodes=[last])
        assert [(r.node, r.returncode, r.stdout) for r in runs] == [(last, 0, "here\n")]

    def test_put_to_another_path_brings_the_file_there_on_the_nodes_named(
        self, case: ProviderCase, started: Provider
    ) -> None:
        source = case.scratch / "source.txt"
        source.write_text("to another path\n")
        there = case.scratch / "placed" / "deeper" / "got.txt"
        sent = outgoing([source], place=lambda _: str(there))
        assert sent.relocated
        assert started.reach.put(sent) == {}
        runs = started.reach.run_on_nodes(["cat", str(there)], 30.0)
        assert [r.stdout for r in runs] == ["to another path\n"] * len(started.nodes)
        if not started.nodes:
            return
        first = started.nodes[0].name
        other = case.scratch / "placed" / "one.txt"
        assert (
            started.reach.put(outgoing([source], place=lambda _: str(other)), nodes=[first]) == {}
        )
        runs = started.reach.run_on_nodes(["cat", str(other)], 30.0, nodes=[first])
        assert [(r.node, r.stdout) for r in runs] == [(first, "to another path\n")]

    def test_the_resource_history_names_its_nodes_and_is_json(
        self, case: ProviderCase, started: Provider
    ) -> None:
        answer = started.watch.resource_history()
        assert answer["interval"] > 0
        assert set(answer["nodes"]) <= {s.name for s in started.watch.node_statuses()}
        for series in answer["nodes"].values():
            assert len({len(series[k]) for k in ("t", "cpu", "memory_used_gib", "gpu")}) == 1
        assert json.loads(json.dumps(answer)) == answer

    def test_free_port_is_a_port_or_none(self, case: ProviderCase, started: Provider) -> None:
        for node in started.nodes:
            port = started.reach.free_port(node)
            assert port is None or 0 < port < 65536

    def test_stop_and_hold_of_a_job_it_never_ran_do_nothing(
        self, case: ProviderCase, started: Provider
    ) -> None:
        started.reach.stop_job("contract-no-such-job")
        assert started.reach.hold_job("contract-no-such-job", {}) == ()

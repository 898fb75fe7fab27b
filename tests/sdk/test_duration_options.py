"""Every duration option of the public API takes seconds, a timedelta and text alike, and
refuses a bad one naming it.

:data:`CASES` has a case for each option; :func:`test_every_public_duration_option_has_a_case`
finds the options in the public signatures (``Cluster``, its handles and jobs, the module's
functions, and the TypedDicts their ``**options`` unpack), so that a new duration option
without a case here fails. Where the seconds an option became can be seen, the case returns
them; where they cannot without starting what the option bounds, the case returns None once
the call has passed the option's check (and the bad value shows the check is there).
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import clusterbook as cb
from clusterbook.cluster.options import ClusterOptions
from clusterbook.cluster.remote.attached import AttachedCluster
from clusterbook.durations import duration
from clusterbook.engines import start_engines
from clusterbook.export.mpijob import render_mpijob
from clusterbook.launch.prepare import JobRequest
from clusterbook.launch.saved import SavedJob
from clusterbook.providers.elastic.provider import ElasticProvider
from clusterbook.providers.slurm.provider import SlurmProvider
from clusterbook.providers.ssh.provider import SSHProvider
from clusterbook.scaling import Adapt
from clusterbook.testing import FakeProvider, FakeSlurm
from tests.sdk.cluster.test_facade import STAND_IN

#: What names a duration among the parameters and the options of a TypedDict.
DURATION = re.compile(
    r"timeout|deadline|life_span|backoff|retention|older_than|^lease$|^wait$|interval$|"
    r"last_call|^time$|^ttl"
)
#: Waits the test sits through are short; the others long enough to need every unit.
SHORT, LONG = 0.3, 5400.0
#: What the error says of an option where 0 means something (no delay).
ZERO_OK = "must be a duration >= 0, got 'soon'"


class Env:
    """What the cases run against: clusters on the shipped FakeProvider (their mpirun a
    stand-in that sleeps ``FAKE_MPIRUN_SLEEP`` seconds), one ready and one whose nodes never
    are, and handles attached to them."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp_path = tmp_path
        self.monkeypatch = monkeypatch
        self._made: dict[bool, cb.Cluster] = {}
        self._handles: dict[bool, AttachedCluster] = {}

    def cluster(self, *, ready: bool = True) -> cb.Cluster:
        if ready not in self._made:
            launcher = self.tmp_path / "bin" / "mpirun"
            if not launcher.exists():
                launcher.parent.mkdir()
                launcher.write_text(STAND_IN)
                launcher.chmod(0o755)
            run_dir = self.tmp_path / f"run-{ready}"
            options = ClusterOptions.make("fake", launcher=str(launcher), run_dir=run_dir)
            self._made[ready] = cb.Cluster(FakeProvider(nodes=1, ready=ready), options).start()
        return self._made[ready]

    def handle(self, *, ready: bool = True) -> AttachedCluster:
        if ready not in self._handles:
            self._handles[ready] = cb.Cluster.attach(self.cluster(ready=ready).run_dir)
        return self._handles[ready]

    def slow_job(self) -> cb.Job | SavedJob:
        self.monkeypatch.setenv("FAKE_MPIRUN_SLEEP", "30")
        return self.cluster().mpirun(["true"], np=1)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        for cluster in self._made.values():
            cluster.stop()


@dataclass(frozen=True)
class Case:
    """How an option is given ``value`` and what it became: its seconds, or None (passed
    its check). ``bare_text`` is False where text without a unit means something else;
    ``refused`` is what the error for ``"soon"`` says after the option's name."""

    seconds: float
    probe: Callable[[object, Env], float | None]
    bare_text: bool = True
    refused: str = "must be a duration > 0, got 'soon'"


def _over_its(frame: Any) -> float:
    """The seconds a node command was stopped after, as its stderr says."""
    found = re.search(r"ran over its ([0-9.]+) s", frame.stderr[0])
    assert found, frame.stderr[0]
    return float(found.group(1))


def _ready_timeout(wait: Callable[[], None]) -> float:
    """The seconds a wait for nodes gave up after, as its error says (an attached handle's
    error is rebuilt from the head's answer: its message)."""
    with pytest.raises(cb.ReadyTimeoutError) as info:
        wait()
    found = re.search(r"after ([0-9.]+) s", str(info.value))
    assert found, str(info.value)
    return float(found.group(1))


def _wait_timeout(job: cb.Job | SavedJob, value: object, how: str = "wait") -> float:
    try:
        with pytest.raises(cb.JobTimeoutError) as info:
            getattr(job, how)(value)
    finally:
        job.cancel()
    return info.value.timeout


def _after(manifest: dict[str, Any], flag: str) -> float:
    """The value of ``flag`` in the ``clusterbook run`` the launcher pod runs."""
    launcher = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    script = launcher["containers"][0]["command"][-1]
    words = shlex.split(script.strip().splitlines()[-1])
    return float(words[words.index(flag) + 1].rstrip("s"))


def _mpijob(**options: Any) -> dict[str, Any]:
    return render_mpijob(["python", "t.py"], np=1, image="img", name="t", **options)


def _accepted(call: Callable[[], object], *expected: type[BaseException]) -> None:
    """``call`` got past its duration check: it returned, or failed for another reason (a
    duration refused is a plain ConfigError, none of ``expected``)."""
    with contextlib.suppress(*expected):
        call()


def _engines(value: object, env: Env) -> None:
    """Engines asked for with ``timeout=value`` and a bad ``progress``, which is checked
    next: its error says the timeout passed (nothing starts)."""
    cluster = cb.Cluster.local(1, 1, run_dir=env.tmp_path / "r")
    try:
        start_engines(cluster, 1, timeout=value, progress="yes")
    except cb.ConfigError as exc:
        if "progress must be" not in str(exc):
            raise


def _options(**given: object) -> ClusterOptions:
    return cb.Cluster.local(workers=1, **given)._options


def _slurm(**given: Any) -> SlurmProvider:
    return SlurmProvider(nodes=1, runner=FakeSlurm(), **given)


CASES: dict[str, Case] = {
    # What every cluster takes (Cluster.local, ssh, elastic, slurm, from_spec...).
    "ClusterOptionsArgs.life_span": Case(LONG, lambda v, e: _options(life_span=v).life_span),
    "ClusterOptionsArgs.idle_timeout": Case(
        LONG, lambda v, e: _options(idle_timeout=v).idle_timeout
    ),
    "ClusterOptionsArgs.retention": Case(LONG, lambda v, e: _options(retention=v).retention),
    "SSHArgs.connect_timeout": Case(
        LONG,
        lambda v, e: SSHProvider(["h1"], connect_timeout=v).connect_timeout,
    ),
    "ElasticArgs.last_call": Case(
        LONG,
        lambda v, e: ElasticProvider(1, 2, last_call=v).settings.timeout.last_call,
    ),
    "ElasticArgs.join_timeout": Case(
        LONG,
        lambda v, e: ElasticProvider(1, 2, join_timeout=v).settings.timeout.join,
    ),
    "ElasticArgs.keep_alive_interval": Case(
        LONG,
        lambda v, e: ElasticProvider(1, 2, keep_alive_interval=v).settings.keep_alive_interval,
    ),
    "SlurmArgs.last_call": Case(LONG, lambda v, e: _slurm(last_call=v).settings.timeout.last_call),
    "SlurmArgs.join_timeout": Case(LONG, lambda v, e: _slurm(join_timeout=v).settings.timeout.join),
    "SlurmArgs.keep_alive_interval": Case(
        LONG, lambda v, e: _slurm(keep_alive_interval=v).settings.keep_alive_interval
    ),
    "SlurmArgs.poll_interval": Case(LONG, lambda v, e: _slurm(poll_interval=v).follow.poll),
    "Cluster.adapt.interval": Case(LONG, lambda v, e: Adapt.make(1, 1, v, 60, (1, 1)).interval),
    # An attached handle sends it in seconds (duration()), which the head's Adapt.make takes.
    "AttachedCluster.adapt.interval": Case(
        LONG, lambda v, e: Adapt.make(1, 1, duration(v, "interval"), 60, (1, 1)).interval
    ),
    # Slurm's own --time: text without a unit is Slurm's minutes, as sbatch reads it.
    "Cluster.slurm.time": Case(
        LONG,
        lambda v, e: _slurm(time=v).life_span,
        bare_text=False,
        refused="='soon' is not a time limit; give .* seconds, a datetime.timedelta, or text",
    ),
    # A job's options (Cluster.mpirun, cb.run, %%mpirun, clusterbook run).
    "JobArgs.timeout": Case(
        LONG, lambda v, e: JobRequest.make(["true"], slots=1, timeout=v).timeout
    ),
    "JobArgs.deadline": Case(
        LONG,
        lambda v, e: JobRequest.make(["true"], slots=1, deadline=v).recovery.deadline,
    ),
    "JobArgs.backoff": Case(
        LONG,
        lambda v, e: JobRequest.make(["true"], slots=1, backoff=v).recovery.backoff.first,
        refused=ZERO_OK,
    ),
    "MPIJobArgs.timeout": Case(LONG, lambda v, e: _after(_mpijob(timeout=v), "--timeout")),
    "MPIJobArgs.deadline": Case(LONG, lambda v, e: _after(_mpijob(deadline=v), "--deadline")),
    "MPIJobArgs.backoff": Case(
        LONG, lambda v, e: _after(_mpijob(backoff=v, retries=1), "--backoff"), refused=ZERO_OK
    ),
    "MPIJobArgs.retention": Case(
        LONG, lambda v, e: _mpijob(retention=v)["spec"]["runPolicy"]["ttlSecondsAfterFinished"]
    ),
    "EngineArgs.timeout": Case(LONG, lambda v, e: _engines(v, e)),
    # Waits.
    "Cluster.wait_ready.timeout": Case(
        SHORT,
        lambda v, e: _ready_timeout(lambda: e.cluster(ready=False).wait_ready(v)),
    ),
    "AttachedCluster.wait_ready.timeout": Case(
        SHORT,
        lambda v, e: _ready_timeout(lambda: e.handle(ready=False).wait_ready(v)),
    ),
    "Cluster.run_on_nodes.timeout": Case(
        SHORT,
        lambda v, e: _over_its(e.cluster().run_on_nodes(["sleep", "30"], timeout=v)),
    ),
    "AttachedCluster.run_on_nodes.timeout": Case(
        SHORT,
        lambda v, e: _over_its(e.handle().run_on_nodes(["sleep", "30"], timeout=v)),
    ),
    "AttachedCluster.node_runs.timeout": Case(
        SHORT,
        lambda v, e: _over_its(
            type("F", (), {"stderr": [e.handle().node_runs(["sleep", "30"], timeout=v)[0].stderr]})
        ),
    ),
    "Job.wait.timeout": Case(SHORT, lambda v, e: _wait_timeout(e.slow_job(), v)),
    "SavedJob.wait.timeout": Case(
        SHORT, lambda v, e: _wait_timeout(e.handle().job(e.slow_job().id), v)
    ),
    # The future's waits: result() and exception() wait as wait() does.
    "Job.result.timeout": Case(SHORT, lambda v, e: _wait_timeout(e.slow_job(), v, "result")),
    "Job.exception.timeout": Case(SHORT, lambda v, e: _wait_timeout(e.slow_job(), v, "exception")),
    "SavedJob.result.timeout": Case(
        SHORT, lambda v, e: _wait_timeout(e.handle().job(e.slow_job().id), v, "result")
    ),
    "SavedJob.exception.timeout": Case(
        SHORT, lambda v, e: _wait_timeout(e.handle().job(e.slow_job().id), v, "exception")
    ),
    "AttachedCluster.stop.timeout": Case(
        LONG,
        lambda v, e: _accepted(lambda: e.handle().stop(v)),
    ),
    # Reaching another machine's cluster: the address refuses, after the option's check.
    "Cluster.attach.connect_timeout": Case(
        LONG,
        lambda v, e: _accepted(
            lambda: cb.Cluster.attach("ssh://127.0.0.1:1/none", connect_timeout=v),
            cb.SSHConnectError,
        ),
    ),
    "AttachedCluster.attach.connect_timeout": Case(
        LONG,
        lambda v, e: _accepted(
            lambda: AttachedCluster.attach("ssh://127.0.0.1:1/none", connect_timeout=v),
            cb.SSHConnectError,
        ),
    ),
    "prune.older_than": Case(
        LONG,
        lambda v, e: _accepted(lambda: cb.prune(older_than=v, dry_run=True)),
    ),
    # A worker host of a training job: none around here, found after the options' checks.
    "serve_worker.lease": Case(
        LONG,
        lambda v, e: _accepted(
            lambda: cb.serve_worker(lease=v, environ={}, root=e.tmp_path),
            cb.EnvironmentNotFoundError,
        ),
    ),
    "serve_worker.wait": Case(
        LONG,
        lambda v, e: _accepted(
            lambda: cb.serve_worker(wait=v, environ={}, root=e.tmp_path),
            cb.EnvironmentNotFoundError,
        ),
    ),
}


def _text(seconds: float) -> str:
    """``seconds`` as text with units: ``1h30m``, ``300ms``."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    hours, rest = divmod(seconds, 3600)
    return f"{hours:g}h{rest / 60:g}m"


def _forms(case: Case) -> dict[str, object]:
    s = case.seconds
    forms: dict[str, object] = {
        "float": s,
        "timedelta": datetime.timedelta(seconds=s),
        "text": _text(s),
        "text in seconds": f"{s:g}s",
    }
    if s == int(s):
        forms["int"] = int(s)
    if case.bare_text:
        forms["bare text"] = f"{s:g}"
    return forms


def _public_options() -> set[str]:
    """Every duration option of the public API, as ``Owner.method.option`` (parameters)
    or ``TypedDict.option`` (what ``**options`` unpack, each where it is declared)."""
    found: set[str] = set()
    owners: list[tuple[str, Any]] = [
        (cls.__name__, cls) for cls in (cb.Cluster, cb.Job, SavedJob, AttachedCluster)
    ]
    functions = [(name, getattr(cb, name)) for name in cb.__all__]
    members = [
        (f"{owner}.{name}", member)
        for owner, cls in owners
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    ]
    for where, member in members + functions:
        if inspect.isclass(member) or not callable(member):
            continue
        for param in inspect.signature(member).parameters.values():
            unpacked = re.fullmatch(r"Unpack\[(\w+)\]", str(param.annotation))
            if unpacked:
                found |= _typeddict_options(unpacked.group(1))
            elif DURATION.search(param.name):
                found.add(f"{where}.{param.name}")
    return found


def _typeddict_options(name: str) -> set[str]:
    """The duration options of the TypedDict ``name``, each named after the TypedDict that
    declares it (what every cluster takes is ``ClusterOptionsArgs``'s)."""
    from clusterbook.cluster import options
    from clusterbook.engines import EngineArgs
    from clusterbook.export.mpijob import MPIJobArgs
    from clusterbook.launch.prepare import JobArgs
    from clusterbook.resources import Only

    known = {"EngineArgs": EngineArgs, "MPIJobArgs": MPIJobArgs, "JobArgs": JobArgs, "Only": Only}
    typed = known.get(name) or getattr(options, name)
    every = set(options.ClusterOptionsArgs.__annotations__)
    found = set()
    inherits = every <= set(typed.__annotations__)  # a cluster kind's arguments
    for key in typed.__annotations__:
        if DURATION.search(key):
            owner = "ClusterOptionsArgs" if inherits and key in every else name
            found.add(f"{owner}.{key}")
    return found


def test_every_public_duration_option_has_a_case() -> None:
    assert _public_options() == set(CASES)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    made = Env(tmp_path, monkeypatch)
    yield made
    made.close()


@pytest.mark.parametrize(
    ("option", "form"),
    [(option, form) for option, case in CASES.items() for form in _forms(case)],
)
def test_every_duration_option_takes_seconds_timedeltas_and_text(
    option: str, form: str, env: Env
) -> None:
    case = CASES[option]
    seconds = case.probe(_forms(case)[form], env)
    if seconds is not None:
        assert seconds == pytest.approx(case.seconds)


@pytest.mark.parametrize("option", sorted(CASES))
def test_every_duration_option_refuses_a_bad_one_naming_it(option: str, env: Env) -> None:
    name, case = option.rsplit(".", 1)[1], CASES[option]
    with pytest.raises(cb.ConfigError, match=rf"^{name} ?{case.refused}"):
        case.probe("soon", env)


def test_a_job_of_an_attached_handle_takes_timedeltas_and_text(env: Env) -> None:
    job = env.handle().mpirun(
        ["true"], np=1, timeout=datetime.timedelta(minutes=90), deadline="2h", backoff="1s"
    )
    assert job.wait(30).ok

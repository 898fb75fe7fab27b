"""MPIJob export: every rendered manifest is checked against the mpi-operator's CRD schema (and
the operator's own admission rules), its YAML reads back as the same data, and the pods'
commands run what they say, shell-safely."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

import clusterbook as cb
from clusterbook.export.mpijob import (
    DEADLINE_GRACE,
    HOSTFILE,
    SSH_AUTH_MOUNT_PATH,
    SSH_PORT,
    render_mpijob,
    to_yaml,
)
from clusterbook.wording import speaking
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[3]
#: The CRD of kubeflow/mpi-operator v0.8.2 (tests/data/k8s/README.md says where from).
CRD = Path(
    os.environ.get("CLUSTERBOOK_MPIJOB_CRD", ROOT / "tests/data/k8s/kubeflow.org_mpijobs.yaml")
)
EXAMPLE = CRD.with_name("example-pi.yaml")
ARGV = ["python", "train.py", "--lr", "0.1"]
RUN_POLICY = {"retries": 2, "deadline": "2h", "retention": "7d", "clean": "all"}


@cache
def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v2beta1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _closed(schema: Any) -> Any:
    """``schema`` with unknown fields refused, as ``kubectl apply --validate=strict`` (the API
    server prunes them silently otherwise: a misspelt field would be lost without a word)."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k == "properties" else _closed(v)) for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: _closed(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    """The CRD's OpenAPI v3 schema as JSON Schema (draft 7 ignores the ``x-kubernetes-*``
    keywords; ``int-or-string`` fields are ``anyOf`` integer or string there)."""
    require(CRD.is_file(), f"the MPIJob CRD is not at {CRD} (set CLUSTERBOOK_MPIJOB_CRD)")
    schema = _closed(copy.deepcopy(_schema()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def operator_errors(job: Mapping[str, Any]) -> list[str]:
    """What the operator's admission (pkg/apis/kubeflow/validation, v0.8.2) refuses, on top
    of the schema: run after its defaulting (restartPolicy, replicas, cleanPodPolicy...)."""
    spec, errors = job["spec"], []
    replicas = spec["mpiReplicaSpecs"]
    workers = replicas.get("Worker", {}).get("replicas") or 1
    pod = f"{job['metadata']['name']}-worker-{workers - 1}"
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", pod) or len(pod) > 63:
        errors.append(f"metadata.name: pod name {pod!r} is not a DNS-1035 label")
    if spec.get("slotsPerWorker", 1) < 0:
        errors.append("spec.slotsPerWorker < 0")
    if spec.get("mpiImplementation", "OpenMPI") not in {"OpenMPI", "Intel", "MPICH"}:
        errors.append("spec.mpiImplementation")
    if spec.get("runPolicy", {}).get("cleanPodPolicy", "None") not in {"None", "Running", "All"}:
        errors.append("spec.runPolicy.cleanPodPolicy")
    for field in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if spec.get("runPolicy", {}).get(field, 0) < 0:
            errors.append(f"spec.runPolicy.{field} < 0")
    if not spec.get("sshAuthMountPath", "/root/.ssh"):
        errors.append("spec.sshAuthMountPath is empty")
    for kind, default in (("Launcher", "OnFailure"), ("Worker", "Never")):
        if kind not in replicas:
            if kind == "Launcher":
                errors.append("Launcher missing")
            continue
        rs = replicas[kind]
        if rs.get("restartPolicy", default) not in {"Never", "OnFailure"}:
            errors.append(f"{kind}.restartPolicy")
        if not rs["template"]["spec"].get("containers"):
            errors.append(f"{kind} has no container")
    if replicas["Launcher"].get("replicas", 1) != 1:
        errors.append("Launcher.replicas must be 1")
    if replicas.get("Worker", {}).get("replicas", 1) < 1:
        errors.append("Worker.replicas must be >= 1")
    return errors


def check(validator: jsonschema.protocols.Validator, job: Mapping[str, Any]) -> None:
    problems = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(job)
    ]
    assert problems + operator_errors(job) == []


def launcher_script(job: Mapping[str, Any]) -> str:
    (container,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    script: str = container["command"][2]
    return script


def worker_script(job: Mapping[str, Any]) -> str:
    (container,) = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    script: str = container["command"][2]
    return script


def run_words(job: Mapping[str, Any]) -> list[str]:
    """The words of the launcher's ``exec clusterbook run ...`` line, as sh splits them."""
    (line,) = [x for x in launcher_script(job).splitlines() if x.startswith("exec ")]
    return shlex.split(line)[1:]


# -- the schema -------------------------------------------------------------------------------


def test_the_operators_own_example_passes_and_broken_manifests_do_not(
    validator: jsonschema.protocols.Validator,
) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    check(validator, example)  # the check passes what the operator documents
    job = render_mpijob(ARGV, np=4, image="train:1", name="train", **RUN_POLICY)
    breakages = {
        "a count as text": ("spec", "slotsPerWorker", "2"),
        "an MPI the CRD does not list": ("spec", "mpiImplementation", "LAM"),
        "a misspelt field": ("spec", "slotPerWorker", 2),
        "a field of the wrong type": ("spec", "runPolicy", "Never"),
        "replicas as text": ("spec", "mpiReplicaSpecs", {"Launcher": {"replicas": "1"}}),
    }
    for why, (top, key, value) in breakages.items():
        broken = copy.deepcopy(job)
        broken[top][key] = value
        assert list(validator.iter_errors(broken)), f"the schema passed {why}"
    nameless = copy.deepcopy(job)
    nameless["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].pop("name")
    assert list(validator.iter_errors(nameless)), "a container without its required name passed"
    long_named = copy.deepcopy(job)
    long_named["metadata"]["name"] = "x" * 60
    assert operator_errors(long_named), "the operator's name rule passed a 60-letter name"


@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
@pytest.mark.parametrize("policy", [{}, RUN_POLICY], ids=["defaults", "run-policy"])
def test_every_manifest_passes_the_crd_schema_and_reads_back_from_yaml(
    validator: jsonschema.protocols.Validator, mpi: str, policy: dict[str, Any]
) -> None:
    job = render_mpijob(
        ARGV,
        np=8,
        image="registry.example.org/team/train:1.0",
        name="train",
        namespace="ml",
        slots_per_worker=2,
        mpi=mpi,
        env={"SEED": "1"},
        resources={"limits": {"cpu": 2, "memory": "4Gi"}},
        **policy,
    )
    check(validator, job)
    text = to_yaml(job)
    assert yaml.safe_load(text) == job
    assert json.loads(json.dumps(job)) == job  # plain data: what kubectl sends as JSON too
    spec = job["spec"]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert job["metadata"] == {"name": "train", "namespace": "ml"}
    assert spec["slotsPerWorker"] == 2
    assert spec["mpiImplementation"] == {"openmpi": "OpenMPI", "mpich": "MPICH"}[mpi]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["sshAuthMountPath"] == SSH_AUTH_MOUNT_PATH
    replicas = spec["mpiReplicaSpecs"]
    assert (replicas["Launcher"]["replicas"], replicas["Worker"]["replicas"]) == (1, 4)
    assert {r["restartPolicy"] for r in replicas.values()} == {"Never"}
    words = run_words(job)
    assert words[:6] == ["clusterbook", "run", "-n", "8", "--hostfile", HOSTFILE]
    assert words[words.index("--") + 1 :] == ARGV
    assert words[words.index("--mpi") + 1] == mpi
    assert words[words.index("--port") + 1] == str(SSH_PORT)
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"] == {"limits": {"cpu": 2, "memory": "4Gi"}}
    assert worker["readinessProbe"]["tcpSocket"]["port"] == SSH_PORT
    assert f"exec /usr/sbin/sshd -De -p {SSH_PORT} " in worker_script(job)
    if policy:
        assert spec["runPolicy"] == {
            "backoffLimit": 0,
            "activeDeadlineSeconds": 7200 + DEADLINE_GRACE,
            "ttlSecondsAfterFinished": 7 * 86400,
            "cleanPodPolicy": "All",
        }
        assert words[words.index("--retries") + 1] == "2"
        assert words[words.index("--deadline") + 1] == "7200"
    else:
        # Kubernetes never reruns the launcher; sshd workers go when the job ends.
        assert spec["runPolicy"] == {"backoffLimit": 0, "cleanPodPolicy": "Running"}
        assert "--retries" not in words
        assert "--deadline" not in words


# Amounts Kubernetes takes (k8s.io/apimachinery's resource.ParseQuantity): whole numbers and
# fractions, and text with a sign, a fraction, a decimal or binary SI suffix, or an exponent.
QUANTITIES = [
    *(0, 4, 0.5, 0.25, 1e-07, 1e20, 2.0, "0.5", "500m", ".5", "5.", "+1", "-0", "1.5Gi"),
    *("8Ei", "128974848", "129e6", "129M", "123Mi", "1E", "1e3", "1E-3", "1e+3", "12n", "3u"),
]
# ...and what it does not: stray spaces, suffixes of other units, a fraction in the exponent
# (which the CRD's pattern lets through, and the parser refuses), what is not a number.
NOT_QUANTITIES = [
    *("", " 1", "1 ", "1.5.5", "1ki", "8GB", "1e", "1e1.5", ".", "-", "+", "1m5", "0x10"),
    *("1_000", "1,000", "inf", "Gi", "1e9999999999", float("nan"), float("inf"), True, None),
]


def test_resources_take_what_a_kubernetes_quantity_takes(
    validator: jsonschema.protocols.Validator,
) -> None:
    limits = {f"example.com/r{i}": amount for i, amount in enumerate(QUANTITIES)}
    job = render_mpijob(
        ARGV,
        np=2,
        image="img",
        name="q",
        resources={"limits": limits, "requests": {"cpu": 0.5, "memory": "1.5Gi"}},
    )
    check(validator, job)  # the CRD takes a quantity as an integer or a string, not a float
    assert yaml.safe_load(to_yaml(job)) == job  # the YAML reads back as the same amounts
    (worker,) = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    written = worker["resources"]["limits"]
    for name, given in limits.items():
        if isinstance(given, float):  # as text that is the same number
            assert isinstance(written[name], str)
            assert float(written[name]) == given
        else:
            assert written[name] == given
    assert worker["resources"]["requests"] == {"cpu": "0.5", "memory": "1.5Gi"}


@pytest.mark.parametrize("amount", NOT_QUANTITIES, ids=repr)
def test_what_is_not_a_kubernetes_quantity_is_refused(amount: Any) -> None:
    said = f"Resources limits cpu {re.escape(repr(amount))} is not a Kubernetes quantity"
    with pytest.raises(cb.ConfigError, match=said + r".*give one like \{'cpu': 0\.5\}"):
        render_mpijob(ARGV, np=2, image="img", name="q", resources={"limits": {"cpu": amount}})


def test_job_options_reach_clusterbook_run(validator: jsonschema.protocols.Validator) -> None:
    job = render_mpijob(
        ["./a.out"],
        np=3,
        image="hpc/app@sha256:" + "a" * 64,
        name="app",
        workers=2,
        slots_per_worker=2,
        retries=1,
        backoff="30s",
        retry_on=["failure", "timeout"],
        restarts=1,
        timeout=600,
        deadline=3600,
        cwd="/work",
        clean=None,
        ssh_auth_mount_path="/home/mpiuser/keys/",
    )
    check(validator, job)
    words = run_words(job)
    expected = [
        *("--retries", "1", "--backoff", "30", "--retry-on", "failure,timeout"),
        *("--deadline", "3600", "--restarts", "1", "--timeout", "600", "--wdir", "/work"),
    ]
    assert " ".join(expected) in " ".join(words)
    assert words[words.index("--identity") + 1] == "/home/mpiuser/keys/id_rsa"
    assert job["spec"]["sshAuthMountPath"] == "/home/mpiuser/keys"
    assert "cleanPodPolicy" not in job["spec"]["runPolicy"]  # the operator's default
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2  # 3 ranks: 2 + 1


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"image": "Train:latest"}, "Image 'Train:latest' is not a container image reference"),
        ({"image": "my image"}, "image='registry.example.org/team/train:1.0'"),
        ({"image": ""}, "Image '' is not"),
        ({"np": 0}, "The number of ranks 0 is not a whole number >= 1; give one like np=4"),
        ({"np": -4}, "The number of ranks -4"),
        ({"np": 2.0}, "The number of ranks 2.0"),
        ({"slots_per_worker": -1}, "slots per worker -1 is not a whole number >= 1"),
        ({"workers": 0}, "The number of workers 0"),
        ({"np": 5, "slots_per_worker": 2}, "np=5 ranks do not fill workers of 2 slots each; "
         "give np=4 or np=6, or workers=3 to leave 1 slot(s) empty"),
        ({"np": 9, "workers": 2, "slots_per_worker": 4}, "np=9 is more than the 8 slots of 2 "
         "worker(s) of 4 slots each; give workers=3"),
        ({"np": 2, "workers": 3}, "leave 1 of the 3 workers without a rank; give workers=2"),
        ({"mpi": "intel"}, "MPI implementation 'intel' is not one clusterbook drives; give "
         "mpi='openmpi' or mpi='mpich'"),
        ({"name": "Train_Job"}, "MPIJob name 'Train_Job' is not a Kubernetes name .* give "
         "name='train-job'"),
        ({"name": "1job"}, "name='job-1job'"),
        ({"name": "job-"}, "MPIJob name 'job-'"),
        ({"name": "a" * 55}, "its pod 'a{55}-launcher' would have more than 63 characters; give "
         "a name of at most 54"),
        ({"name": "j" * 54, "np": 20}, "its pod 'j{54}-worker-19' .* at most 53"),
        ({"namespace": "ML Team"}, "Namespace 'ML Team' is not .* namespace='ml-team'"),
        ({"retries": -1}, "Retries -1 is negative"),
        ({"deadline": "soon"}, "deadline must be a duration > 0, got 'soon'"),
        ({"retention": "-1d"}, "retention must be a duration > 0, got '-1d' .it is negative"),
        ({"clean": "sometimes"}, "Clean policy 'sometimes' is not one the operator has; give "
         "clean='running', clean='all' or clean='none'"),
        ({"backoff": 0, "retries": 1}, "give a delay above 0"),
        ({"ssh_auth_mount_path": "/root/.ssh"}, "'/root/.ssh' cannot hold the job's key"),
        ({"ssh_auth_mount_path": "keys"}, "must be an absolute path"),
        ({"cwd": "work"}, "must be an absolute directory in the image"),
        ({"env": {"1X": "a"}}, "Environment variable name '1X' is invalid"),
        ({"resources": {"limit": {"cpu": 1}}}, "mapping of 'limits' and/or 'requests'"),
        ({"resources": {"limits": {1: 2}}}, "must map resource names to amounts"),
        ({"resources": {"limits": {"memory": "8GB"}}}, "limits memory '8GB' is not a "
         "Kubernetes quantity: .* Ki, Mi, Gi, Ti, Pi, Ei; give one like"),
        ({"resources": {"requests": {"cpu": -0.5}}}, "requests cpu -0.5 is negative"),
        ({"timeout": -1}, "timeout must be a duration > 0"),
    ],
)  # fmt: skip
def test_bad_input_names_the_value_and_the_fix(given: dict[str, Any], said: str) -> None:
    args: dict[str, Any] = {"np": 4, "image": "train:1", "name": "train", **given}
    with pytest.raises(cb.ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        render_mpijob(ARGV, **args)


def test_the_command_line_spells_its_own_options() -> None:
    with speaking("cli"), pytest.raises(cb.ConfigError) as info:
        render_mpijob(ARGV, np=5, image="train:1", name="Bad", slots_per_worker=2)
    assert "--name bad" in str(info.value)
    with speaking("cli"), pytest.raises(cb.ConfigError) as info:
        render_mpijob(ARGV, np=5, image="train:1", name="ok", slots_per_worker=2)
    assert "give -n 4 or -n 6, or --workers 3" in str(info.value)


# -- the facade and the command line --------------------------------------------------------------


def test_a_cluster_gives_its_defaults(validator: jsonschema.protocols.Validator) -> None:
    from clusterbook.export.mpijob import render_for_nodes

    nodes = [cb.NodeSpec(f"node{i}", f"10.0.0.{i}", 4) for i in range(1, 4)]
    common = {"image": "img", "nodes": nodes, "cluster_name": "lab", "cluster_env": {"A": "1"}}
    job = render_for_nodes(ARGV, None, flavour="mpich", env={"B": "2"}, **common)
    check(validator, job)
    spec, words = job["spec"], run_words(job)
    assert (spec["slotsPerWorker"], spec["mpiReplicaSpecs"]["Worker"]["replicas"]) == (4, 3)
    assert (spec["mpiImplementation"], job["metadata"]["name"]) == ("MPICH", "lab")
    assert words[2:4] == ["-n", "12"]
    assert [words[i + 1] for i, w in enumerate(words) if w == "--env"] == ["A=1", "B=2"]
    fewer = render_for_nodes(ARGV, 4, flavour=None, name="two", **common)
    assert fewer["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 1
    assert fewer["spec"]["mpiImplementation"] == "OpenMPI"
    mixed = [*nodes, cb.NodeSpec("node4", "10.0.0.4", 2)]
    with pytest.raises(cb.ConfigError, match=r"different slots \(2, 4\).*slots_per_worker=2"):
        render_for_nodes(ARGV, None, flavour=None, **{**common, "nodes": mixed})
    with pytest.raises(cb.ConfigError, match=r"cannot name an MPIJob.*name='my-lab'"):
        render_for_nodes(ARGV, None, flavour=None, **{**common, "cluster_name": "My_Lab"})
    not_known = r"nodes are not known yet.*give slots_per_worker=4 and np=8 \(or workers=2\)"
    for given in ({}, {"np": 4}, {"slots_per_worker": 2}):
        with pytest.raises(cb.ConfigError, match=not_known):
            render_for_nodes(ARGV, flavour=None, **{"np": None, **common, "nodes": [], **given})
    job = render_for_nodes(ARGV, 4, flavour=None, slots_per_worker=2, **{**common, "nodes": []})
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2


def _shape(job: Mapping[str, Any]) -> tuple[int, int, list[str]]:
    """Slots per worker, workers, and the launcher's ``-n``."""
    spec, words = job["spec"], run_words(job)
    workers = spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    return spec["slotsPerWorker"], workers, words[words.index("-n") : words.index("-n") + 2]


def test_a_cluster_gives_its_shape_before_it_starts(
    validator: jsonschema.protocols.Validator,
) -> None:
    local = cb.Cluster.local(workers=2, slots=2, name="lab")
    hosts = cb.Cluster.ssh(["node1:2", "node2:2"], ssh_config="none", name="lab")
    for cluster in (local, hosts):  # nodes known when the cluster is made
        assert cluster.state == "created"
        assert (len(cluster.nodes), cluster.total_slots) == (2, 4)
        assert "2 nodes, 4 slots" in repr(cluster)
        assert cluster.status()["slots"].tolist() == [2, 2]
        job = cluster.to_mpijob(ARGV, np=4, image="img")
        check(validator, job)
        assert _shape(job) == (2, 2, ["-n", "4"])
        assert _shape(cluster.to_mpijob(ARGV, image="img")) == (2, 2, ["-n", "4"])
    # Not known until they start: nodes that join, slots counted on the node.
    unknown = [
        cb.Cluster.elastic(min_nodes=2, max_nodes=4),
        cb.Cluster.slurm(nodes=2),
        cb.Cluster.ssh(["node1:gpus"], ssh_config="none"),
    ]
    for cluster in unknown:
        with pytest.raises(cb.ConfigError, match=r"nodes are not known yet.*slots_per_worker=4"):
            cluster.to_mpijob(ARGV, np=4, image="img", name="job")
        job = cluster.to_mpijob(ARGV, np=4, image="img", name="job", slots_per_worker=2)
        assert _shape(job) == (2, 2, ["-n", "4"])


def test_cluster_to_mpijob_delegates(validator: jsonschema.protocols.Validator) -> None:
    cluster = cb.Cluster.local(workers=2, slots=2, mpi="mpich", name="lab", env={"A": "1"})
    job = cluster.to_mpijob(ARGV, 4, image="img", workers=2, slots_per_worker=2, retries=1)
    check(validator, job)
    assert job["spec"]["mpiImplementation"] == "MPICH"
    assert job["metadata"]["name"] == "lab"
    words = run_words(job)
    assert words[words.index("--env") + 1] == "A=1"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "sdk"), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "clusterbook", "export", "mpijob", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_the_command_line_prints_yaml_that_passes_the_schema(
    validator: jsonschema.protocols.Validator,
) -> None:
    done = _cli(
        *("--image", "ghcr.io/me/train:2", "-n", "4", "--slots", "2", "--mpi", "mpich"),
        *("--name", "train", "--retries", "2", "--deadline", "2h", "--retention", "7d"),
        *("--clean", "all", "--env", "SEED=1", "--", "python", "train.py", "--lr", "0.1"),
    )
    assert done.returncode == 0, done.stderr
    job = yaml.safe_load(done.stdout)
    check(validator, job)
    assert job == render_mpijob(
        ARGV,
        np=4,
        image="ghcr.io/me/train:2",
        name="train",
        slots_per_worker=2,
        mpi="mpich",
        retries=2,
        deadline="2h",
        retention="7d",
        clean="all",
        env={"SEED": "1"},
    )


def test_the_command_line_refuses_bad_input_in_its_own_terms() -> None:
    done = _cli("--image", "img", "-n", "3", "--slots", "2", "--name", "x_y", "--", "a.out")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "clusterbook: error: MPIJob name 'x_y'" in done.stderr
    assert "give --name x-y" in done.stderr
    done = _cli("--image", "img", "-n", "2")
    assert done.returncode == 2
    assert "No command given; write it after '--'" in done.stderr

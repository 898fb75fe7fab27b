"""A message names an option the way the interface the user typed in spells it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.launch.program import resolve_program
from clusterbook.nodes.fanout import parallel
from clusterbook.spec import validate_np
from clusterbook.wording import INTERFACES, speaking, spell, spell_or

SDK = Path(cb.__file__).parent


def test_each_interface_spells_its_own_options() -> None:
    assert spell("np", 8) == "np=8"
    assert spell("launcher", "/x/mpirun") == "launcher='/x/mpirun'"
    with speaking("cli"):
        assert spell("np", 8) == "-n 8"
        assert spell("oversubscribe", True) == "--oversubscribe"
        assert spell("cwd", "/d") == "--wdir /d"
        assert spell("sshd_path", "/s") is None  # the command line has no such option
        assert spell_or("sshd_path", "/s", "elsewhere") == "elsewhere"
        with speaking("magics"):
            assert spell("cwd", "/d") is None
            assert spell("np", 2) == "-n 2"
        assert spell("np", 8) == "-n 8"  # back to the outer interface
    assert spell("np", 8) == "np=8"
    with pytest.raises(ValueError, match="'gui'"), speaking("gui"):
        pass


def test_the_interface_reaches_the_threads_that_do_the_work() -> None:
    with speaking("cli"):
        done, failed = parallel(["a", "b"], lambda _: spell("np", 3))
    assert (done, failed) == ({"a": "-n 3", "b": "-n 3"}, {})


@pytest.mark.parametrize(
    ("interface", "said", "not_said"),
    [
        ("python", ["np=9 is more", "oversubscribe=True"], ["--oversubscribe", "-n 9"]),
        ("cli", ["-n 9 is more", "pass --oversubscribe"], ["np=", "oversubscribe="]),
        ("magics", ["-n 9 is more", "pass --oversubscribe"], ["np=", "oversubscribe="]),
    ],
)
def test_too_many_ranks_is_told_in_the_users_terms(
    interface: str, said: list[str], not_said: list[str]
) -> None:
    with speaking(interface), pytest.raises(cb.ConfigError) as info:
        validate_np(9, 4, oversubscribe=False)
    for text in said:
        assert text in str(info.value)
    for text in not_said:
        assert text not in str(info.value)


def test_a_missing_script_is_told_in_the_users_terms(tmp_path: Path) -> None:
    argv = ["python", "nope.py"]
    where = {"python": "/usr/bin/python3", "path_env": None, "cwd": str(tmp_path), "local": True}
    with pytest.raises(cb.ConfigError, match="pass cwd='/its/directory'"):
        resolve_program(argv, **where)
    with speaking("cli"), pytest.raises(cb.ConfigError, match="pass --wdir /its/directory"):
        resolve_program(argv, **where)
    with speaking("magics"), pytest.raises(cb.ConfigError, match="run it from its own dir"):
        resolve_program(argv, **where)


# Words like NAME= in messages that are not options: hostfile lines, join URL queries.
NOT_OPTIONS = {"slots", "min", "max", "fingerprint"}  # fingerprint: a URL's query
# Messages only Python can cause: a value no other interface can pass.
PYTHON_ONLY = {
    ("ssh/hostkeys.py", "host_keys"),
    # work_dir= (and its options) exist in Python only.
    *(("head/mirror.py", name) for name in ("work_dir", "known_hosts", "host_keys")),
    *(("cluster/options.py", name) for name in ("work_dir", "run_dir")),
    ("launch/recovery.py", "restart_on_join"),  # Python only
    ("spec.py", "channel_port"),  # Cluster.elastic/slurm(channel_port=): Python only
    # a "srun" cluster spec's own arguments (from_environment fills them in)
    *(("providers/slurm/srun.py", name) for name in ("job_id", "srun")),
    # run_on_nodes(nodes=), put(dest=) and write(data=, mode=): Python calls only
    ("nodes/commands.py", "nodes"),
    ("nodes/destination.py", "dest"),
    *(("nodes/transfer.py", name) for name in ("data", "mode")),
    ("cluster/remote/node_calls.py", "data"),
    # cluster.map(np=, max_running=): a Python call only
    *(("functions/sweep.py", name) for name in ("np", "max_running")),
    # Cluster.ssh(launch=): Python only
    ("providers/ssh/masters.py", "launch"),
    ("providers/ssh/provider.py", "launch"),
    # the cluster option set_aside=: Python (and profiles) only
    ("launch/setaside.py", "set_aside"),
    # scale() and adapt() of a Slurm cluster, its bounds and warning: Python (and profiles) only
    *(("scaling.py", name) for name in ("min_nodes", "max_nodes", "minimum", "maximum")),
    ("scaling.py", "interval"),
    ("providers/slurm/batch.py", "signal_before"),
    ("cluster/resize.py", "restarts"),
    # torchrun's --rdzv-conf keys, spelt as torchrun takes them
    *(("torch/conf.py", name) for name in ("keep_alive_interval", "keep_alive_max_attempt")),
}


def _error_messages() -> list[tuple[str, int, str]]:
    """(file, line, text) of the literal text of every error and warning the SDK raises."""
    found = []
    for path in SDK.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if not (name.endswith(("Error", "Warning")) or name == "warn"):
                continue
            text = "".join(
                sub.value
                for arg in node.args
                for sub in ast.walk(arg)
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
            )
            found.append((str(path.relative_to(SDK)), node.lineno, text))
    return found


def test_no_message_spells_an_option_the_python_way_by_hand() -> None:
    messages = _error_messages()
    assert len(messages) > 100  # the scan sees the SDK's messages
    hand_spelled = [
        f"{where}:{line}: {name}="
        for where, line, text in messages
        for name in re.findall(r"(?<![\w.-])([a-z][a-z_]+)=(?!=)", text)
        if name not in NOT_OPTIONS and (where, name) not in PYTHON_ONLY
    ]
    assert hand_spelled == [], "name options with clusterbook.wording.spell()"


def test_every_option_a_message_spells_is_known_to_the_interfaces_that_have_it() -> None:
    spelled = set()
    for path in SDK.rglob("*.py"):
        spelled |= set(re.findall(r"spell(?:_or)?\(\s*[\"'](\w+)[\"']", path.read_text()))
    assert spelled >= {"np", "oversubscribe", "cwd", "launcher", "host_keys", "min_nodes"}
    cli_flags = _cli_flags()
    for option, form in INTERFACES["cli"].items():
        flag = form.split()[0]
        assert flag in cli_flags, f"{option}: the command line has no {flag}"
    # What the command line does not have: said in words there (see each message). (Its
    # --clean is export mpijob's: `clusterbook run` stops its cluster with the job, so there is
    # nothing it could keep.)
    no_flag = {"sshd_path", "min_nodes", "join_timeout", "passphrase", "node_python", "listen"}
    assert set(spelled) - set(INTERFACES["cli"]) == no_flag


def _cli_flags() -> set[str]:
    import argparse

    from clusterbook.cli.main import _parser

    flags: set[str] = set()
    pending = [_parser()]
    while pending:
        parser = pending.pop()
        for action in parser._actions:
            flags.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    return flags

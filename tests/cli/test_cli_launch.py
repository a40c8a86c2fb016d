"""``schedir launch``: N local processes with the process-group variables, their output
prefixed by rank, a failed or stuck process named in a one-line error (exit status 1),
bad input refused (status 2). The scripts here are plain Python (no JAX): the JAX side
is tests/jax_exec/test_pipeline_multihost.py."""

from __future__ import annotations

import sys

from schedir.cluster import ClusterEnvError, ProcessGroup
from schedir_cli.app import main

PY = sys.executable
SHOW = (
    "import os; print(os.environ['SCHEDIR_PROCESS_ID'], os.environ['SCHEDIR_NUM_PROCESSES'], "
    "os.environ['SCHEDIR_COORDINATOR'], os.environ['SCHEDIR_LOCAL_DEVICES'], "
    "os.environ['XLA_FLAGS'], os.environ['JAX_PLATFORMS'])"
)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_every_process_gets_its_rank_the_coordinator_and_its_devices(capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=9 --xla_dump_to=x")
    status, out, err = run(capsys, "launch", "-n", "3", "-k", "2", "--", PY, "-c", SHOW)
    assert status == 0, err
    lines = sorted(out.splitlines())
    assert [line.split()[:3] for line in lines] == [["[0]", "0", "3"], ["[1]", "1", "3"],
                                                     ["[2]", "2", "3"]]  # fmt: skip
    coordinators = {line.split()[3] for line in lines}
    assert len(coordinators) == 1 and coordinators.pop().startswith("localhost:")
    for line in lines:
        words = line.split()
        assert words[4] == "2" and words[-1] == "cpu"
        # the device count replaced, the other flags kept
        assert "--xla_dump_to=x" in words and "--xla_force_host_platform_device_count=2" in words
        assert "--xla_force_host_platform_device_count=9" not in words
    assert err.count("ok (") == 3


def test_a_failing_process_is_named_and_the_others_stopped(capsys):
    script = ("import os, sys, time\nif os.environ['SCHEDIR_PROCESS_ID'] == '1': sys.exit(4)\n"
              "time.sleep(60)")  # fmt: skip
    status, out, err = run(capsys, "launch", "-n", "2", "--grace", "0.5", "--", PY, "-c", script)
    assert status == 1
    assert "schedir: error: launch: process 1 exited with status 4" in err
    assert "process 0: killed after another process failed" in err


def test_a_stuck_job_times_out(capsys):
    status, _, err = run(capsys, "launch", "-n", "2", "--timeout", "1", "--", PY, "-c",
                         "import time; time.sleep(60)")  # fmt: skip
    assert status == 1
    assert "timed out after 1 s" in err.splitlines()[-1]


def test_debug_after_the_separator_belongs_to_the_script(capsys):
    status, out, _ = run(capsys, "launch", "-n", "1", "--", PY, "-c",
                         "import sys; print(sys.argv[1:])", "--debug")  # fmt: skip
    assert status == 0 and out.strip() == "[0] ['--debug']"


def test_bad_input_is_a_one_line_error(capsys):
    for argv, words in (
        (["launch", "-n", "2", "--", "no-such-command-here"], "not found"),
        (["launch", "-n", "2"], "no command given"),
        (["launch", "-n", "0", "--", PY], "expected a whole number >= 1"),
        (["launch", "-n", "1", "--port", "70000", "--", PY], "port 1..65535"),
    ):
        status, _, err = run(capsys, *argv)
        assert status == 2, (argv, err)
        assert err.startswith("schedir: error: ") and words in err and len(err.splitlines()) == 1


def test_process_group_variables_round_trip_and_bad_ones_are_named():
    group = ProcessGroup("node7:1234", 4, 3, 8)
    assert ProcessGroup.from_env(group.to_env()) == group
    assert ProcessGroup.from_env({"PATH": "/bin"}) is None
    bad = [
        ({"SCHEDIR_NUM_PROCESSES": "2"}, "SCHEDIR_COORDINATOR, SCHEDIR_PROCESS_ID not set"),
        ({**group.to_env(), "SCHEDIR_PROCESS_ID": "x"}, "SCHEDIR_PROCESS_ID = 'x'"),
        ({**group.to_env(), "SCHEDIR_PROCESS_ID": "4"}, "expected < SCHEDIR_NUM_PROCESSES"),
        ({**group.to_env(), "SCHEDIR_COORDINATOR": "node7"}, "expected host:port"),
        ({**group.to_env(), "SCHEDIR_LOCAL_DEVICES": "0"}, "SCHEDIR_LOCAL_DEVICES = 0"),
    ]
    for env, words in bad:
        try:
            ProcessGroup.from_env(env)
        except ClusterEnvError as err:
            assert words in str(err), (env, err)
        else:
            raise AssertionError(f"accepted {env}")

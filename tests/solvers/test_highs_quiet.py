"""HiGHS's MIP solver in scipy 1.17 (and highspy before ERGO-Code/HiGHS#2783) prints
``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();`` on stdout
whatever its options say, when a solution of the presolved problem needs repair: random
model 6865 of tests/random_models.py printed it while planning (its whole-graph MILP,
scipy's ``milp``). A library must print nothing: every MIP solve runs under
``solvers._highs.quiet_stdout``, which drops HiGHS's stray lines and gives back the rest."""

from __future__ import annotations

import ctypes
import os

from random_models import random_case

import jax_exec
from solvers._highs import quiet_stdout

STRAY = b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n"


def test_quiet_stdout_drops_highs_stray_lines_and_gives_back_the_rest(capfd):
    libc = ctypes.CDLL(None)
    with quiet_stdout():
        os.write(1, b"before\n")
        libc.printf(STRAY)  # through C's stdio buffer, as HiGHS prints
        libc.printf(b"a C line\n")
        os.write(1, b"after\n")
    out = capfd.readouterr().out  # (C's buffered line may come before or after "after")
    assert sorted(out.splitlines()) == ["a C line", "after", "before"]


def test_planning_random_model_6865_prints_nothing(capfd):
    case = random_case(6865)
    top = jax_exec.plan(case.loss_fn, case.factory(), *case.args, budget="100%")
    top.replan(1270)  # its whole-graph MILP's solution needed HiGHS's repair here
    assert capfd.readouterr().out == ""

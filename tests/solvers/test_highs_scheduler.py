"""HiGHS runs every solver object of a process on one thread scheduler, made by the
first run (solvers/_highs.py, ``run``): the save-set MILPs ask for one thread, and where
another solver had started the scheduler with HiGHS's default (checkmate_milp, cvxpy,
the application's own HiGHS) every one of them failed with an error status that was
read as "no solution". Blocks then had no save sets between all and none, so plans and
least budgets depended on what had run before in the process (found by the test
suite: a least budget of 81.7% of store-all after tests/test_figures.py, 67.4% alone)."""

from __future__ import annotations

import highspy
import numpy as np
import pytest
import scipy.sparse as sp

from solvers._highs import highs_lp, quiet_highs, run
from solvers.blocks.options import OptionGraph, pareto_save_sets

# a chain of five equations, each value read by the next one's backward
GRAPH = OptionGraph(
    cost=(1.0, 3.0, 1.0, 5.0, 2.0),
    inputs=((), (0,), (1,), (2,), (3,)),
    values=(0, 1, 2, 3, 4),
    value_sizes=(8, 32, 8, 64, 16),
    needs=((), (0,), (1,), (2,), (3,)),
    self_recompute=(False,) * 5,
)


def scheduler_of(threads: int) -> None:
    """Start HiGHS's scheduler with ``threads`` threads, as another solver would."""
    highspy.Highs.resetGlobalScheduler(True)
    h = quiet_highs()
    h.setOptionValue("threads", threads)
    lp = highs_lp([1.0, 1.0], sp.csc_matrix(np.ones((1, 2))), [1.0], [np.inf], [0, 0], [1, 1])
    h.passModel(lp)
    run(h)


def test_save_sets_do_not_depend_on_what_started_the_scheduler():
    scheduler_of(1)
    alone = pareto_save_sets(GRAPH, 4)
    assert alone  # the sweep finds save sets between all and none
    scheduler_of(2)  # e.g. checkmate_milp's default
    assert pareto_save_sets(GRAPH, 4) == alone


class Failing:  # a solver object whose every run ends in HiGHS's error status
    def run(self):
        return highspy.HighsStatus.kError

    def getOptionValue(self, name):
        return 0

    def getModelStatus(self):
        return highspy.HighsModelStatus.kNotset


def test_an_error_status_is_raised_not_read_as_no_solution():
    with pytest.raises(RuntimeError, match=r"^HiGHS failed \(model status"):
        run(Failing())

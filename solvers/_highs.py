"""Quiet HiGHS for every solver that calls it (highspy directly, or through cvxpy).

HiGHS prints a banner on stdout when a process creates its first solver object,
before any option can apply; a library called from Python must print nothing.
:func:`silence_banner` creates that first object with what it prints on stdout (file
descriptor 1) dropped, once per process; :func:`quiet_highs` returns a ``highspy.Highs``
with its log off. cvxpy's HiGHS interface creates its own objects: call
:func:`silence_banner` before ``problem.solve(solver=cp.HIGHS)`` (cvxpy turns the log
off itself unless ``verbose``). scipy's HiGHS (``linprog``, ``milp``) is a separate
build without the banner, but its MIP solver (scipy 1.17's, as highspy's before the fix
of ERGO-Code/HiGHS#2783) prints a debugging line on stdout whatever its options say
(``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();``, when a
solution of the presolved problem needs repair: random model 6865 of
tests/random_models.py): every MIP solve runs under :func:`quiet_stdout`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
from collections.abc import Callable, Iterator

_SILENCED = False


def silence_banner() -> None:
    """Create the process's first HiGHS object with everything it prints on stdout
    dropped (once)."""
    global _SILENCED
    if _SILENCED:
        return
    import highspy

    with quiet_stdout(drop=lambda line: True):
        highspy.Highs()
    _SILENCED = True


def _stray(line: bytes) -> bool:
    """Whether HiGHS printed ``line`` whatever its options say (module docstring)."""
    return line.startswith(b"HighsMipSolverData::")


@contextlib.contextmanager
def quiet_stdout(drop: Callable[[bytes], bool] = _stray) -> Iterator[None]:
    """Run the body with stdout (file descriptor 1) sent to a temporary file, then write
    back the lines printed there meanwhile (by another thread, say) that ``drop`` does
    not drop (by default HiGHS's stray lines, :func:`_stray`); C's stdio buffers are
    flushed first, so that nothing the body printed through them leaks out later."""
    _flush_python()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            _flush_python()
            _libc_flush()
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().splitlines(keepends=True) if not drop(line)]
            if kept:
                os.write(1, b"".join(kept))


def _flush_python() -> None:
    if sys.stdout is not None:  # (None without a console, as under pythonw)
        sys.stdout.flush()


def _libc_flush() -> None:
    """Flush C's stdio buffers (HiGHS prints through them), where libc is reachable."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # pragma: no cover - no such C library (Windows)
        pass


def run(h) -> None:
    """``h.run()`` of a ``highspy.Highs``, raising ``RuntimeError`` on HiGHS's error
    status (a time or node limit and infeasibility are answers, read from the model
    status, not errors).

    HiGHS runs every solver object of a process on one thread scheduler, made by the
    first run: an object that asks for another thread count (:func:`binary_model`'s
    one thread) fails where another started it with its default (checkmate_milp's,
    cvxpy's, the application's HiGHS). Such a failure had been read as "no solution"
    (the planner's save-set MILPs found none, so a block had fewer options, and plans
    and least budgets depended on what had run before in the process). Now the
    scheduler is reset and the model solved again: the same answer whatever ran before.
    (The reset waits for the scheduler's workers; this package runs HiGHS in the
    calling thread only.)"""
    import highspy

    with quiet_stdout():
        status = h.run()
    if status == highspy.HighsStatus.kError and _threads(h) != 0:
        reset = getattr(highspy.Highs, "resetGlobalScheduler", None)
        if reset is not None:  # (highspy >= 1.7.1)
            reset(True)
            with quiet_stdout():
                status = h.run()
    if status == highspy.HighsStatus.kError:
        raise RuntimeError(f"HiGHS failed (model status {h.getModelStatus()})")


def _threads(h) -> int:
    value = h.getOptionValue("threads")
    return int(value[-1] if isinstance(value, tuple) else value)


def quiet_highs():
    """A ``highspy.Highs`` that prints nothing (banner silenced, ``output_flag`` off)."""
    import highspy

    silence_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def highs_lp(cost, a, row_lower, row_upper, col_lower, col_upper, integer=None):
    """The ``highspy.HighsLp`` of ``min cost x  s.t.  row_lower <= a x <= row_upper,
    col_lower <= x <= col_upper`` (``a``: a scipy sparse matrix; ``integer``: per
    column, whether it is integral; None: an LP)."""
    import highspy
    import numpy as np

    a = a.tocsc()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
    lp.col_cost_ = np.asarray(cost, dtype=float)
    lp.col_lower_ = np.asarray(col_lower, dtype=float)
    lp.col_upper_ = np.asarray(col_upper, dtype=float)
    lp.row_lower_ = np.asarray(row_lower, dtype=float)
    lp.row_upper_ = np.asarray(row_upper, dtype=float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = lp.num_col_, lp.num_row_
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    if integer is not None:
        kinds = highspy.HighsVarType.kInteger, highspy.HighsVarType.kContinuous
        lp.integrality_ = [kinds[0] if i else kinds[1] for i in integer]
    return lp


def binary_model(cost, a, row_lower, row_upper, col_lower, *, node_limit: int, rel_gap: float):
    """A quiet ``highspy.Highs`` holding ``min cost x  s.t.  row_lower <= a x <=
    row_upper, col_lower <= x <= 1, x integer`` (``a``: a scipy sparse matrix), stopped
    after ``node_limit`` branch-and-bound nodes (deterministic) and at relative gap
    ``rel_gap``. Built once, it is solved again after ``changeRowBounds``: a sweep of one
    bound pays HiGHS's set-up once (scipy's ``milp`` rebuilds and checks every call)."""
    n = a.shape[1]
    lp = highs_lp(cost, a, row_lower, row_upper, col_lower, [1.0] * n, [True] * n)
    h = quiet_highs()
    # One thread: HiGHS's idle workers spin, which beside XLA compiling the planner's
    # kernels (or on any loaded machine) took these small MILPs 2.6x as long. No
    # feasibility jump (HiGHS >= 1.10): on the save-set MILPs of the test zoo it spent
    # three quarters of HiGHS's time and never changed an answer (older HiGHS lacks the
    # option and ignores it, answering with an error status).
    h.setOptionValue("threads", 1)
    h.setOptionValue("mip_heuristic_run_feasibility_jump", False)
    h.setOptionValue("mip_max_nodes", int(node_limit))
    h.setOptionValue("mip_rel_gap", float(rel_gap))
    h.passModel(lp)
    return h


def solution(h):
    """The primal solution of a solved ``highspy.Highs`` as a numpy array, or None when
    it found none (infeasible, or stopped before finding one)."""
    import numpy as np

    if h.getInfo().primal_solution_status != 2:  # kSolutionStatusFeasible
        return None
    return np.asarray(h.getSolution().col_value)

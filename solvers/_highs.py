"""Quiet HiGHS for every solver that calls it (highspy directly, or through cvxpy).

HiGHS prints a banner on stdout when a process creates its first solver object,
before any option can apply; a library called from Python must print nothing.
:func:`silence_banner` creates that first object with stdout (file descriptor 1)
sent to /dev/null, once per process; :func:`quiet_highs` returns a ``highspy.Highs``
with its log off. cvxpy's HiGHS interface creates its own objects: call
:func:`silence_banner` before ``problem.solve(solver=cp.HIGHS)`` (cvxpy turns the log
off itself unless ``verbose``). scipy's HiGHS (``linprog``, ``milp``) is a separate
build that prints nothing.
"""

from __future__ import annotations

import os
import sys

_SILENCED = False


def silence_banner() -> None:
    """Create the process's first HiGHS object with stdout sent to /dev/null (once)."""
    global _SILENCED
    if _SILENCED:
        return
    import highspy

    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
    _SILENCED = True


def quiet_highs():
    """A ``highspy.Highs`` that prints nothing (banner silenced, ``output_flag`` off)."""
    import highspy

    silence_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h

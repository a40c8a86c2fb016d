"""What an answer is worth, as the ``schedir`` commands print it: exact or not, the
discretization slot, the gap to a proven lower bound, and why no schedule was found.

Reads the metadata contract of ``solvers.solve`` (docs/formats.md#schedules):
``meta["exact"]``, ``meta["discretization"]``, ``meta["time_limited"]`` and
``meta["lower_bound"]``; an ``Infeasible``'s ``min_budget`` and ``detail``.
"""

from __future__ import annotations

import math
import re

from schedir.render import format_time
from schedir_cli.common import bytes_text


def _finite(value) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def answer_quality(meta: dict, claimed: bool) -> dict:
    """Whether an answer is exact, and how far from the optimum it may be.

    Reads ``meta["exact"]`` (before a solver reports it: ``claimed``, the registry's
    flag), ``meta["discretization"]`` and ``meta["time_limited"]``/``meta["lower_bound"]``.
    A discretized or time-limited answer is never exact. Returns ``exact``,
    ``time_limited``, ``slot_size`` (bytes or None), ``lower_bound`` (seconds: a bound
    on the optimum of the method's model; the makespan when exact; None when unknown)
    and ``gap`` (makespan / lower_bound - 1; None when unknown).
    """
    disc = meta.get("discretization")
    disc = disc if isinstance(disc, dict) else None
    time_limited = meta.get("time_limited") is True
    exact = meta.get("exact", claimed) is True and disc is None and not time_limited
    makespan = _finite(meta.get("makespan"))
    if exact:
        bound = makespan
    else:
        bound = _finite((disc or {}).get("lower_bound", meta.get("lower_bound")))
    gap = None
    if makespan is not None and bound is not None:
        gap = 0.0 if makespan <= bound else (makespan / bound - 1 if bound > 0 else None)
    if gap is None and disc is not None:
        gap = _finite(disc.get("relative_loss"))
    return {
        "exact": exact,
        "time_limited": time_limited,
        "slot_size": disc.get("slot_size") if disc else None,
        "lower_bound": bound,
        "gap": gap,
    }


def gap_text(quality: dict) -> str:
    """Table cell: ``0`` exact, ``<=2.1%`` bounded, ``?`` unknown."""
    if quality["exact"]:
        return "0"
    return "?" if quality["gap"] is None else f"<={quality['gap']:.1%}"


def quality_text(method: str, quality: dict) -> str:
    """One line: ``yes: an optimum of rotor's model`` or why not, with the bound."""
    if quality["exact"]:
        return f"yes: an optimum of {method}'s model"
    why = []
    if quality["slot_size"] is not None:
        why.append(f"discretized in slots of {bytes_text(quality['slot_size'])}")
    if quality["time_limited"]:
        why.append("time limit reached")
    if quality["lower_bound"] is not None and quality["gap"] is not None:
        why.append(
            f"at most {quality['gap']:+.1%} above the optimum "
            f"(lower bound {format_time(quality['lower_bound'])})"
        )
    else:
        why.append("no bound on the distance to the optimum")
    return "no: " + "; ".join(why)


def infeasible_text(err, budget: int) -> str:
    """``rotor: no schedule fits 900 B; the least is 1.11 KiB (1140 B)`` (+ the detail);
    without a least budget the method proved nothing: ``found no schedule under ...``."""
    detail = f" ({infeasible_detail(err)})" if infeasible_detail(err) else ""
    if err.min_budget is None:  # not proven: e.g. a time limit reached without a schedule
        return f"{err.method}: found no schedule under {bytes_text(budget)}{detail}"
    least = f"; the least is {bytes_text(err.min_budget)}"
    return f"{err.method}: no schedule fits {bytes_text(budget)}{least}{detail}"


def infeasible_detail(err) -> str:
    """The solver's explanation of an Infeasible (its ``detail``; before the class kept
    it: the trailing parenthesis of its message)."""
    detail = getattr(err, "detail", None)
    if detail is None:
        match = re.search(r"\((.*)\)\s*$", str(err))
        detail = match.group(1) if match else ""
    return str(detail)

"""What an answer is worth, as the ``schedir`` commands print it: one label per answer
(``optimal``, ``<=2.2%``, ``fixed``, ``heuristic``, ``no bound``), the same word in
the tables, the one-answer lines and ``--json``; the discretization slot, the gap to
a proven lower bound, and why no schedule was found.

Reads the metadata contract of ``solvers.solve`` (docs/formats.md#schedules):
``meta["exact"]``, ``meta["discretization"]``, ``meta["time_limited"]`` and
``meta["lower_bound"]``; an ``Infeasible``'s ``min_budget`` and ``detail``; the
registry's ``exact`` and ``fixed`` flags of a method.
"""

from __future__ import annotations

import math
import re

from schedir.render import format_time
from schedir_cli.common import bytes_text

# A makespan within this relative distance of a proven lower bound is an optimum: the
# two are float sums of the same times in different orders (their rounding is ~1e-15).
PROVEN = 1e-9

OPTIMAL, FIXED, HEURISTIC, NO_BOUND = "optimal", "fixed", "heuristic", "no bound"

LEGEND = (
    "optimal: an optimum of the method's model (claimed by an exact method, or proven by "
    "a lower bound);\n<=X%: at most X% above that optimum (a proven lower bound); fixed: "
    "one fixed schedule whatever\nthe budget (no search); heuristic: no bound known"
)


def _finite(value) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def method_label(exact: bool, fixed: bool) -> str:
    """What a method's answers are when nothing (a slot, a time limit) degrades them:
    ``fixed``, ``optimal`` or ``heuristic``."""
    return FIXED if fixed else OPTIMAL if exact else HEURISTIC


def bound_text(gap: float) -> str:
    """``<=2.2%``: the gap rounded *up* to two significant digits (at least one decimal),
    so that the printed bound is never tighter than the proven one.

    >>> bound_text(0.02149), bound_text(4.1e-5), bound_text(1.352), bound_text(0.1)
    ('<=2.2%', '<=0.0041%', '<=135.2%', '<=10.0%')
    """
    percent = 100 * gap
    if percent <= 0:
        return "<=0.0%"
    decimals = max(1, 1 - math.floor(math.log10(percent)))
    step = 10.0**-decimals
    return f"<={math.ceil(percent / step - 1e-6) * step:.{decimals}f}%"


def answer_quality(meta: dict, claimed: bool, fixed: bool = False) -> dict:
    """Whether an answer is an optimum, and how far from it it may be.

    Reads ``meta["exact"]`` (before a solver reports it: ``claimed``, the registry's
    flag), ``meta["discretization"]`` and ``meta["time_limited"]``/``meta["lower_bound"]``;
    ``fixed``: the registry's flag (a fixed schedule, labelled ``fixed`` and never
    exact). Returns ``label`` (see the module docstring), ``exact`` (the label is
    ``optimal``: an exact method's undegraded answer, or a makespan within 1e-9 of a
    proven lower bound), ``fixed``,
    ``time_limited``, ``slot_size`` (bytes or None), ``lower_bound`` (seconds: a bound
    on the optimum of the method's model; the makespan when claimed exact; None when
    unknown) and ``gap`` (makespan / lower_bound - 1, 0 when proven optimal; None when
    unknown).
    """
    disc = meta.get("discretization")
    disc = disc if isinstance(disc, dict) else None
    time_limited = meta.get("time_limited") is True
    # a fixed schedule is no optimum of anything, whatever its solver says (JAX's
    # policies say exact: their model has one schedule): labelled like store-all
    claimed_exact = not fixed and meta.get("exact", claimed) is True
    claimed_exact = claimed_exact and disc is None and not time_limited
    makespan = _finite(meta.get("makespan"))
    if claimed_exact:
        bound = makespan
    else:
        bound = _finite((disc or {}).get("lower_bound", meta.get("lower_bound")))
    gap = None
    if makespan is not None and bound is not None and bound > 0:
        gap = max(0.0, makespan / bound - 1)
    elif makespan is not None and bound is not None:
        gap = 0.0 if makespan <= bound else None
    if gap is None and disc is not None:
        gap = _finite(disc.get("relative_loss"))
    if gap is not None and gap <= PROVEN:
        gap = 0.0
    if fixed:
        label = FIXED
    elif gap == 0.0:
        label = OPTIMAL
    elif gap is not None:
        label = bound_text(gap)
    else:
        label = NO_BOUND if claimed else HEURISTIC
    return {
        "label": label,
        "exact": label == OPTIMAL,
        "fixed": fixed,
        "time_limited": time_limited,
        "slot_size": disc.get("slot_size") if disc else None,
        "lower_bound": bound,
        "gap": gap,
    }


def quality_text(method: str, quality: dict) -> str:
    """One line after the label: ``optimal: an optimum of rotor's model``, or what
    degrades the answer, with its bound."""
    label = quality["label"]
    if label == FIXED:
        return f"{FIXED}: {method}'s one schedule, whatever the budget (no search)"
    why = []
    if quality["slot_size"] is not None:
        why.append(f"discretized in slots of {bytes_text(quality['slot_size'])}")
    if quality["time_limited"]:
        why.append("time limit reached")
    if label == OPTIMAL and not why:
        return f"{OPTIMAL}: an optimum of {method}'s model"
    if label == OPTIMAL:
        bound = format_time(quality["lower_bound"])
        return f"{OPTIMAL}: {'; '.join(why)}; proven by a lower bound ({bound}) on the optimum"
    if quality["gap"] is not None:
        why.append(f"at most {label[2:]} above the optimum (lower bound "
                   f"{format_time(quality['lower_bound'])})")  # fmt: skip
    else:
        why.append("no bound on the distance to the optimum")
    return f"{label}: " + "; ".join(why)


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

"""Simulate and judge a schedule on any problem kind (the kind's own functions).

:func:`simulate` looks the problem's kind up (:mod:`schedir.kind`), refuses a schedule
object of another kind (:func:`check_schedule_kind`) and calls the kind's simulator;
:func:`judge` calls the kind's judge, or :func:`budget_judge`. The chain simulator
itself is :mod:`schedir.chain.simulate` (its names stay importable from here).
"""

from __future__ import annotations

from schedir import kind as kinds
from schedir.chain.simulate import buffer_name, op_time, simulate_chain
from schedir.errors import InvalidSchedule
from schedir.trace import Trace

__all__ = [
    "Trace",
    "budget_judge",
    "buffer_name",
    "check_schedule_kind",
    "judge",
    "op_time",
    "simulate",
    "simulate_chain",
]


def budget_judge(problem, trace, budget: int | None) -> dict:
    """The default: the simulated peak fits ``budget`` bytes."""
    if budget is None:
        raise InvalidSchedule(f"a {type(problem).__name__} needs a memory budget")
    if trace.peak_memory > budget:
        raise InvalidSchedule(f"peak memory {trace.peak_memory} exceeds the budget {budget}")
    return {"makespan": trace.makespan, "peak_memory": trace.peak_memory}


def _problem_kind(problem) -> kinds.Kind:
    kind = kinds.of(problem)
    if kind is None or not isinstance(problem, kind.problem):
        known = ", ".join(k.problem.__name__ for k in kinds.kinds())
        raise TypeError(f"simulate: no simulator for {type(problem).__name__} (known: {known})")
    return kind


def judge(problem, trace, budget: int | None) -> dict:
    """Check ``trace`` against the limits of ``problem`` (and ``budget``); its metadata."""
    kind = kinds.of(problem)
    check = kind.judge if kind is not None and kind.judge is not None else budget_judge
    return check(problem, trace, budget)


def _described(cls: type) -> str:  # 'Schedule (schedir.schedule)'
    fmt = getattr(cls, "FORMAT", None)
    return f"{cls.__name__} ({fmt})" if fmt else cls.__name__


def check_schedule_kind(problem, schedule) -> None:
    """Raise :class:`InvalidSchedule` when ``schedule`` (a schedule object) belongs to
    another problem kind than ``problem`` (e.g. a graph schedule on a chain)."""
    kind = kinds.of(problem)
    owner = kinds.of(schedule) if not isinstance(schedule, list | tuple) else None
    if kind is None or owner is None or not isinstance(schedule, owner.schedule):
        return  # op sequences and unregistered classes: the simulator checks each op
    if owner is kind or owner.schedule in kind.schedules:
        return
    what = _described(owner.schedule)
    owner_name = owner.problem.__name__
    if not owner.schedule.__name__.lower().startswith(owner_name.lower()):
        what = f"{owner_name.lower()} {what}"  # 'chain Schedule (...)'
    article = "an" if what[0] in "AEIOUaeiou" else "a"
    raise InvalidSchedule(
        f"{article} {what} cannot run on a {kind.problem.__name__}, which reads "
        f"{' or '.join(_described(c) for c in kind.schedules)}"
    )


def simulate(problem, schedule_or_ops, **options):
    """Simulate a schedule on any problem kind (the kind's simulator).

    Raises :class:`InvalidSchedule` when the schedule object is of another problem
    kind, TypeError when no kind reads the problem.
    """
    kind = _problem_kind(problem)
    check_schedule_kind(problem, schedule_or_ops)
    return kind.simulate(problem, schedule_or_ops, **options)

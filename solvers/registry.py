"""One registry for every solver: ``solve(problem, budget, method=...)`` and ``available()``.

A solver is a function ``(problem, budget, **options) -> Schedule`` registered under a
name with the problem kind it reads. :func:`solve` validates the budget, times the
solver, checks the result with the simulator (the judge) and fills the metadata, so
no solver special-cases any of that.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from schedir import InvalidSchedule, Schedule, simulate
from schedir import kind as _kinds
from schedir.budget import parse_budget
from schedir.simulate import judge


class Infeasible(ValueError):
    """The method returns no schedule for this budget.

    With ``min_budget``, none of its schedules fits this budget; without, the message
    says only that it found none (a time limit reached without a schedule, a heuristic
    that gave up: no least budget is claimed) and ``detail`` says what is known.

    Attributes:
        budget: the budget asked for, bytes.
        min_budget: the least budget for which the method returns a schedule, bytes
            (computed, not guessed; ``None`` when the method cannot tell).
    """

    def __init__(self, method: str, budget: int, min_budget: int | None, detail: str = ""):
        self.method, self.budget, self.min_budget = method, budget, min_budget
        self.detail = detail
        if min_budget is not None:
            at = "" if budget is None else f" budget {budget}"
            text = f"{method}: no schedule fits{at}; the minimum feasible budget is {min_budget}"
        else:
            at = "" if budget is None else f" under budget {budget}"
            text = f"{method}: found no schedule{at}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)


class MemoryLimit(ValueError):
    """A solver would need more memory than its cap allows; the message says how much."""


@dataclass(frozen=True)
class Method:
    """A registered solver.

    Attributes:
        name: the registry key, e.g. ``"rotor"``.
        function: ``(problem, budget, **options) -> Schedule``.
        problem: the problem class it reads (``schedir.Chain``, ...).
        exact: whether it returns an optimum of its model.
        description: one line.
        reports_progress: whether ``function`` takes a ``progress`` keyword (a callable
            ``(fraction, message)``), which :func:`solve` then passes.
        fixed: whether it returns one fixed schedule whatever the budget (store-all,
            JAX's checkpoint policies, ...: no search; its peak is its least budget).
    """

    name: str
    function: Callable[..., Schedule]
    problem: type
    exact: bool
    description: str
    reports_progress: bool = False
    fixed: bool = False


# One name may serve several problem kinds (e.g. "store_all" on chains and graphs).
_METHODS: dict[tuple[str, type], Method] = {}


def register(name: str, *, problem: type, exact: bool, description: str, fixed: bool = False):
    """Decorator adding a solver function to the registry under ``name`` for ``problem``
    (``fixed``: see :class:`Method`)."""

    def wrap(function: Callable[..., Schedule]) -> Callable[..., Schedule]:
        if (name, problem) in _METHODS:
            raise ValueError(f"solver {name!r} is registered twice for {problem.__name__}")
        takes = "progress" in inspect.signature(function).parameters
        entry = Method(name, function, problem, exact, description, takes, fixed)
        _METHODS[name, problem] = entry
        return function

    return wrap


def unregister(name: str, problem: type) -> Method:
    """Remove the method ``name`` for ``problem`` (a class) from the registry and return
    it (to register it again, or in tests). Unknown pairs raise ``KeyError`` naming them.

    >>> import schedir, solvers
    >>> entry = solvers.unregister("chen_sqrt", schedir.Chain)
    >>> "chen_sqrt" in [m.name for m in solvers.available(schedir.Chain)]
    False
    >>> _ = solvers.register("chen_sqrt", problem=schedir.Chain, exact=entry.exact,
    ...                      description=entry.description)(entry.function)
    """
    try:
        return _METHODS.pop((name, problem))
    except KeyError:
        known = ", ".join(f"{n} ({p.__name__})" for n, p in _METHODS)
        raise KeyError(f"no solver {name!r} registered for {problem!r}; known: {known}") from None


def available(problem: object | type | None = None) -> list[Method]:
    """Registered methods, optionally only those that read ``problem`` (an instance or class).

    >>> import schedir, solvers
    >>> [m.name for m in solvers.available(schedir.Chain) if m.exact]
    ['rotor']
    """
    methods = list(_METHODS.values())
    if problem is None:
        return methods
    kind = problem if isinstance(problem, type) else type(problem)
    return [m for m in methods if issubclass(kind, m.problem)]


def get(method: str, problem: object | type) -> Method:
    """The method called ``method`` that reads ``problem``; clear errors otherwise."""
    kind = problem if isinstance(problem, type) else type(problem)
    names = sorted({name for name, _ in _METHODS})
    if method not in names:
        raise ValueError(f"unknown solver {method!r}; known: {', '.join(names)}")
    for entry in available(kind):
        if entry.name == method:
            return entry
    readers = [m.problem.__name__ for m in _METHODS.values() if m.name == method]
    raise TypeError(
        f"solver {method!r} reads a {' or '.join(readers)}, got {kind.__name__}; "
        f"methods for {kind.__name__}: {', '.join(m.name for m in available(kind))}"
    )


def check_options(method: str, problem: object | type, options: dict) -> None:
    """A one-line ``TypeError`` naming the first of ``options`` that ``method`` (for
    ``problem``) does not take, and the options it takes.

    >>> import schedir, solvers
    >>> solvers.check_options("rotor", schedir.Chain, {"slot": 10})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: slot = 10: solver 'rotor' takes no such option; its options: model, max_slots, ...
    """
    entry = get(method, problem)
    params = list(inspect.signature(entry.function).parameters.values())[2:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    taken = [p.name for p in params if p.name != "progress" and p.kind is not p.VAR_POSITIONAL]
    for name, value in options.items():
        if name not in taken:
            raise TypeError(
                f"{name} = {value!r}: solver {method!r} takes no such option; "
                f"its options: {', '.join(taken) or 'none'}"
            )


def fixed_schedule(method: str, problem, schedule: Schedule, budget: int) -> Schedule:
    """``schedule`` if its simulated peak fits ``budget``; else Infeasible at that peak.

    For methods whose schedule does not depend on the budget (store-all, ...): their
    peak is exactly their least budget.
    """
    peak = simulate(problem, schedule).peak_memory
    if peak > budget:
        raise Infeasible(method, budget, peak, "a fixed schedule: its peak is its least budget")
    return schedule


def check_budget(budget: object) -> int:
    """A budget is a non-negative whole number of bytes (or slots), exactly
    (:func:`schedir.budget.parse_budget`: an int of any size, a whole float up to 2**53,
    or a string with a unit such as ``"12GiB"``; a percentage needs a reference, which a
    solver does not have).

    >>> check_budget(10**30) == 10**30, check_budget(2048.0)
    (True, 2048)
    """
    return parse_budget(budget)


class _StderrProgress:
    """``progress=True``: once a solve has run ``delay`` seconds, a progress bar on
    stderr when it is a terminal (rich's, cleared at the end), else lines at most one
    per ``every`` seconds; and a last line when such a solve ends."""

    def __init__(self, method: str, delay: float = 2.0, every: float = 1.0):
        self.method, self.delay, self.every = method, delay, every
        self.start = time.perf_counter()
        self.last: float | None = None
        self.lock = threading.Lock()
        self.doing = "running"  # what the heartbeat says while the solver is silent
        self.bar = None  # (rich Progress, task id) once shown, on a terminal only
        self.fraction = math.nan

    def _show(self, fraction: float, message: str, now: float) -> None:
        """One report: the bar's state on a terminal, else a line. Holds the lock."""
        if math.isfinite(fraction):
            self.fraction = fraction
        if not sys.stderr.isatty():
            share = f"{fraction:4.0%} " if math.isfinite(fraction) else ""
            elapsed = now - self.start
            print(f"{self.method}: {share}{message} ({elapsed:.0f} s)", file=sys.stderr, flush=True)
            return
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
            bar = Progress(*columns, console=Console(stderr=True), transient=True)
            bar.start()
            self.bar = (bar, bar.add_task(f"{self.method}: {message}", total=None))
        bar, task = self.bar
        total = 1.0 if math.isfinite(self.fraction) else None
        completed = self.fraction if total else 0.0
        bar.update(task, description=f"{self.method}: {message}", total=total, completed=completed)

    def __call__(self, fraction: float, message: str) -> None:
        now = time.perf_counter()
        with self.lock:
            if now - self.start < self.delay:
                return
            if self.last is not None and now - self.last < self.every:
                return
            self.last = now
            self._show(fraction, message, now)

    def idle(self, gap: float) -> None:
        """Say what runs, unless something was said in the last ``gap`` seconds (a
        solver that reports progress may still be silent for long stretches)."""
        now = time.perf_counter()
        with self.lock:
            if now - self.start < self.delay or (self.last is not None and now - self.last < gap):
                return
            self.last = now
            self._show(math.nan, self.doing, now)

    def done(self) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar[0].stop()  # transient: the bar is cleared
            if self.last is not None:
                elapsed = time.perf_counter() - self.start
                print(f"{self.method}: done in {elapsed:.1f} s", file=sys.stderr, flush=True)


def stderr_progress(name: str) -> _StderrProgress:
    """The reporter ``progress=True`` stands for: lines on stderr after about 2 s."""
    return _StderrProgress(name)


def _heartbeat(report: _StderrProgress, stop: threading.Event) -> None:
    """A line every few seconds in which nothing else was printed: for solvers that
    report nothing themselves, silent stretches of those that do, and the check of
    the answer by the simulator."""
    gap = max(report.delay, 0.5)
    while not stop.wait(gap):
        report.idle(gap)


def solve(
    problem, budget: int | None, method: str = "rotor", progress=False, **options
) -> Schedule:
    """Solve ``problem`` under ``budget`` bytes with the registered ``method``.

    The returned schedule is accepted by ``schedir.simulate`` and by the problem's
    judge (``schedir.simulate.judge``: peak <= budget by default; the devices' own
    capacities for pipeline problems, which take ``budget=None``). Its ``meta`` holds
    ``method``, ``budget``, ``solve_time`` (seconds), ``options``, ``exact`` (whether
    it is an optimum of the method's model on the sizes as given; the method's
    registered exactness unless the solver says otherwise) and what the judge reports
    (simulated ``makespan`` and ``peak_memory``; period and latency for pipelines). A
    method whose answer is not a schedule (a steady-state LP) returns that answer
    unchecked. Raises :class:`Infeasible` (with ``min_budget``) when nothing fits.

    ``progress``: ``True`` prints progress lines to stderr for a solve that runs longer
    than about 2 s; a callable ``progress(fraction, message)`` receives them instead
    (from solvers that report progress: those taking a ``progress`` keyword).

    >>> import schedir, solvers
    >>> chain = schedir.load("examples/chain_small.json")
    >>> s = solvers.solve(chain, 2000, method="rotor")
    >>> s.meta["peak_memory"] <= 2000, s.meta["exact"]
    (True, True)
    """
    entry = get(method, problem)
    check_options(method, problem, options)
    kind = _kinds.of(problem)
    limits_inside = (
        kind is not None and isinstance(problem, kind.problem) and kind.budget != "required"
    )
    if budget is not None or not limits_inside:  # pipelines may carry their limits
        budget = check_budget(budget)
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise TypeError(f"progress = {progress!r}: expected True, False or a callable")
    report = _StderrProgress(method) if progress is True else progress or None
    stop = threading.Event()
    kwargs = dict(options)
    if report is not None and entry.reports_progress:
        kwargs["progress"] = report
    if progress is True:
        threading.Thread(target=_heartbeat, args=(report, stop), daemon=True).start()
    start = time.perf_counter()
    try:
        schedule = entry.function(problem, budget, **kwargs)
        solve_time = time.perf_counter() - start
        if not hasattr(schedule, "ops"):  # e.g. a steady-state LP's rates: nothing to simulate
            return schedule
        if progress is True:
            report.doing = "checking the answer with the simulator"
        trace = simulate(problem, schedule)
        try:
            verdict = judge(problem, trace, budget)
        except InvalidSchedule as err:  # a solver bug: never hand out a rejected schedule
            raise RuntimeError(
                f"{method} returned a schedule the simulator rejects: {err}"
            ) from None
    finally:
        stop.set()
        if progress is True:
            report.done()
    meta = {
        "method": method,
        "budget": budget,
        "solve_time": solve_time,
        "options": options,
        "exact": entry.exact,
        **schedule.meta,
        **verdict,
    }
    return dataclasses.replace(schedule, meta=meta)  # typed fields (block options...) kept

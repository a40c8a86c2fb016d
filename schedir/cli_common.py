"""Helpers shared by the ``schedir`` commands (:mod:`schedir.cli`, :mod:`schedir.cli_more`).

Budgets with units, loading files with one-line errors, quiet solver calls. Imports
``solvers`` only inside functions (see :mod:`schedir.cli`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import schedir
from schedir.errors import InvalidProblem, InvalidSchedule
from schedir.render import format_bytes

STORE_ALL = "store_all"
HUGE = 2**62  # "no limit" budget for the store-all reference


class CLIError(Exception):
    """A one-line error with an exit status (2: bad input, 1: infeasible)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------- budgets and loading

UNITS = {
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z%]*)\s*$")


def parse_budget(text: str, store_all_peak=None) -> int:
    """Bytes from ``'2GiB'``, ``'1.5 MiB'``, ``'1400'`` or ``'50%'`` (of ``store_all_peak()``).

    Rounds down (a smaller budget is always safe).

    >>> parse_budget("2KiB"), parse_budget("1.5 kB"), parse_budget("50%", lambda: 1630)
    (2048, 1500, 815)
    """
    match = _BUDGET_RE.match(text)
    if match is None:
        raise CLIError(
            f"budget {text!r}: expected a number with a unit (2GiB, 512MiB, 1400) or 50%"
        )
    value, unit = float(match.group(1)), match.group(2)
    if unit == "%":
        if store_all_peak is None:
            raise CLIError(f"budget {text!r}: percentages need a problem with a store-all schedule")
        return int(value / 100 * store_all_peak())
    if unit.lower() not in UNITS and unit != "":
        known = "B, KiB, MiB, GiB, TiB, kB, MB, GB, TB or %"
        raise CLIError(f"budget {text!r}: unknown unit {unit!r} (known: {known})")
    return int(value * UNITS.get(unit.lower(), 1))


def load_file(path: str | Path, what: str = "problem"):
    """``schedir.load`` with one-line errors for missing, unreadable or malformed files."""
    path = Path(path)
    if not path.is_file():
        raise CLIError(f"{path}: no such file")
    try:
        return schedir.load(path)
    except (InvalidProblem, InvalidSchedule) as err:
        raise CLIError(f"{path}: {err}") from None
    except (UnicodeDecodeError, TypeError, KeyError, ValueError) as err:
        raise CLIError(f"{path}: not a schedir {what} file ({type(err).__name__}: {err})") from None


def load_problem(path: str | Path):
    problem = load_file(path)
    if isinstance(problem, schedir.Schedule):
        raise CLIError(f"{path}: this is a schedule, expected a problem (chain, graph, ...)")
    return problem


def load_schedule(path: str | Path) -> schedir.Schedule:
    schedule = load_file(path, "schedule")
    if not isinstance(schedule, schedir.Schedule):
        raise CLIError(f"{path}: this is a {type(schedule).__name__}, expected a schedule")
    return schedule


def parse_options(pairs: list[str]) -> dict:
    """``['model=tight', 'time_limit=10']`` -> ``{'model': 'tight', 'time_limit': 10}``."""
    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise CLIError(f"--option {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what solvers print (even from C, e.g. HiGHS' banner) to stderr, keep stdout clean."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def solve_quietly(problem, budget: int, method: str, options: dict):
    """``solvers.solve`` with CLI errors: unknown method or bad option -> status 2."""
    import solvers

    try:
        with stdout_to_stderr():
            return solvers.solve(problem, budget, method=method, **options)
    except solvers.Infeasible:
        raise
    except (InvalidProblem, InvalidSchedule) as err:
        raise CLIError(str(err)) from None
    except (TypeError, ValueError) as err:
        raise CLIError(f"{method}: {err}") from None


def store_all_reference(problem) -> schedir.Schedule | None:
    """The store-all schedule (no budget) of ``problem``, else of ``problem.chain`` (an
    offloading problem's chain: store-all needs no copies), else None."""
    import solvers

    for candidate in (problem, getattr(problem, "chain", None)):
        if candidate is not None and any(m.name == STORE_ALL for m in solvers.available(candidate)):
            return solve_quietly(candidate, HUGE, STORE_ALL, {})
    return None


def method_names(problem, requested: list[str]) -> list[str]:
    import solvers

    names = [m.name for m in solvers.available(problem)]
    if not requested or requested == ["all"]:
        return names
    for name in requested:
        if name not in names:
            raise CLIError(
                f"unknown method {name!r} for a {type(problem).__name__}; known: {', '.join(names)}"
            )
    return requested


def print_json(obj) -> None:
    print(json.dumps(obj, indent=1, default=lambda v: None if v != v else str(v)))


def bytes_text(n: int) -> str:
    """``'1.37 KiB (1400 B)'``, or ``'900 B'`` below 1 KiB."""
    text = format_bytes(n)
    return text if text.endswith(" B") else f"{text} ({n} B)"


def describe(problem) -> str:
    """``'chain, 6 stages'``, ``'graph, 20 nodes'``, else the problem's class name."""
    kind = type(problem).__name__.lower()
    n = getattr(problem, "length", None)
    if n is not None:
        return f"{kind}, {n} stages"
    try:
        return f"{kind}, {len(problem)} nodes"
    except TypeError:
        return kind

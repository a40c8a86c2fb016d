"""Helpers shared by the ``schedir`` commands (:mod:`schedir_cli.app`, :mod:`schedir_cli.more`).

Budgets in exact integer arithmetic, loading files and checking output paths with
one-line errors, solver options checked against the solvers' signatures, quiet solver
calls, and what each answer is worth (exact, discretized, time-limited). Imports
``solvers`` only inside functions (see :mod:`schedir_cli.app`).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import shutil
import site
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import schedir
from schedir import budget
from schedir.errors import InvalidProblem, InvalidSchedule
from schedir.render import format_bytes
from schedir_cli.schema import record

STORE_ALL = "store_all"
HUGE = 2**62  # "no limit" budget for the store-all reference


class CLIError(Exception):
    """A one-line error with an exit status (2: bad input, 1: infeasible)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------- numbers on the command line


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected a whole number >= 1")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number > 0") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: expected a finite number > 0")
    return value


def parse_budget(text: str, store_all_peak=None) -> int:
    """Bytes from ``'2GiB'``, ``'1.5 MiB'``, ``'1400'`` or ``'50%'`` (of ``store_all_peak()``):
    :func:`schedir.budget.parse_budget`, its error as a :class:`CLIError`.

    >>> parse_budget("2KiB"), parse_budget("1.5 kB"), parse_budget("50%", lambda: 1630)
    (2048, 1500, 815)
    """
    try:
        return budget.parse_budget(text, store_all_peak)
    except budget.BudgetError as err:
        if store_all_peak is None and str(text).strip().endswith("%"):
            raise CLIError(
                f"budget {shorten(text)}: percentages need a problem with a store-all schedule"
            ) from None
        raise CLIError(str(err)) from None


def shorten(text: str, limit: int = 40) -> str:
    """``repr(text)``, cut to about ``limit`` characters for a one-line message."""
    return repr(text) if len(text) <= limit else repr(text[: limit - 3]) + "..."


# ---------------------------------------------------------------- loading files


def load_file(path: str | Path, what: str = "problem"):
    """``schedir.load`` with one-line errors for missing, unreadable or malformed files."""
    path = Path(path)
    if not path.is_file():
        raise CLIError(f"{path}: no such file")
    try:
        return schedir.load(path)
    except (InvalidProblem, InvalidSchedule) as err:
        text = str(err)
        raise CLIError(text if text.startswith(str(path)) else f"{path}: {text}") from None
    except OSError as err:
        raise CLIError(f"{path}: cannot read ({err.strerror or err})") from None
    except (TypeError, KeyError, ValueError) as err:
        raise CLIError(f"{path}: not a schedir {what} file ({type(err).__name__}: {err})") from None


def load_problem(path: str | Path, *, as_graph: bool = False):
    """A problem from ``path``; with ``as_graph``, a chain's graph (``Chain.to_graph()``)."""
    problem = load_file(path)
    if isinstance(problem, schedir.Schedule):
        raise CLIError(f"{path}: this is a schedule, expected a problem (chain, graph, ...)")
    check_magnitudes(problem, path)
    if as_graph:
        if not isinstance(problem, schedir.Chain):
            raise CLIError(f"{path}: --as-graph reads a chain, this is a {type(problem).__name__}")
        try:
            problem = problem.to_graph()
        except (InvalidProblem, ValueError, TypeError) as err:
            raise CLIError(f"{path}: --as-graph: the chain's graph is invalid: {err}") from None
    return problem


def load_schedule(path: str | Path) -> schedir.Schedule:
    schedule = load_file(path, "schedule")
    if not isinstance(schedule, schedir.Schedule):  # every kind's schedule derives from it
        raise CLIError(f"{path}: this is a {type(schedule).__name__}, expected a schedule")
    return schedule


def _numbers(value) -> Iterator[float]:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
        elif isinstance(v, int | float) and not isinstance(v, bool):
            yield v


def check_magnitudes(problem, path) -> None:
    """Refuse a problem whose times or sizes are so large that a schedule's sums could
    overflow a float (a makespan of ``inf`` would be printed as a number).

    Bound: every number may be summed once per op of a schedule, and a schedule has
    at most about as many ops as the problem has numbers squared; we ask for the sum
    of all numbers times their count to be finite.
    """
    count, total = 0, 0.0
    try:
        for v in _numbers(problem.to_dict()):
            count += 1
            total += abs(float(v))
    except OverflowError:
        total = math.inf
    if not math.isfinite(total * max(count, 1) ** 2):
        raise CLIError(
            f"{path}: times or sizes too large: the sums of a schedule would overflow a "
            f"float (the numbers sum to {total:.3g})"
        )


# ---------------------------------------------------------------- output paths


def writable_path(path: str | Path, flag: str, suffixes: tuple[str, ...] = ()) -> Path:
    """Check, before any work, that ``path`` can be written (creating its folders).

    Raises a CLIError naming ``flag`` for a directory, a wrong suffix, a parent that is
    a file, or a location without write permission. Creates nothing.
    """
    path = Path(path)
    if path.is_dir():
        raise CLIError(f"{flag} {path}: is a directory")
    if suffixes and path.suffix.lower() not in suffixes:
        raise CLIError(f"{flag} {path}: unknown file type (use {' or '.join(suffixes)})")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise CLIError(f"{flag} {path}: {parent} is not a directory")
    try:
        if path.exists():
            with open(path, "ab"):
                pass
        elif parent == path.parent:
            with tempfile.NamedTemporaryFile(dir=parent, prefix=".schedir-"):
                pass
        else:  # the folders will be created: can we create one here?
            shutil.rmtree(tempfile.mkdtemp(dir=parent, prefix=".schedir-"))
    except OSError as err:
        raise CLIError(f"{flag} {path}: cannot write ({err.strerror or err})") from None
    return path


def make_parents(path: str | Path) -> None:
    """Create the folders above ``path`` that do not exist, saying so on stderr (stdout
    stays for the answer: ``--json`` output is one object)."""
    parent = Path(path).parent
    if not parent.exists():
        make_folder(parent)


def make_folder(path: str | Path) -> None:
    """Create the folder ``path`` (and its parents) unless it exists, saying so on stderr."""
    path = Path(path)
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        print(f"schedir: created folder {path}", file=sys.stderr)


def writable_dir(path: str | Path, flag: str) -> Path:
    """Like :func:`writable_path` for a folder the command will create or fill."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CLIError(f"{flag} {path}: is a file, expected a folder")
    writable_path(path / ".probe", flag)
    return path


IMAGE = (".png", ".svg", ".pdf")


def docs_page(name: str) -> Path | None:
    """The guide ``docs/NAME``: in the checkout this package runs from, else where a
    wheel installs it (``share/doc/schedir`` under its prefix: a venv, the system or
    the user's base); None when neither has it."""
    root = Path(__file__).resolve().parents[1]
    bases = [root / "docs"] if (root / "pyproject.toml").is_file() else []
    bases += [Path(p) / "share" / "doc" / "schedir" for p in (sys.prefix, site.USER_BASE) if p]
    return next((b / name for b in bases if (b / name).is_file()), None)


# ---------------------------------------------------------------- solver options


def parse_options(pairs: list[str]) -> dict:
    """``['model=tight', 'time_limit=10']`` -> ``{'model': 'tight', 'time_limit': 10}``."""
    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise CLIError(f"--option {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value, parse_constant=_not_a_number)
        except (ValueError, RecursionError):  # not JSON (or NaN): the text itself
            options[key] = value
    return options


def _not_a_number(text: str):
    raise ValueError(f"{text} is not a finite number")


ANY = "**"  # method_options' key for a solver that takes any keyword


def method_options(method) -> dict:
    """A registered method's options and defaults, from its function's signature.

    The first two parameters (problem, budget) and ``progress`` are not options; a
    ``**kwargs`` parameter shows as ``{"**": None}``.
    """
    options = {}
    params = list(inspect.signature(method.function).parameters.values())
    for p in params[2:]:
        if p.name == "progress" or p.kind is p.VAR_POSITIONAL:
            continue
        if p.kind is p.VAR_KEYWORD:
            options[ANY] = None
        else:
            options[p.name] = None if p.default is p.empty else p.default
    return options


def options_per_method(methods: list, options: dict) -> dict[str, dict]:
    """``options`` split by what each method takes; an option no method takes is an error.

    ``methods`` are registry entries (``solvers.Method``).
    """
    taken = {m.name: method_options(m) for m in methods}
    per = {
        m.name: {k: v for k, v in options.items() if k in taken[m.name] or ANY in taken[m.name]}
        for m in methods
    }
    for key in options:
        if not any(key in per[name] for name in per):
            names = [m.name for m in methods]
            lists = "; ".join(
                f"{name}: {', '.join(k for k in opts if k != ANY) or 'none'}"
                for name, opts in taken.items()
            )
            who = names[0] if len(names) == 1 else "any of " + ", ".join(names)
            raise CLIError(f"option {key!r} is not taken by {who} (options: {lists})")
    return per


# ---------------------------------------------------------------- quiet solver calls


@contextlib.contextmanager
def solver_output(verbose: bool) -> Iterator[None]:
    """What solvers print on stdout (even from C: HiGHS' banner) goes to stderr when
    ``verbose``, else nowhere; stdout stays for the command's own output."""
    sys.stdout.flush()
    saved = os.dup(1)
    target = os.dup(2) if verbose else os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(target, 1)
        with warnings.catch_warnings():
            if not verbose:  # e.g. cvxpy's "Solution may be inaccurate": the simulator judges
                warnings.simplefilter("ignore")
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(target)


def _progress_supported() -> bool:
    import solvers

    return "progress" in inspect.signature(solvers.solve).parameters


def without_prefix(method: str, message: str) -> str:
    """``message`` prefixed with ``method: `` once: solvers often name themselves
    (``rotor: ...``, ``pipeline_dp needs ...``), and the name is then not repeated."""
    named = message.startswith((f"{method}:", f"{method} "))
    return message if named else f"{method}: {message}"


def solve_quietly(
    problem, budget: int, method: str, options: dict, *, verbose=False, progress=False
):
    """``solvers.solve`` with CLI errors: bad input or option -> CLIError (status 2).

    ``progress``: passed to ``solvers.solve`` when it accepts it (progress lines on
    stderr for long solves).
    """
    import solvers

    extra = {"progress": True} if progress and _progress_supported() else {}
    try:
        with solver_output(verbose):
            schedule = solvers.solve(problem, budget, method=method, **extra, **options)
    except solvers.Infeasible:
        raise
    except (InvalidProblem, InvalidSchedule, TypeError, ValueError, NotImplementedError) as err:
        # NotImplementedError: a solver refusing an input kind it does not handle
        raise CLIError(without_prefix(method, str(err).splitlines()[0])) from None
    makespan = schedule.meta.get("makespan")
    if isinstance(makespan, float) and not math.isfinite(makespan):
        raise CLIError(
            f"{method}: the makespan overflows a float (the problem's times are too large)"
        )
    return schedule


def store_all_reference(problem) -> schedir.Schedule | None:
    """The store-all schedule (no budget) of ``problem``, else of ``problem.chain`` (an
    offloading problem's chain: store-all needs no copies), else None."""
    import solvers

    for candidate in (problem, getattr(problem, "chain", None)):
        if candidate is not None and any(m.name == STORE_ALL for m in solvers.available(candidate)):
            try:
                return solve_quietly(candidate, HUGE, STORE_ALL, {})
            except solvers.Infeasible as err:  # a peak beyond HUGE: its own least budget
                if err.min_budget is None:
                    raise
                return solve_quietly(candidate, err.min_budget, STORE_ALL, {})
    return None


def file_reference(path, problem, as_graph: bool) -> schedir.Schedule | None:
    """:func:`store_all_reference` of what the file at ``path`` describes: with
    ``--as-graph`` the chain's store-all (the same model without recomputation; the
    graph's own store_all runs the forward of a stage with residuals twice), so that
    the graph methods' overheads compare with the chain methods'."""
    return store_all_reference(load_problem(path) if as_graph else problem)


def reference_makespan(problem, ref: schedir.Schedule | None) -> float | None:
    """The store-all makespan an answer's makespan is compared with (overhead =
    makespan / it - 1): the problem's own, or an offloading problem's chain's (the same
    step on the same device, without copies). None for a pipeline: its makespan covers
    its micro-batches (or items) on several devices, the chain's store-all one item on
    one device (that peak stays the reference of ``50%`` budgets)."""
    if ref is None or isinstance(problem, schedir.PipelineProblem):
        return None
    return ref.meta["makespan"]


def store_all_record(ref: schedir.Schedule | None, base: float | None) -> dict | None:
    """The ``store_all`` record of a ``--json`` answer (docs/formats.md): the reference
    schedule's peak and ``base`` (:func:`reference_makespan`); None without one."""
    if ref is None:
        return None
    return record("store_all", makespan=base, peak_memory=ref.meta["peak_memory"])


def method_entries(problem, requested: list[str]) -> list:
    """Registry entries of the ``requested`` names (all for ``[]`` or ``['all']``)."""
    import solvers

    entries = {m.name: m for m in solvers.available(problem)}
    if not requested or requested == ["all"]:
        return list(entries.values())
    for name in requested:
        if name not in entries:
            raise CLIError(
                f"unknown method {name!r} for a {type(problem).__name__}; "
                f"known: {', '.join(entries)}"
                + ("; a chain's graph methods need --as-graph" if _graph_only(name) else "")
            )
    return [entries[name] for name in requested]


def _graph_only(name: str) -> bool:
    import solvers

    return any(m.name == name and m.problem is schedir.Graph for m in solvers.available())


def method_names(problem, requested: list[str]) -> list[str]:
    return [m.name for m in method_entries(problem, requested)]


# ---------------------------------------------------------------- printing


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no infinity; callers print "no schedule" as null on purpose
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def print_json(obj) -> None:
    print(json.dumps(_json_safe(obj), indent=1, allow_nan=False, default=str))


def bytes_text(n: int) -> str:
    """``'1.37 KiB (1400 B)'``, or ``'900 B'`` below 1 KiB."""
    text = format_bytes(n)
    return text if text.endswith(" B") else f"{text} ({n} B)"


def kind_name(problem) -> str:
    """``'chain'``, ``'graph'``, ...: the kind of a problem (an instance or its class), as
    every command prints it (``schedir.kind`` names; else the class name, lowercase)."""
    found = schedir.kind.of(problem)
    cls = problem if isinstance(problem, type) else type(problem)
    return found.name if found is not None else cls.__name__.lower()


def describe(problem) -> str:
    """``'chain, 6 stages'``, ``'graph, 20 nodes'``: the problem's kind and its size."""
    kind = kind_name(problem)
    n = getattr(problem, "length", None)
    if n is not None:
        return f"{kind}, {n} stages"
    try:
        return f"{kind}, {len(problem)} nodes"
    except TypeError:
        return kind

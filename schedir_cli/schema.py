"""The versioned shapes of the ``--json`` answers (docs/formats.md#command-line-answers).

Every answer is one JSON object with ``format`` (``schedir.cli.solve``, ...) and
``version`` (:data:`VERSION`), then the fields of its record, every one always present
(``null`` where it does not apply). :func:`answer` builds an answer from a command's
fields (refusing a missing or unknown one: the shape cannot drift from this file);
:func:`check` validates an answer read back (the tests run it on every command's
answer; a consumer may too). A field's type is a JSON type (``int``, ``number``,
``string``, ``bool``, ``object``), a record name, or ``list[...]`` of one, with ``?``
when it may be ``null``. Adding a field is version 1 still; renaming or removing one,
or changing its type, is version 2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VERSION = 1
PREFIX = "schedir.cli."


@dataclass(frozen=True)
class Field:
    """One key of a record: its name, type (see the module docstring) and meaning."""

    name: str
    type: str
    doc: str
    pattern: str = ""  # a string's form, a regular expression (empty: any)


STATUS = "ok|infeasible|error|internal"
LABEL = r"optimal|fixed|heuristic|no bound|<=\d+\.\d+%"

STORE_ALL = (
    Field("makespan", "number?", "store-all's makespan, s (null for a pipeline: its makespan "
          "covers several devices)"),
    Field("peak_memory", "int", "store-all's peak, bytes (the reference of `50%` budgets)"),
)  # fmt: skip

QUALITY = (
    Field("label", "string?", "what the answer is worth, as in the text: `optimal`, `<=X%`, "
          "`fixed`, `heuristic` or `no bound` (null without a schedule)", LABEL),
    Field("exact", "bool", "the label is `optimal`"),
    Field("fixed", "bool", "the method returns one fixed schedule whatever the budget"),
    Field("lower_bound", "number?", "a proven lower bound on the optimum of the method's "
          "model, s"),
    Field("gap", "number?", "makespan / lower_bound - 1 (0: optimal; null: no bound known)"),
)  # fmt: skip

RESULT = (
    Field("method", "string", "the solver's name"),
    Field("options", "object", "the solver options given to it"),
    Field("status", "string", "`ok`; `infeasible` (no schedule fits); `error` (a bad option "
          "for this method); `internal` (a solver bug)", STATUS),
    Field("message", "string?", "the one-line reason when the status is not `ok`"),
    *QUALITY,
    Field("makespan", "number?", "simulated makespan, s"),
    Field("peak_memory", "int?", "simulated peak, bytes"),
    Field("overhead", "number?", "makespan / store-all makespan - 1"),
    Field("time_limited", "bool", "a time limit stopped the solver"),
    Field("slot_size", "int?", "the discretization slot, bytes (null: not discretized)"),
    Field("solve_time", "number?", "seconds"),
    Field("ops", "int?", "ops in the schedule"),
    Field("min_budget", "int?", "infeasible: the method's least budget, bytes (null: "
          "not known)"),
    Field("detail", "string?", "infeasible: the solver's explanation"),
)  # fmt: skip

HEAD = (
    Field("problem", "string", "the problem file, as given"),
    Field("kind", "string", "the problem kind solved (`chain`, `graph`, ...; `graph` with "
          "`--as-graph`), as in the text output"),
    Field("as_graph", "bool", "`--as-graph`: a chain solved as its graph"),
)  # fmt: skip

SOLVE = (
    *HEAD,
    Field("budget", "int", "bytes"),
    Field("store_all", "store_all?", "the reference (with `--as-graph`: the chain's); null "
          "when the kind has no store-all"),
    Field("results", "list[result]", "one per method (one for `--method M`, every "
          "applicable method for `--method all`)"),
)  # fmt: skip

TRACE = (
    Field("start", "list[number]", "each op's start, s"),
    Field("end", "list[number]", "each op's end, s"),
    Field("op_peak", "list[int]", "memory while each op runs, bytes"),
    Field("resident", "list[int]", "memory after each op, bytes"),
)

SIMULATE = (
    Field("problem", "string", "the problem file, as given"),
    Field("schedule", "string", "the schedule file, as given"),
    Field("kind", "string", "the problem kind simulated, as in the text output"),
    Field("makespan", "number", "s"),
    Field("peak_memory", "int", "bytes"),
    Field("ops", "int", "ops in the schedule"),
    Field("budget", "int?", "the schedule's budget (its meta), bytes"),
    Field("fits", "bool?", "peak_memory <= budget (null without a budget)"),
    Field("trace", "trace?", "per op, with `--trace`"),
)

POINT = (
    Field("budget", "int", "bytes"),
    Field("method", "string", "the solver's name"),
    Field("makespan", "number?", "s (null: no schedule at this budget)"),
    Field("overhead", "number?", "makespan / store-all makespan - 1"),
    *QUALITY,
)

TRADEOFF = (
    *HEAD,
    Field("store_all", "store_all?", "as in `schedir.cli.solve`"),
    Field("budgets", "list[int]", "the budgets, bytes, ascending"),
    Field("points", "list[point]", "one per (method, budget), methods in order"),
)

METHOD = (
    Field("method", "string", "the solver's name"),
    Field("kind", "string", "the problem kind it reads"),
    Field("label", "string", "`optimal` (an exact method), `fixed` or `heuristic`",
          "optimal|fixed|heuristic"),
    Field("exact", "bool", "the method returns an optimum of its model"),
    Field("fixed", "bool", "one fixed schedule whatever the budget"),
    Field("options", "object", "its options and their defaults"),
    Field("any_option", "bool", "it takes any KEY=VALUE besides"),
    Field("description", "string", "one line"),
)  # fmt: skip

METHODS = (
    Field("problem", "string?", "the problem file (null: every registered method)"),
    Field("kind", "string?", "its kind"),
    Field("as_graph", "bool", "the methods of the chain's graph"),
    Field("methods", "list[method]", "grouped by kind"),
)

RECORDS: dict[str, tuple[Field, ...]] = {
    "solve": SOLVE,
    "simulate": SIMULATE,
    "tradeoff": TRADEOFF,
    "methods": METHODS,
    "result": RESULT,
    "store_all": STORE_ALL,
    "trace": TRACE,
    "point": POINT,
    "method": METHOD,
}
COMMANDS = ("solve", "simulate", "tradeoff", "methods")  # records that are whole answers


def answer(command: str, **fields) -> dict:
    """The answer of ``command``: ``format``, ``version``, then its fields in the
    record's order. A missing or unknown field is a bug of the command (ValueError)."""
    names = [f.name for f in RECORDS[command]]
    missing, unknown = set(names) - set(fields), set(fields) - set(names)
    if missing or unknown:
        raise ValueError(f"{command} answer: missing {sorted(missing)}, unknown {sorted(unknown)}")
    return {"format": PREFIX + command, "version": VERSION, **{n: fields[n] for n in names}}


def record(name: str, **fields) -> dict:
    """A nested record (``result``, ``point``, ...) with exactly its fields, in order."""
    names = [f.name for f in RECORDS[name]]
    if set(fields) != set(names):
        raise ValueError(f"{name} record: fields {sorted(fields)}, expected {sorted(names)}")
    return {n: fields[n] for n in names}


_JSON = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
}


def check(value: dict) -> None:
    """Raise ValueError naming the first field of ``value`` (a parsed ``--json``
    answer) that its format's record does not allow; None when it follows it."""
    if not isinstance(value, dict):
        raise ValueError(f"answer: expected an object, got {type(value).__name__}")
    tag, version = value.get("format"), value.get("version")
    command = tag[len(PREFIX) :] if isinstance(tag, str) and tag.startswith(PREFIX) else None
    if command not in COMMANDS:
        raise ValueError(f"format = {tag!r}: expected one of {[PREFIX + c for c in COMMANDS]}")
    if version != VERSION:
        raise ValueError(f"{tag}: version = {version!r}: expected {VERSION}")
    _check_record(command, {k: v for k, v in value.items() if k not in ("format", "version")})


def _check_record(name: str, value, where: str = "") -> None:
    fields = RECORDS[name]
    if not isinstance(value, dict):
        raise ValueError(f"{where or name}: expected an object")
    extra = set(value) - {f.name for f in fields}
    if extra:
        raise ValueError(f"{where or name}: unknown field {sorted(extra)[0]!r}")
    for f in fields:
        path = f"{where}.{f.name}" if where else f.name
        if f.name not in value:
            raise ValueError(f"{path}: missing")
        _check_value(f.type, value[f.name], path)
        text = value[f.name]
        if f.pattern and text is not None and not re.fullmatch(f.pattern, text):
            raise ValueError(f"{path} = {text!r}: expected {f.pattern}")


def _check_value(kind: str, value, path: str) -> None:
    if kind.endswith("?"):
        if value is None:
            return
        kind = kind[:-1]
    if kind.startswith("list[") and kind.endswith("]"):
        if not isinstance(value, list):
            raise ValueError(f"{path} = {value!r}: expected a list")
        for i, item in enumerate(value):
            _check_value(kind[5:-1], item, f"{path}[{i}]")
    elif kind in RECORDS:
        _check_record(kind, value, path)
    elif not _JSON[kind](value):
        raise ValueError(f"{path} = {value!r}: expected {kind}")

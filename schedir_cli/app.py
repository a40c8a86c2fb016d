"""The ``schedir`` command line: solve, simulate, show, tradeoff, methods, profile, experiments.

    schedir solve PROBLEM.json --budget 2GiB --method rotor [--out sched.json] [--json]
    schedir solve PROBLEM.json --budget 50% --method all        # compare every method
    schedir solve CHAIN.json --budget 50% --as-graph --method checkmate_milp
    schedir simulate PROBLEM.json SCHED.json
    schedir show SCHED.json [--problem PROBLEM.json] [--out sched.png|sched.svg]
    schedir tradeoff PROBLEM.json [--method rotor ...] [--plot curve.png] [--csv curve.csv]
    schedir methods [PROBLEM.json]
    schedir profile --model demo --out problem.json
    schedir experiments [--quick] [NAME ...]
    schedir launch --processes N [--devices-per-process K] -- python script.py ARGS

Budgets take units (B, KiB, MiB, GiB, TiB; kB, MB, GB, TB are powers of 1000) or a
percentage of the store-all peak (``50%``), computed exactly. Errors are one line on
stderr (the traceback only with ``--debug``); exit status 0 on success, 1 when no
schedule fits the budget (or an experiment failed), 2 for bad input (files, methods,
budgets, options, output paths), 3 for an internal error (a bug: please report it).

Imports: this module imports only ``schedir`` and the standard library at import time.
``solvers`` (which imports cvxpy) and ``jax_exec`` (jax, flax) are imported inside the
command functions that need them, so that bad input fails in milliseconds, before
JAX is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import schedir
from schedir.errors import InvalidSchedule
from schedir.render import format_bytes, format_time
from schedir_cli.answers import (
    LEGEND,
    answer_quality,
    infeasible_detail,
    infeasible_text,
    quality_text,
)
from schedir_cli.common import (
    IMAGE,
    CLIError,
    bytes_text,
    describe,
    docs_page,
    file_reference,
    kind_name,
    load_problem,
    load_schedule,
    make_parents,
    method_entries,
    options_per_method,
    parse_budget,
    parse_options,
    positive_int,
    print_json,
    reference_makespan,
    solve_quietly,
    store_all_record,
    writable_path,
)
from schedir_cli.more import add_more_commands
from schedir_cli.schema import RECORDS, answer, record

__all__ = ["CLIError", "build_parser", "main", "parse_budget"]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("schedir").strip()
        raise CLIError(f"{command + ': ' if command else ''}{message} (see --help)")


# ---------------------------------------------------------------- solve


def cmd_solve(args: argparse.Namespace) -> int:
    problem = load_problem(args.problem, as_graph=args.as_graph)
    options = parse_options(args.option)
    parse_budget(args.budget, lambda: 0)  # bad budgets fail before solvers are imported
    compare = args.method == "all"
    if compare and (args.out or args.plot or args.show):
        raise CLIError("--out, --plot and --show need one method, not --method all")
    if args.out:
        writable_path(args.out, "--out")
    if args.plot:
        writable_path(args.plot, "--plot", IMAGE)
    entries = method_entries(problem, [args.method])
    per_method = options_per_method(entries, options)
    ref = file_reference(args.problem, problem, args.as_graph)
    base = reference_makespan(problem, ref)
    budget = parse_budget(args.budget, (lambda: ref.meta["peak_memory"]) if ref else None)
    head = {
        "problem": str(args.problem),
        "kind": kind_name(problem),
        "as_graph": args.as_graph,
        "budget": budget,
        "store_all": store_all_record(ref, base),
    }
    results, schedule = [], None
    for entry in entries:
        row, schedule = _solve_one(problem, budget, entry, per_method[entry.name], base, args)
        if not compare and row["status"] != "ok":
            if args.json:  # the JSON answer first, then the one-line error
                print_json(answer("solve", **head, results=[row]))
            raise CLIError(row["message"], 1 if row["status"] == "infeasible" else 2)
        results.append(row)
    if not compare:
        _write_outputs(args, problem, schedule)
    if args.json:
        print_json(answer("solve", **head, results=results))
    elif compare:
        _print_table(args.problem, problem, budget, head["store_all"], results, args.as_graph)
    else:
        _print_one(args, problem, budget, base, results[0], schedule)
    bugs = [r["method"] for r in results if r["status"] == "internal"]
    if bugs:  # the table is out; still an internal error
        raise CLIError(f"internal error in {', '.join(bugs)} (a bug: rerun with --debug)", 3)
    return 0 if any(r["status"] == "ok" for r in results) else 1


def _solve_one(problem, budget: int, entry, options: dict, base, args) -> tuple[dict, object]:
    """One method's ``result`` record (status ok / infeasible / error / internal) and
    its schedule (or None)."""
    import solvers

    row: dict = dict.fromkeys(f.name for f in RECORDS["result"])  # null: does not apply
    row.update(method=entry.name, options=options, status="ok", exact=False)
    row.update(fixed=entry.fixed, time_limited=False)
    try:
        schedule = solve_quietly(
            problem, budget, entry.name, options, verbose=args.verbose, progress=not args.quiet
        )
    except solvers.Infeasible as err:
        row.update(
            status="infeasible",
            min_budget=err.min_budget,
            detail=infeasible_detail(err),
            message=infeasible_text(err, budget),
        )
        return record("result", **row), None
    except CLIError as err:
        row.update(status="error", message=str(err))
        return record("result", **row), None
    except Exception as err:  # noqa: BLE001 - a solver bug: one row of the table, exit 3
        if args.method != "all" or args.debug:
            raise
        text = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
        row.update(status="internal", message=f"internal error: {text}")
        return record("result", **row), None
    meta = schedule.meta
    row.update(
        answer_quality(meta, entry.exact, entry.fixed),
        makespan=meta["makespan"],
        peak_memory=meta["peak_memory"],
        overhead=meta["makespan"] / base - 1 if base else None,
        solve_time=meta["solve_time"],
        ops=len(schedule),
    )
    return record("result", **row), schedule


def _write_outputs(args, problem, schedule) -> None:
    if args.out:
        out = Path(args.out)
        rel = os.path.relpath(Path(args.problem).resolve(), out.resolve().parent)
        if rel.startswith(".."):  # outside the schedule's folder: absolute is clearer
            rel = str(Path(args.problem).resolve())
        extra = {"problem": rel, **({"as_graph": True} if args.as_graph else {})}
        schedule = dataclasses.replace(schedule, meta={**schedule.meta, **extra})
        make_parents(out)
        schedir.save(schedule, out)
    if args.plot:
        _plot(problem, schedule, args.plot)


def _print_one(args, problem, budget: int, base, r: dict, schedule) -> None:
    of = " of the chain" if args.as_graph else ""
    over = f" ({r['overhead']:+.1%} vs store-all{of} {format_time(base)})" if base else ""
    view = " as a graph" if args.as_graph else ""
    print(
        f"{r['method']} on {args.problem}{view} ({describe(problem)}), budget {bytes_text(budget)}"
    )
    print(f"makespan  {format_time(r['makespan'])}{over}")
    print(f"quality   {quality_text(r['method'], r)}")
    print(f"peak      {bytes_text(r['peak_memory'])}")
    print(f"solve     {format_time(r['solve_time'])}, {r['ops']} ops")
    for path in (args.out, args.plot):
        if path:
            print(f"wrote {path}")
    if args.show:
        print(_render_text(problem, schedule, args.width))


def _print_table(path, problem, budget: int, ref: dict | None, results: list, as_graph) -> None:
    print(f"{path} ({describe(problem)}), budget {bytes_text(budget)}")
    if ref and ref["makespan"] is None:  # a pipeline: the chain on one device, one item
        print(f"store-all peak of the chain on one device: {format_bytes(ref['peak_memory'])}")
    elif ref:
        print(
            f"store-all{' of the chain' if as_graph else ''}: makespan "
            f"{format_time(ref['makespan'])}, peak {format_bytes(ref['peak_memory'])}"
        )
    w = max([16] + [len(r["method"]) + 1 for r in results])
    q = max([10] + [len(r["label"] or "") + 2 for r in results])
    header = (
        f"{'method':<{w}}{'quality':<{q}}{'makespan':>10}{'overhead':>10}{'peak':>12}{'solve':>11}"
    )
    print(header)
    print("-" * len(header))
    ok = [r for r in results if r["status"] == "ok"]
    best = min((r["makespan"] for r in ok), default=None)
    for r in results:
        if r["status"] == "ok":
            over = f"{r['overhead']:+.1%}" if r["overhead"] is not None else "-"
            star = " *" if r["makespan"] <= best * (1 + 1e-12) else ""
            print(
                f"{r['method']:<{w}}{r['label']:<{q}}{format_time(r['makespan']):>10}"
                f"{over:>10}{format_bytes(r['peak_memory']):>12}"
                f"{format_time(r['solve_time']):>11}{star}"
            )
        elif r["status"] == "infeasible":
            least = r["min_budget"] is not None
            need = f" (needs {format_bytes(r['min_budget'])})" if least else ""
            if least:
                print(f"{r['method']:<{w}}{'':<{q}}infeasible{need}")
            else:  # nothing proven: say what the solver says
                print(f"{r['method']:<{w}}{'':<{q}}no schedule: {r['detail'] or 'no reason given'}")
        else:  # a bad option for this method, or (status internal) a solver bug
            prefix = "" if r["status"] == "internal" else "error: "
            print(f"{r['method']:<{w}}{'':<{q}}{prefix}{r['message']}")
    print(f"* fastest; overhead: makespan / store-all makespan - 1; quality:\n{LEGEND}")


def _render_text(problem, schedule, width: int) -> str:
    from schedir import render

    try:
        return render.text(problem, schedule, width=width)
    except TypeError as err:  # a schedule class without a lanes function
        raise CLIError(str(err)) from None


def _plot(problem, schedule, path) -> None:
    from schedir import render

    make_parents(path)
    try:
        render.plot(problem, schedule, path)
    except (TypeError, ValueError) as err:
        raise CLIError(str(err)) from None


# ---------------------------------------------------------------- simulate, show


def _simulate(problem, schedule):
    try:
        return schedir.simulate(problem, schedule)
    except InvalidSchedule as err:
        hint = ""
        if isinstance(problem, schedir.Chain) and isinstance(schedule, schedir.GraphSchedule):
            hint = " (a schedule solved with --as-graph: pass --as-graph here too)"
        raise CLIError(f"invalid schedule: {err}{hint}") from None
    except (TypeError, ValueError, OverflowError) as err:
        raise CLIError(str(err).splitlines()[0] if str(err) else type(err).__name__) from None


def _finite_trace(trace, what) -> None:
    import math

    if not math.isfinite(trace.makespan):
        raise CLIError(f"{what}: the makespan overflows a float: the problem's times are too large")


def cmd_simulate(args: argparse.Namespace) -> int:
    schedule = load_schedule(args.schedule)
    as_graph = args.as_graph or schedule.meta.get("as_graph") is True
    problem = load_problem(args.problem, as_graph=as_graph)
    trace = _simulate(problem, schedule)
    _finite_trace(trace, args.schedule)
    per_op = ("start", "end", "op_peak", "resident")
    if args.trace and not all(hasattr(trace, k) for k in (*per_op, "ops")):
        raise CLIError(
            f"--trace lists each op's start, end and memory; a {type(trace).__name__} "
            "has no such list (use --json for what it has)"
        )
    budget = schedule.meta.get("budget")
    fits = None if budget is None else trace.peak_memory <= budget
    if args.json:
        per = {k: list(getattr(trace, k)) for k in per_op} if args.trace else None
        print_json(
            answer(
                "simulate",
                problem=str(args.problem),
                schedule=str(args.schedule),
                kind=kind_name(problem),
                makespan=trace.makespan,
                peak_memory=trace.peak_memory,
                ops=len(schedule),
                budget=budget,
                fits=fits,
                trace=per and record("trace", **per),
            )
        )
        return 0
    print(f"{args.schedule} on {args.problem} ({describe(problem)}): {len(schedule)} ops")
    print(f"makespan  {format_time(trace.makespan)}")
    verdict = "" if fits is None else f" (budget {format_bytes(budget)}: "
    verdict += "" if fits is None else ("fits)" if fits else "EXCEEDED)")
    print(f"peak      {bytes_text(trace.peak_memory)}{verdict}")
    if args.trace:
        print(f"{'#':>5} {'op':<14}{'start':>11}{'end':>11}{'op peak':>13}{'resident':>13}")
        for i, op in enumerate(trace.ops):
            print(
                f"{i:>5} {str(op):<14}{trace.start[i]:>11.4g}{trace.end[i]:>11.4g}"
                f"{trace.op_peak[i]:>13}{trace.resident[i]:>13}"
            )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    schedule = load_schedule(args.schedule)
    if args.out:
        writable_path(args.out, "--out", IMAGE)
    problem_path = args.problem
    if problem_path is None:
        stored = schedule.meta.get("problem")
        if stored is None:
            raise CLIError(f"{args.schedule}: no problem stored in its meta; pass --problem")
        if not isinstance(stored, str):
            raise CLIError(f"{args.schedule}: meta.problem = {stored!r}: expected a path")
        problem_path = Path(args.schedule).resolve().parent / stored
    as_graph = args.as_graph or schedule.meta.get("as_graph") is True
    problem = load_problem(problem_path, as_graph=as_graph)
    _finite_trace(_simulate(problem, schedule), args.schedule)
    print(_render_text(problem, schedule, args.width))
    if args.out:
        _plot(problem, schedule, args.out)
        print(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------- parser and main


def _docs() -> str:
    page = docs_page("cli.md")
    return str(page) if page else "docs/cli.md of the source (not installed here)"


def _version() -> str:
    return f"schedir {schedir.__version__}"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="schedir",
        description="Memory-bounded training schedules: solve, compare, simulate, render.",
        epilog=f"--debug (anywhere): show tracebacks.\nDocs: {_docs()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # a path stays on one line
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")
    solver_flags = _Parser(add_help=False)
    solver_flags.add_argument(
        "--as-graph", action="store_true", help="solve a chain's graph (Chain.to_graph())"
    )
    solver_flags.add_argument(
        "--verbose", "-v", action="store_true", help="show the solvers' own output (stderr)"
    )
    solver_flags.add_argument(
        "--quiet", "-q", action="store_true", help="no progress lines on long solves"
    )

    p = sub.add_parser(
        "solve", help="solve a problem under a memory budget", parents=[solver_flags]
    )
    p.add_argument("problem", help="problem JSON (chain, graph, ...)")
    p.add_argument("--budget", "-b", required=True, help="2GiB, 512MiB, 1400 (bytes) or 50%%")
    p.add_argument("--method", "-m", default="rotor", help="a solver name, or 'all' (table)")
    p.add_argument(
        "--option",
        "-o",
        action="append",
        metavar="KEY=VALUE",
        help="solver option, value parsed as JSON (repeatable); with --method all, given "
        "to the methods that take it (see schedir methods)",
    )
    p.add_argument("--out", help="write the schedule JSON here (with the problem's path)")
    p.add_argument("--plot", help="render the schedule to this PNG/SVG")
    p.add_argument("--show", action="store_true", help="print the text rendering")
    p.add_argument("--width", type=positive_int, default=80, help="columns of the rendering")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("simulate", help="simulate a schedule on a problem")
    p.add_argument("problem")
    p.add_argument("schedule")
    p.add_argument("--as-graph", action="store_true", help="simulate on the chain's graph")
    p.add_argument("--trace", action="store_true", help="print every op")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("show", help="render a schedule: ops per resource, memory under them")
    p.add_argument("schedule")
    p.add_argument("--problem", help="problem JSON (default: the path stored by solve --out)")
    p.add_argument("--as-graph", action="store_true", help="the problem is a chain's graph")
    p.add_argument("--out", help="also write a PNG or SVG")
    p.add_argument("--width", type=positive_int, default=80)
    p.set_defaults(func=cmd_show)

    add_more_commands(sub, solver_flags)
    from schedir_cli.launch import add_launch_command  # stdlib only; kept out of import time

    add_launch_command(sub)
    return parser


def one_line(text: str) -> str:
    """``text`` with control characters escaped (a file's ``"a\\nb"`` key stays one line)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (``python -m schedir_cli`` exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # ``--debug`` is schedir's anywhere before a ``--`` (after it, the launched command's)
    cut = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:cut]
    argv = [a for a in argv[:cut] if a != "--debug"] + argv[cut:]
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.debug = debug
        if args.command is None:  # `schedir` alone: the help, not a usage error
            parser.print_help()
            return 0
        return args.func(args)
    except SystemExit as exit_:  # --help, --version
        return exit_.code if isinstance(exit_.code, int) else 0
    except CLIError as err:
        if debug:
            raise
        print(f"schedir: error: {one_line(str(err))}", file=sys.stderr)
        return err.status
    except BrokenPipeError:  # e.g. `schedir ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("schedir: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - one line unless --debug
        if debug:
            raise
        if type(err).__name__ == "Infeasible":
            print(f"schedir: error: {one_line(str(err))}", file=sys.stderr)
            return 1
        line = one_line((str(err).splitlines() or [""])[0])
        print(
            f"schedir: internal error: {type(err).__name__}: {line} (a bug: please report it "
            "with the output of --debug)",
            file=sys.stderr,
        )
        return 3

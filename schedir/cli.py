"""The ``schedir`` command line: solve, simulate, show, tradeoff, profile, experiments.

    schedir solve PROBLEM.json --budget 2GiB --method rotor [--out sched.json] [--json]
    schedir solve PROBLEM.json --budget 50% --method all        # compare every method
    schedir simulate PROBLEM.json SCHED.json
    schedir show SCHED.json [--problem PROBLEM.json] [--out sched.png|sched.svg]
    schedir tradeoff PROBLEM.json [--method rotor ...] [--plot curve.png] [--csv curve.csv]
    schedir profile --model demo --out problem.json
    schedir experiments [--quick] [NAME ...]

Budgets take units (B, KiB, MiB, GiB, TiB; kB, MB, GB, TB are powers of 1000) or a
percentage of the store-all peak (``50%``). Errors are one line on stderr (the
traceback only with ``--debug``); exit status 0 on success, 1 when no schedule fits
the budget (or an experiment failed), 2 for bad input (files, methods, budgets,
options), 3 for an internal error.

Imports: this module imports only ``schedir`` and the standard library at import time.
``solvers`` (which imports cvxpy) and ``jax_exec`` (jax, flax) are imported inside the
command functions that need them, so ``import schedir`` stays light and the
dependency direction ``jax_exec -> solvers -> schedir`` holds for the library.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import schedir
from schedir.cli_common import (
    CLIError,
    bytes_text,
    describe,
    load_problem,
    load_schedule,
    method_names,
    parse_budget,
    parse_options,
    print_json,
    solve_quietly,
    store_all_reference,
)
from schedir.cli_more import MODELS, cmd_experiments, cmd_profile, cmd_tradeoff
from schedir.errors import InvalidSchedule
from schedir.render import format_bytes, format_time

__all__ = ["CLIError", "build_parser", "main", "parse_budget"]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("schedir").strip()
        raise CLIError(f"{command + ': ' if command else ''}{message} (see --help)")


# ---------------------------------------------------------------- commands


def cmd_solve(args: argparse.Namespace) -> int:
    import solvers

    problem = load_problem(args.problem)
    options = parse_options(args.option)
    parse_budget(args.budget, lambda: 0)  # bad budgets fail before solvers are imported
    ref = store_all_reference(problem)
    base = ref.meta["makespan"] if ref is not None else None
    budget = parse_budget(args.budget, (lambda: ref.meta["peak_memory"]) if ref else None)
    methods = method_names(problem, [args.method])
    compare = args.method == "all"
    if compare and (args.out or args.plot or args.show):
        raise CLIError("--out, --plot and --show need one method, not --method all")
    head = {
        "problem": str(args.problem),
        "kind": type(problem).__name__,
        "budget": budget,
        "store_all": None
        if ref is None
        else {"makespan": base, "peak_memory": ref.meta["peak_memory"]},
    }
    results, schedule = [], None
    for name in methods:
        row = {
            "method": name,
            "exact": next(m.exact for m in solvers.available(problem) if m.name == name),
        }
        try:
            schedule = solve_quietly(problem, budget, name, {} if compare else options)
        except solvers.Infeasible as err:
            if not compare:
                least = f"; the least is {bytes_text(err.min_budget)}"
                hint = least if err.min_budget is not None else ""
                fail = CLIError(f"{name}: no schedule fits {bytes_text(budget)}{hint}", 1)
                if args.json:  # the JSON answer first, then the one-line error
                    print_json({**head, **row, "status": "infeasible",
                                "min_budget": err.min_budget})  # fmt: skip
                raise fail from None
            row.update(status="infeasible", min_budget=err.min_budget)
        except CLIError as err:
            if not compare:
                raise
            row.update(status="error", message=str(err))
        else:
            meta = schedule.meta
            row.update(
                status="ok",
                makespan=meta["makespan"],
                peak_memory=meta["peak_memory"],
                overhead=meta["makespan"] / base - 1 if base else None,
                solve_time=meta["solve_time"],
                ops=len(schedule.ops),
            )
        results.append(row)
    if not compare:
        assert schedule is not None
        if args.out:
            out = Path(args.out)
            rel = os.path.relpath(Path(args.problem).resolve(), out.resolve().parent)
            if rel.startswith(".."):  # outside the schedule's folder: absolute is clearer
                rel = str(Path(args.problem).resolve())
            schedule = type(schedule)(schedule.ops, {**schedule.meta, "problem": rel})
            out.parent.mkdir(parents=True, exist_ok=True)
            schedir.save(schedule, out)
        if args.plot:
            _plot(problem, schedule, args.plot)
    if args.json:
        print_json({**head, "results": results} if compare else {**head, **results[0]})
    elif compare:
        _print_table(args.problem, problem, budget, head["store_all"], results)
    else:
        r = results[0]
        over = f" ({r['overhead']:+.1%} vs store-all {format_time(base)})" if base else ""
        print(f"{r['method']} on {args.problem} ({describe(problem)}), budget {bytes_text(budget)}")
        print(f"makespan  {format_time(r['makespan'])}{over}")
        print(f"peak      {bytes_text(r['peak_memory'])}")
        print(f"solve     {format_time(r['solve_time'])}, {r['ops']} ops")
        if args.out:
            print(f"wrote {args.out}")
        if args.plot:
            print(f"wrote {args.plot}")
        if args.show:
            from schedir import render

            print(render.text(problem, schedule, width=args.width))
    return 0 if any(r["status"] == "ok" for r in results) else 1


def _print_table(path, problem, budget: int, ref: dict | None, results: list[dict]) -> None:
    print(f"{path} ({describe(problem)}), budget {bytes_text(budget)}")
    if ref:
        print(
            f"store-all: makespan {format_time(ref['makespan'])}, "
            f"peak {format_bytes(ref['peak_memory'])}"
        )
    header = f"{'method':<16}{'exact':>6}{'makespan':>12}{'overhead':>10}{'peak':>12}{'solve':>11}"
    print(header)
    print("-" * len(header))
    ok = [r for r in results if r["status"] == "ok"]
    best = min((r["makespan"] for r in ok), default=None)
    for r in results:
        exact = "yes" if r["exact"] else ""
        if r["status"] == "ok":
            over = f"{r['overhead']:+.1%}" if r["overhead"] is not None else "-"
            star = " *" if r["makespan"] <= best * (1 + 1e-12) else ""
            print(
                f"{r['method']:<16}{exact:>6}{format_time(r['makespan']):>12}{over:>10}"
                f"{format_bytes(r['peak_memory']):>12}{format_time(r['solve_time']):>11}{star}"
            )
        elif r["status"] == "infeasible":
            least = f" (needs {format_bytes(r['min_budget'])})" if r["min_budget"] else ""
            print(f"{r['method']:<16}{exact:>6}  infeasible{least}")
        else:
            print(f"{r['method']:<16}{exact:>6}  error: {r['message']}")
    print("* fastest; overhead: makespan / store-all makespan - 1")


def _plot(problem, schedule, path) -> None:
    from schedir import render

    try:
        render.plot(problem, schedule, path)
    except ValueError as err:
        raise CLIError(str(err)) from None


def _simulate(problem, schedule):
    try:
        return schedir.simulate(problem, schedule)
    except InvalidSchedule as err:
        raise CLIError(f"invalid schedule: {err}") from None
    except TypeError as err:
        raise CLIError(str(err)) from None


def cmd_simulate(args: argparse.Namespace) -> int:
    problem = load_problem(args.problem)
    schedule = load_schedule(args.schedule)
    trace = _simulate(problem, schedule)
    budget = schedule.meta.get("budget")
    if args.json:
        out = {
            "makespan": trace.makespan,
            "peak_memory": trace.peak_memory,
            "ops": len(schedule.ops),
            "budget": budget,
        }
        if args.trace:
            out["trace"] = {
                k: list(getattr(trace, k)) for k in ("start", "end", "op_peak", "resident")
            }
        print_json(out)
        return 0
    print(f"{args.schedule} on {args.problem} ({describe(problem)}): {len(schedule.ops)} ops")
    print(f"makespan  {format_time(trace.makespan)}")
    fits = ""
    if budget is not None:
        verdict = "fits" if trace.peak_memory <= budget else "EXCEEDED"
        fits = f" (budget {format_bytes(budget)}: {verdict})"
    print(f"peak      {bytes_text(trace.peak_memory)}{fits}")
    if args.trace:
        print(f"{'#':>5} {'op':<14}{'start':>11}{'end':>11}{'op peak':>13}{'resident':>13}")
        for i, op in enumerate(trace.ops):
            print(
                f"{i:>5} {str(op):<14}{trace.start[i]:>11.4g}{trace.end[i]:>11.4g}"
                f"{trace.op_peak[i]:>13}{trace.resident[i]:>13}"
            )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from schedir import render

    schedule = load_schedule(args.schedule)
    problem_path = args.problem
    if problem_path is None:
        stored = schedule.meta.get("problem")
        if stored is None:
            raise CLIError(f"{args.schedule}: no problem stored in its meta; pass --problem")
        problem_path = Path(args.schedule).resolve().parent / stored
    problem = load_problem(problem_path)
    trace = _simulate(problem, schedule)
    print(render.text(problem, schedule, width=args.width, trace=trace))
    if args.out:
        _plot(problem, schedule, args.out)
        print(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------- parser and main


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="schedir",
        description="Memory-bounded training schedules.",
        epilog="--debug (anywhere): show tracebacks.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("solve", help="solve a problem under a memory budget")
    p.add_argument("problem", help="problem JSON (chain, graph, ...)")
    p.add_argument("--budget", "-b", required=True, help="2GiB, 512MiB, 1400 (bytes) or 50%%")
    p.add_argument("--method", "-m", default="rotor", help="a solver name, or 'all' (table)")
    p.add_argument(
        "--option",
        "-o",
        action="append",
        metavar="KEY=VALUE",
        help="solver option, value parsed as JSON (repeatable)",
    )
    p.add_argument("--out", help="write the schedule JSON here (with the problem's path)")
    p.add_argument("--plot", help="render the schedule to this PNG/SVG")
    p.add_argument("--show", action="store_true", help="print the text rendering")
    p.add_argument("--width", type=int, default=80, help="columns of the text rendering")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("simulate", help="simulate a schedule on a problem")
    p.add_argument("problem")
    p.add_argument("schedule")
    p.add_argument("--trace", action="store_true", help="print every op")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("show", help="render a schedule: ops per resource, memory under them")
    p.add_argument("schedule")
    p.add_argument("--problem", help="problem JSON (default: the path stored by solve --out)")
    p.add_argument("--out", help="also write a PNG or SVG")
    p.add_argument("--width", type=int, default=80)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("tradeoff", help="makespan versus budget for several methods")
    p.add_argument("problem")
    p.add_argument("--method", "-m", action="append", default=[], help="repeatable; default all")
    p.add_argument("--points", type=int, default=12)
    p.add_argument("--from", dest="low", help="lowest budget (default: least feasible)")
    p.add_argument("--to", dest="high", help="highest budget (default: store-all peak)")
    p.add_argument("--plot", help="PNG/SVG of the curves")
    p.add_argument("--csv", help="CSV of (budget, method, makespan, overhead)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tradeoff)

    p = sub.add_parser("profile", help="profile a bundled Flax model into a chain JSON")
    p.add_argument("--model", default="demo", help=f"one of {', '.join(MODELS)}")
    p.add_argument("--depth", type=int, help="number of blocks")
    p.add_argument("--batch", type=int)
    p.add_argument(
        "--timing",
        choices=["flops", "measure"],
        default="flops",
        help="flops: deterministic times at 1e11 FLOP/s; measure: wall time",
    )
    p.add_argument("--out", default="problem.json")
    p.add_argument("--list", action="store_true", help="list the models")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("experiments", help="run paper_experiments/*.py, write results/REPORT.md")
    p.add_argument("names", nargs="*", metavar="NAME", help="default: every experiment")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="results")
    p.add_argument("--dir", default="paper_experiments", help="the experiment scripts")
    p.add_argument("--timeout", type=float, help="seconds per experiment")
    p.set_defaults(func=cmd_experiments)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (``python -m schedir`` exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except CLIError as err:
        if debug:
            raise
        print(f"schedir: error: {err}", file=sys.stderr)
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
            print(f"schedir: error: {err}", file=sys.stderr)
            return 1
        line = str(err).splitlines()[0] if str(err) else ""
        print(
            f"schedir: internal error: {type(err).__name__}: {line} (rerun with --debug)",
            file=sys.stderr,
        )
        return 3

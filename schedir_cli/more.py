"""``schedir tradeoff``, ``methods``, ``profile`` and ``experiments`` (see :mod:`schedir_cli.app`).

``solvers``, ``jax_exec`` and matplotlib are imported inside the command functions.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import inspect
import math
from pathlib import Path

import schedir
from schedir.render import byte_unit, format_bytes, format_time, time_unit
from schedir_cli.answers import (
    FIXED,
    HEURISTIC,
    OPTIMAL,
    answer_quality,
    bound_text,
    method_label,
)
from schedir_cli.common import (
    ANY,
    IMAGE,
    CLIError,
    describe,
    file_reference,
    kind_name,
    load_problem,
    make_folder,
    make_parents,
    method_entries,
    method_options,
    parse_budget,
    positive_float,
    positive_int,
    print_json,
    reference_makespan,
    solve_quietly,
    solver_output,
    store_all_record,
    without_prefix,
    writable_dir,
    writable_path,
)
from schedir_cli.schema import answer, record

# ---------------------------------------------------------------- tradeoff


def cmd_tradeoff(args: argparse.Namespace) -> int:
    problem = load_problem(args.problem, as_graph=args.as_graph)
    if args.plot:
        writable_path(args.plot, "--plot", IMAGE)
    if args.csv:
        writable_path(args.csv, "--csv", (".csv",))
    for text in (args.low, args.high):
        if text:
            parse_budget(text, lambda: 0)  # bad budgets fail before any solve
    entries = method_entries(problem, args.method)
    ref = file_reference(args.problem, problem, args.as_graph)
    if ref is None and (args.high is None or args.low is None):
        raise CLIError("this problem has no store_all method: give --from and --to")
    peak_fn = (lambda: ref.meta["peak_memory"]) if ref else None
    high = parse_budget(args.high, peak_fn) if args.high else ref.meta["peak_memory"]
    low = parse_budget(args.low, peak_fn) if args.low else _least_budget(problem, entries, args)
    if low > high:
        raise CLIError(f"empty budget range {low}..{high} B")
    n = args.points - 1
    budgets = sorted({low + (high - low) * i // n for i in range(args.points)})
    base = reference_makespan(problem, ref)
    curves = {entry.name: _curve(problem, budgets, entry, args) for entry in entries}
    labels = {entry.name: method_label(entry.exact, entry.fixed) for entry in entries}
    points = [
        record(
            "point",
            budget=b,
            method=name,
            **cell,
            overhead=None if not base or cell["makespan"] is None else cell["makespan"] / base - 1,
        )
        for name, cells in curves.items()
        for b, cell in zip(budgets, cells, strict=True)
    ]
    if args.csv:
        _write_csv(args.csv, points)
    if args.plot:
        _plot_tradeoff(budgets, curves, base, args.plot, str(args.problem), labels)
    if args.json:
        print_json(
            answer(
                "tradeoff",
                problem=str(args.problem),
                kind=kind_name(problem),
                as_graph=args.as_graph,
                store_all=store_all_record(ref, base),
                budgets=budgets,
                points=points,
            )
        )
        return 0
    _print_tradeoff(args.problem, problem, budgets, curves, base, labels, args.as_graph)
    for path in (args.csv, args.plot):
        if path:
            print(f"wrote {path}")
    return 0


def _least_budget(problem, entries, args) -> int:
    """The least budget any of ``entries`` reports (their Infeasible.min_budget at 0)."""
    import solvers

    least = []
    for entry in entries:
        try:
            solve_quietly(problem, 0, entry.name, {}, verbose=args.verbose)
            least.append(0)
        except solvers.Infeasible as err:
            if err.min_budget is not None:
                least.append(err.min_budget)
        except CLIError:
            continue  # this method cannot say; the others set the range
    return min(least, default=0)


def _curve(problem, budgets: list[int], entry, args) -> list[dict]:
    """Per budget: makespan (None: no schedule) and the answer's quality (label, exact,
    fixed, lower_bound, gap)."""
    import solvers

    extra = {}
    if not args.quiet and "progress" in inspect.signature(solvers.tradeoff).parameters:
        extra["progress"] = True
    try:
        with solver_output(args.verbose):
            curve = solvers.tradeoff(problem, budgets, entry.name, **extra)
    except solvers.Infeasible as err:
        raise CLIError(str(err)) from None
    except (TypeError, ValueError, NotImplementedError) as err:
        raise CLIError(without_prefix(entry.name, str(err).splitlines()[0])) from None
    exact = getattr(curve, "exact", None)
    bounds = getattr(curve, "lower_bounds", None)
    if exact is None:  # before Tradeoff reported exactness per budget: what we know
        claimed = entry.exact and curve.slot_size is None
        claimed = claimed and "time_limit" not in method_options(entry)
        exact = (claimed,) * len(budgets)
    cells = []
    for i, value in enumerate(curve.makespans):
        meta = {"makespan": value, "exact": bool(exact[i])}
        if curve.slot_size is not None and not exact[i]:
            meta["discretization"] = {"slot_size": curve.slot_size}
        if bounds is not None:
            meta["lower_bound"] = bounds[i]
            if "discretization" in meta:
                meta["discretization"]["lower_bound"] = bounds[i]
        if not math.isfinite(value) and curve.slot_size is not None:
            # a discretized table may miss the lowest budgets: solve those one by one
            with contextlib.suppress(solvers.Infeasible):
                meta = solve_quietly(problem, budgets[i], entry.name, {}, verbose=args.verbose).meta
        cells.append(_cell(meta, entry))
    return cells


QUALITY = ("label", "exact", "fixed", "lower_bound", "gap")  # of a point (schedir_cli.schema)


def _cell(meta: dict, entry) -> dict:
    makespan = meta["makespan"]
    if not math.isfinite(makespan):  # inf: the method has no schedule at this budget
        none = {"label": None, "exact": False, "fixed": entry.fixed, "lower_bound": None}
        return {"makespan": None, **none, "gap": None}
    quality = answer_quality(meta, entry.exact, entry.fixed)
    return {"makespan": makespan, **{k: quality[k] for k in QUALITY}}


def _write_csv(path, rows: list[dict]) -> None:
    fields = ["budget", "method", "makespan", "overhead", *QUALITY]
    make_parents(path)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)


def _not_optimal_note(name: str, cells: list[dict]) -> str | None:
    """``rotor: not proven optimal at 5 of 12 budgets; <=2.2%`` (None when all are)."""
    solved = [c for c in cells if c["makespan"] is not None]
    loose = [c for c in solved if not c["exact"]]
    if not loose:
        return None
    gaps = [c["gap"] for c in loose]
    bound = bound_text(max(gaps)) if None not in gaps else "no bound known"
    return f"{name}: not proven optimal at {len(loose)} of {len(solved)} budgets; {bound}"


def _print_tradeoff(path, problem, budgets, curves: dict, base, labels: dict, as_graph) -> None:
    of = "of the chain " if as_graph else ""
    print(
        f"{path} ({describe(problem)}): makespan "
        f"{'overhead vs store-all ' + of + format_time(base) + ' ' if base else ''}by budget"
    )
    width = max(11, *(len(m) + 2 for m in curves))
    print(f"{'budget':>12}" + "".join(f"{m:>{width}}" for m in curves))
    for i, b in enumerate(budgets):
        cells = []
        for name in curves:
            c = curves[name][i]
            v = c["makespan"]
            text = "-" if v is None else f"{v / base - 1:+.1%}" if base else format_time(v)
            cells.append(text + ("" if v is None or c["exact"] else "~"))
        print(f"{format_bytes(b):>12}" + "".join(f"{c:>{width}}" for c in cells))
    print("-: no schedule at this budget; ~: not proven optimal (an upper bound on the optimum)")
    for name, cells in curves.items():
        note = _not_optimal_note(name, cells) if labels[name] == OPTIMAL else None
        if note:
            print(note)
    for label, what in (
        (FIXED, "one schedule whatever the budget"),
        (HEURISTIC, "no optimality claim"),
    ):
        names = [name for name in curves if labels[name] == label]
        if names:
            print(f"{label} ({what}): {', '.join(names)}")


def _plot_tradeoff(budgets, curves: dict, base, path, title: str, labels: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bscale, bunit = byte_unit(max(budgets))
    finite = [c["makespan"] for cells in curves.values() for c in cells if c["makespan"]]
    tscale, tunit = time_unit(max(finite, default=1.0))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, cells in curves.items():
        pts = [(b, c["makespan"]) for b, c in zip(budgets, cells, strict=True) if c["makespan"]]
        if pts:
            x, y = zip(*pts, strict=True)
            y = [100 * (v / base - 1) for v in y] if base else [v / tscale for v in y]
            if labels[name] == OPTIMAL:
                note = _not_optimal_note(name, cells)
                label = name if note is None else f"{name} ({note.split(': ', 1)[1]})"
            else:
                label = f"{name} ({labels[name]})"
            ax.step([v / bscale for v in x], y, where="post", marker=".", label=label)
    ax.set_xlabel(f"memory budget ({bunit})")
    ax.set_ylabel("makespan overhead vs store-all (%)" if base else f"makespan ({tunit})")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    make_parents(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- methods


def cmd_methods(args: argparse.Namespace) -> int:
    import solvers

    problem = None
    if args.problem:
        problem = load_problem(args.problem, as_graph=args.as_graph)
        entries = solvers.available(problem)
        title = f"methods for {args.problem} ({describe(problem)})"
    else:
        if args.as_graph:
            raise CLIError("--as-graph needs a PROBLEM")
        entries = solvers.available()
        title = "every registered method, by problem kind"
    listing = [
        record(
            "method",
            method=m.name,
            kind=kind_name(m.problem),
            label=method_label(m.exact, m.fixed),
            exact=m.exact,
            fixed=m.fixed,
            options={k: v for k, v in method_options(m).items() if k != ANY},
            any_option=ANY in method_options(m),
            description=m.description,
        )
        for m in entries
    ]
    if args.json:
        print_json(
            answer(
                "methods",
                problem=args.problem,
                kind=None if problem is None else kind_name(problem),
                as_graph=args.as_graph,
                methods=listing,
            )
        )
        return 0
    print(title)
    width = max([18] + [len(item["method"]) + 2 for item in listing])
    for kind in dict.fromkeys(item["kind"] for item in listing):
        print(f"\n{kind}:")
        for item in (i for i in listing if i["kind"] == kind):
            print(f"  {item['method']:<{width}}{item['label']:<11}{item['description']}")
            opts = ", ".join(f"{k}={v!r}" for k, v in item["options"].items())
            opts += ", any KEY=VALUE" if item["any_option"] else ""
            print(f"  {'':<{width}}{'':<11}options: {opts or 'none'}")
    print(
        "\noptimal: the method returns an optimum of its model (each answer says whether it "
        "is one: a\ndiscretized or time-limited answer gives its bound); fixed: one schedule "
        "whatever the budget;\nheuristic: no optimality claim. Options: -o KEY=VALUE."
    )
    return 0


# ---------------------------------------------------------------- profile

# Bundled example models: name -> (description, default depth).
MODELS = {
    "demo": ("the transformer of examples/demo.py: dim 64, 4 heads, 64 tokens, batch 32", 12),
    "transformer": ("examples/profiles/transformer.json: dim 128, 4 heads, batch 32", 16),
    "mlp": ("examples/profiles/mlp_mixer_like.json: residual MLP, width 256, batch 512", 24),
}


def cmd_profile(args: argparse.Namespace) -> int:
    if args.list:
        for name, (text, depth) in MODELS.items():
            print(f"{name:<12} depth {depth:<3} {text}")
        return 0
    if args.model not in MODELS:
        raise CLIError(f"unknown model {args.model!r}; known: {', '.join(MODELS)}")
    writable_path(args.out, "--out")
    import jax

    import jax_exec
    from schedir_cli.models import mlp_stack, mse_loss, transformer_stack

    depth = args.depth if args.depth is not None else MODELS[args.model][1]
    kx, ky = jax.random.split(jax.random.key(0))
    if args.model == "demo":
        batch = args.batch or 32
        layers = transformer_stack(depth, 64, 4, 256, 16, 8, seed=0)
        x, y = jax.random.normal(kx, (batch, 64, 16)), jax.random.normal(ky, (batch, 8))
    elif args.model == "transformer":
        batch = args.batch or 32
        layers = transformer_stack(depth, 128, 4, 512, 32, 10)
        x, y = jax.random.normal(kx, (batch, 64, 32)), jax.random.normal(ky, (batch, 10))
    else:
        batch = args.batch or 512
        layers = mlp_stack(depth, 256, 1024, 64, 10)
        x, y = jax.random.normal(kx, (batch, 64)), jax.random.normal(ky, (batch, 10))
    chain = jax_exec.stages.profile(
        layers, mse_loss, x, y, timing=args.timing, flops_per_second=1e11
    )
    make_parents(args.out)
    schedir.save(chain, args.out)
    print(
        f"{args.model}: {chain.length} stages, batch {batch}, a_0 {format_bytes(chain.in_size[0])},"
        f" store-all time {format_time(chain.store_all_time())} ({args.timing}) -> {args.out}"
    )
    return 0


# ---------------------------------------------------------------- experiments


def default_experiments_dir() -> Path | None:
    """``paper_experiments/`` of the checkout this package runs from, else of the cwd;
    None when neither has one (an installed wheel ships no experiment scripts)."""
    for candidate in (Path(__file__).resolve().parents[1], Path.cwd()):
        if (candidate / "paper_experiments").is_dir():
            return candidate / "paper_experiments"
    return None


def cmd_experiments(args: argparse.Namespace) -> int:
    from schedir_cli import report

    directory = Path(args.dir) if args.dir else default_experiments_dir()
    if directory is None:
        raise CLIError(
            "experiments: the experiment scripts (paper_experiments/) come with a checkout "
            "of the repository, not with the installed package: run this from a checkout, "
            "or pass --dir FOLDER"
        )
    try:
        names = report.find_experiments(directory, args.names)
    except ValueError as err:
        raise CLIError(str(err)) from None
    writable_dir(args.out, "--out")
    make_folder(args.out)
    failed = report.run_all(
        names, directory, Path(args.out), quick=args.quick, timeout=args.timeout
    )
    return 1 if failed else 0


# ---------------------------------------------------------------- parsers


def add_more_commands(sub, solver_flags: argparse.ArgumentParser) -> None:
    """Add tradeoff, methods, profile and experiments to the subparsers ``sub``."""
    p = sub.add_parser(
        "tradeoff", help="makespan versus budget for several methods", parents=[solver_flags]
    )
    p.add_argument("problem")
    p.add_argument("--method", "-m", action="append", default=[], help="repeatable; default all")
    p.add_argument("--points", type=_points, default=12, help="budgets (at least 2)")
    p.add_argument("--from", dest="low", help="lowest budget (default: least feasible)")
    p.add_argument("--to", dest="high", help="highest budget (default: store-all peak)")
    p.add_argument("--plot", help="PNG/SVG of the curves")
    p.add_argument("--csv", help="CSV of (budget, method, makespan, overhead, exact, ...)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tradeoff)

    p = sub.add_parser("methods", help="the solvers: problem kind, exactness, options")
    p.add_argument("problem", nargs="?", help="only the methods that read this problem")
    p.add_argument("--as-graph", action="store_true", help="the methods of the chain's graph")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("profile", help="profile a bundled Flax model into a chain JSON")
    p.add_argument("--model", default="demo", help=f"one of {', '.join(MODELS)}")
    p.add_argument("--depth", type=positive_int, help="number of blocks")
    p.add_argument("--batch", type=positive_int, help="batch size")
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
    p.add_argument("--dir", help="the experiment scripts (default: this checkout's)")
    p.add_argument("--timeout", type=positive_float, help="seconds per experiment")
    p.set_defaults(func=cmd_experiments)


def _points(text: str) -> int:
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{value}: expected at least 2 budgets")
    return value

"""``schedir tradeoff``, ``schedir profile`` and ``schedir experiments`` (see :mod:`schedir.cli`).

``solvers``, ``jax_exec`` and matplotlib are imported inside the command functions.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
from pathlib import Path

import schedir
from schedir.cli_common import (
    CLIError,
    describe,
    load_problem,
    method_names,
    parse_budget,
    print_json,
    solve_quietly,
    stdout_to_stderr,
    store_all_reference,
)
from schedir.render import format_bytes, format_time


def cmd_tradeoff(args: argparse.Namespace) -> int:
    import solvers

    problem = load_problem(args.problem)
    methods = method_names(problem, args.method)
    ref = store_all_reference(problem)
    if ref is None and (args.high is None or args.low is None):
        raise CLIError("this problem has no store_all method: give --from and --to")
    peak_fn = (lambda: ref.meta["peak_memory"]) if ref else None
    high = parse_budget(args.high, peak_fn) if args.high else ref.meta["peak_memory"]
    if args.low:
        low = parse_budget(args.low, peak_fn)
    else:
        least = []
        for name in methods:
            try:
                solve_quietly(problem, 0, name, {})
                least.append(0)
            except solvers.Infeasible as err:
                if err.min_budget is not None:
                    least.append(err.min_budget)
        low = min(least, default=0)
    if args.points < 2 or low > high:
        raise CLIError(f"empty budget range {low}..{high} B ({args.points} points)")
    budgets = sorted(
        {round(low + (high - low) * i / (args.points - 1)) for i in range(args.points)}
    )
    base = ref.meta["makespan"] if ref else None
    curves = {}
    for name in methods:
        try:
            with stdout_to_stderr():
                curve = solvers.tradeoff(problem, budgets, name)
        except (TypeError, ValueError) as err:
            raise CLIError(f"{name}: {err}") from None
        values = list(curve.makespans)
        if curve.slot_size is not None:  # a discretized table may miss the lowest budgets
            for i, b in enumerate(budgets):
                if not math.isfinite(values[i]):
                    with contextlib.suppress(solvers.Infeasible):
                        values[i] = solve_quietly(problem, b, name, {}).meta["makespan"]
        curves[name] = tuple(values)
    rows = [
        {
            "budget": b,
            "method": m,
            "makespan": curves[m][i],
            "overhead": curves[m][i] / base - 1 if base and math.isfinite(curves[m][i]) else None,
        }
        for m in methods
        for i, b in enumerate(budgets)
    ]
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["budget", "method", "makespan", "overhead"])
            writer.writeheader()
            writer.writerows(rows)
    if args.plot:
        _plot_tradeoff(budgets, curves, base, args.plot, str(args.problem))
    if args.json:
        print_json(
            {
                "problem": str(args.problem),
                "store_all_makespan": base,
                "rows": [
                    {**r, "makespan": r["makespan"] if math.isfinite(r["makespan"]) else None}
                    for r in rows
                ],
            }
        )
        return 0
    print(
        f"{args.problem} ({describe(problem)}): makespan "
        f"{'overhead vs store-all ' + format_time(base) + ' ' if base else ''}by budget"
    )
    width = max(10, *(len(m) + 2 for m in methods))
    print(f"{'budget':>12}" + "".join(f"{m:>{width}}" for m in methods))
    for i, b in enumerate(budgets):
        cells = []
        for m in methods:
            v = curves[m][i]
            cells.append(
                "-" if not math.isfinite(v) else f"{v / base - 1:+.1%}" if base else format_time(v)
            )
        print(f"{format_bytes(b):>12}" + "".join(f"{c:>{width}}" for c in cells))
    print("-: no schedule at this budget")
    for path in (args.csv, args.plot):
        if path:
            print(f"wrote {path}")
    return 0


def _plot_tradeoff(budgets, curves: dict, base, path, title: str) -> None:
    if Path(path).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise CLIError(f"{path}: unknown image type (use .png or .svg)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for method, values in curves.items():
        pts = [(b, v) for b, v in zip(budgets, values, strict=True) if math.isfinite(v)]
        if pts:
            x, y = zip(*pts, strict=True)
            y = [100 * (v / base - 1) for v in y] if base else list(y)
            ax.step([v / 2**20 for v in x], y, where="post", marker=".", label=method)
    ax.set_xlabel("memory budget (MiB)")
    ax.set_ylabel("makespan overhead vs store-all (%)" if base else "makespan (s)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    import jax

    import jax_exec
    from jax_exec.models import mlp_stack, mse_loss, transformer_stack

    depth = args.depth if args.depth is not None else MODELS[args.model][1]
    if depth < 1:
        raise CLIError(f"--depth {depth}: expected >= 1")
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
    chain = jax_exec.profile(layers, mse_loss, x, y, timing=args.timing, flops_per_second=1e11)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    schedir.save(chain, args.out)
    print(
        f"{args.model}: {chain.length} stages, batch {batch}, a_0 {format_bytes(chain.in_size[0])},"
        f" store-all time {format_time(chain.store_all_time())} ({args.timing}) -> {args.out}"
    )
    return 0


def cmd_experiments(args: argparse.Namespace) -> int:
    from schedir import report

    directory = Path(args.dir)
    try:
        names = report.find_experiments(directory, args.names)
    except ValueError as err:
        raise CLIError(str(err)) from None
    failed = report.run_all(
        names, directory, Path(args.out), quick=args.quick, timeout=args.timeout
    )
    return 1 if failed else 0

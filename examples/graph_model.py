"""A DAG model (skip adds and a long concat skip) as a ``schedir.Graph``: profile it,
solve with every graph method at three budgets, run each schedule op by op, compare.

The model is ``schedir_cli.models.residual_dag``: an embedding, residual MLP
blocks whose skip adds are separate nodes, and a head reading the concatenation of
the last block and the embedding. ``profile_graph`` turns it into a graph with
measured times and exact bytes; every graph method (store_all, chen_sqrt, dtr,
checkmate_lp, checkmate_milp) is solved at store-all's peak, halfway down and 10%
above DTR's least budget; ``run_graph`` executes each schedule with explicit buffers.
The table shows predicted and measured peak (bytes: always equal), predicted makespan
and measured time (the sum of the Compute ops' times, median of ``--repeats`` runs:
``profile_graph`` times each node's Compute in the same runtime, so they should agree
up to noise; Free ops are not in the model), and the gradient error against plain
``jax.value_and_grad`` of the same DAG as a fraction of the tolerance
atol + rtol |g| (1e-6, 1e-5): at most 1 means equal.

Run: ``.venv/bin/python examples/graph_model.py [--depth N] [--width W] [--repeats R]
[--quick] [--out DIR]`` (about a minute; ``--quick``: a small model, one run each;
``--out``: also write ``DIR/graph_model.csv``).
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

import jax
import numpy as np

import schedir
import solvers
from jax_exec.graph.model import dag_loss, dag_params
from jax_exec.graph.profile import profile_graph
from jax_exec.graph.runtime import run_graph
from schedir_cli.models import mse_loss, residual_dag

METHODS = ("store_all", "chen_sqrt", "dtr", "checkmate_lp", "checkmate_milp")


def tolerance_ratio(got: dict, want: dict, rtol: float = 1e-5, atol: float = 1e-6) -> float:
    """max |got - want| / (atol + rtol |want|) over all gradients: <= 1 means allclose."""
    worst = 0.0
    for name in want:
        for a, b in zip(
            jax.tree_util.tree_leaves(got[name]), jax.tree_util.tree_leaves(want[name]), strict=True
        ):
            a, b = np.asarray(a), np.asarray(b)
            worst = max(worst, float(np.max(np.abs(a - b) / (atol + rtol * np.abs(b)))))
    return worst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="runs per schedule (median)")
    parser.add_argument("--quick", action="store_true", help="a small model, one run each")
    parser.add_argument("--out", type=Path, default=None, help="also write DIR/graph_model.csv")
    args = parser.parse_args(argv)
    if args.quick:
        args.depth, args.width, args.batch, args.repeats = 1, 16, 8, 1
    rows = []

    nodes = residual_dag(args.depth, args.width, 4 * args.width, 32, 8, seed=0)
    kx, ky = jax.random.split(jax.random.key(0))
    inputs = {"x": jax.random.normal(kx, (args.batch, 32))}
    y = jax.random.normal(ky, (args.batch, 8))

    graph = profile_graph(nodes, mse_loss, inputs, y, timing="measure")
    print(f"graph: {len(graph)} nodes ({sum(n.kind == 'forward' for n in graph.nodes)} forward)")
    _, ref = jax.jit(jax.value_and_grad(dag_loss(nodes, mse_loss)))(dag_params(nodes), inputs, y)

    peak = schedir.simulate(graph, solvers.solve(graph, 10**15, method="store_all")).peak_memory
    try:
        solvers.solve(graph, 1, method="dtr")
    except solvers.Infeasible as err:
        least = err.min_budget
    budgets = (peak, (peak + least) // 2, least + (peak - least) // 10)

    print(f"{'method':>15} {'budget':>9} {'pred peak':>10} {'meas peak':>10} "
          f"{'pred ms':>8} {'meas ms':>8} {'ratio':>6} {'grad tol':>9}")  # fmt: skip
    schedules = []
    for method in METHODS:  # solve everything first: no solver runs between timed steps
        for budget in budgets:
            try:
                options = {"time_limit": 20} if method == "checkmate_milp" else {}
                schedules.append((method, budget, solvers.solve(graph, budget, method=method,
                                                                 **options)))  # fmt: skip
            except solvers.Infeasible:
                schedules.append((method, budget, None))
    for method, budget, schedule in schedules:
        if schedule is None:
            print(f"{method:>15} {budget:>9} {'infeasible':>10}")
            rows.append({"method": method, "budget": budget, "status": "infeasible"})
            continue
        trace = schedir.simulate(graph, schedule)
        times = []
        for _ in range(args.repeats):
            result = run_graph(nodes, mse_loss, graph, schedule, inputs, y)
            assert result.resident_bytes == trace.resident  # exact, op by op
            pairs = zip(result.op_times, result.op_kernels, strict=True)
            times.append(sum(t for t, kernel in pairs if kernel))  # Compute ops only
        measured = statistics.median(times)
        print(
            f"{method:>15} {budget:>9} {trace.peak_memory:>10} {result.peak_bytes:>10} "
            f"{1e3 * trace.makespan:>8.3f} {1e3 * measured:>8.3f} "
            f"{measured / trace.makespan:>6.2f} {tolerance_ratio(result.grads, ref):>9.3f}"
        )
        rows.append({"method": method, "budget": budget, "status": "ok",
                     "predicted_peak": trace.peak_memory, "measured_peak": result.peak_bytes,
                     "predicted_s": trace.makespan, "measured_s": measured,
                     "grad_tolerance_ratio": tolerance_ratio(result.grads, ref)})  # fmt: skip
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        fields = ["method", "budget", "status", "predicted_peak", "measured_peak",
                  "predicted_s", "measured_s", "grad_tolerance_ratio"]  # fmt: skip
        with open(args.out / "graph_model.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows({k: r.get(k, "") for k in fields} for r in rows)


if __name__ == "__main__":
    main()

"""Graph solvers side by side (issue 5): exact MILP, LP rounding, DTR, baselines, rotor.

On chains (as graphs, with rotor on the chain itself) and on graphs with skip
connections of growing size, at several budgets (``fraction`` f: budget =
least + f * (peak - least), between DTR's least budget and the store-all peak),
record solve time and makespan overhead (makespan / store-all time - 1; on chains
the chain's store-all time, for every method) of checkmate_milp, checkmate_lp, dtr,
chen_sqrt, store_all and, on chains, rotor (``model="tight"``, the exact optimum of
persistent chain schedules). Writes ``graph_solvers.csv`` and ``graph_solvers.png``
under ``--out``. ``--chain-table`` prints docs/graphs.md's table of rotor against the
graph methods on chains instead.

    python paper_experiments/graph_solvers.py --quick
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import solvers  # noqa: E402
from schedir import Chain, Graph, chain_to_graph, plot_style, simulate  # noqa: E402
from schedir.graph.convert import dropped_recorded_inputs  # noqa: E402
from schedir.graph.generators import skip_graph  # noqa: E402
from solvers.graph.baselines import (  # noqa: E402
    chen_sqrt_graph,
    store_all_graph,
    store_all_graph_ops,
)
from solvers.graph.checkmate_lp import checkmate_lp  # noqa: E402
from solvers.graph.checkmate_milp import checkmate_milp  # noqa: E402
from solvers.graph.dtr import dtr, dtr_min_budget  # noqa: E402

FIELDS = ["family", "size", "nodes", "fraction", "budget", "method", "status", "makespan",
          "overhead", "solve_time", "peak", "exact", "extra"]  # fmt: skip


def make_chain(L: int, seed: int, residuals: bool = True) -> Chain:
    """A random chain: fwd 1-3 s, bwd 2-6 s, sizes 4-19 bytes, residuals 1-9 bytes per
    stage (none without ``residuals``)."""
    rng = np.random.default_rng(seed)
    x = [int(v) for v in rng.integers(4, 20, L + 1)]
    extra = rng.integers(1, 10, L) if residuals else np.zeros(L, dtype=int)
    return Chain.from_rotor(
        [round(float(v), 3) for v in rng.uniform(1, 3, L)],
        [round(float(v), 3) for v in rng.uniform(2, 6, L + 1)],
        x,
        [0, *(x[k + 1] + int(extra[k]) for k in range(L))],
        [0] * L,
        [0] * (L + 1),
    )


def run_graph(g: Graph, budget: int, time_limit: float, chain: Chain | None) -> list[dict]:
    rows = []
    methods = {
        "checkmate_milp": lambda: checkmate_milp(g, budget, time_limit=time_limit),
        "checkmate_lp": lambda: checkmate_lp(g, budget, time_limit=time_limit),
        "dtr": lambda: dtr(g, budget),
        "chen_sqrt": lambda: chen_sqrt_graph(g, budget),
        "store_all": lambda: store_all_graph(g, budget),
    }
    if chain is not None:
        methods["rotor"] = lambda: solvers.solve(chain, budget, method="rotor", model="tight")
    for name, fn in methods.items():
        start = time.perf_counter()
        try:
            s = fn()
        except solvers.Infeasible as err:
            rows.append({"method": name, "status": "infeasible", "extra": err.min_budget,
                         "solve_time": time.perf_counter() - start})  # fmt: skip
            continue
        elapsed = time.perf_counter() - start
        trace = simulate(chain if name == "rotor" else g, s)
        extra = {"checkmate_milp": "mip_gap", "checkmate_lp": "lp_bound"}.get(name)
        rows.append(
            {
                "method": name,
                "status": "ok",
                "makespan": trace.makespan,
                "peak": trace.peak_memory,
                "solve_time": elapsed,
                "exact": s.meta.get("exact", ""),
                "extra": s.meta.get(extra) if extra else "",
            }
        )
    return rows


def scale_rows(limit: float) -> list[dict]:
    """checkmate_lp on a 100-node and checkmate_milp on a 30-node residual graph (family
    "scale"), the sizes at which Checkmate reports solve times."""
    rows = []
    for layers, method, fractions in ((49, "checkmate_lp", (0.9, 0.7, 0.5)),
                                      (14, "checkmate_milp", (0.5, 0.3))):  # fmt: skip
        g = skip_graph(layers, skip=2, seed=layers)
        top, least = simulate(g, store_all_graph_ops(g)).peak_memory, dtr_min_budget(g)
        for fraction in fractions:
            budget = int(least + fraction * (top - least))
            start = time.perf_counter()
            try:
                fn = checkmate_lp if method == "checkmate_lp" else checkmate_milp
                s = fn(g, budget, time_limit=limit)
                trace = simulate(g, s)
                extra = s.meta.get("lp_bound" if method == "checkmate_lp" else "mip_gap")
                overhead = trace.makespan / g.store_all_time() - 1
                r = {"status": "ok", "makespan": trace.makespan, "peak": trace.peak_memory,
                     "overhead": overhead, "extra": extra}  # fmt: skip
            except solvers.Infeasible:
                r = {"status": "infeasible"}
            r.update(family="scale", size=layers, nodes=len(g), fraction=fraction, budget=budget,
                     method=method, solve_time=time.perf_counter() - start)  # fmt: skip
            print(f"scale {len(g)} nodes {method} {fraction} {r['status']} "
                  f"time={r['solve_time']:.1f}s", flush=True)  # fmt: skip
            rows.append(r)
    return rows


def chain_table() -> None:
    """Rotor (tight) against checkmate_milp and dtr on the chain's graph: markdown."""
    print("| L | residuals | budget | rotor | MILP | DTR | MILP drops an input | MILP time |")
    print("|---|---|---|---|---|---|---|---|")
    for L in (4, 6, 8):
        for res in (False, True):
            chain = make_chain(L, seed=L, residuals=res)
            g = chain_to_graph(chain)
            top = solvers.solve(chain, 10**9, method="store_all").meta["peak_memory"]
            for f in (1.0, 0.8, 0.6):
                b = int(top * f)
                got, drops, milp_time = {}, "-", 0.0
                for method in ("rotor", "checkmate_milp", "dtr"):
                    problem, opts = (chain, {"model": "tight"}) if method == "rotor" else (g, {})
                    start = time.perf_counter()
                    try:
                        s = solvers.solve(problem, b, method=method, **opts)
                        got[method] = f"{s.meta['makespan']:.3f}"
                        if method == "checkmate_milp":
                            drops = "yes" if dropped_recorded_inputs(chain, s.ops) else "no"
                    except solvers.Infeasible:
                        got[method] = "inf"
                    if method == "checkmate_milp":
                        milp_time = time.perf_counter() - start
                print(f"| {L} | {'yes' if res else 'no'} | {b} | {got['rotor']} | "
                      f"{got['checkmate_milp']} | {got['dtr']} | {drops} | {milp_time:.1f} s |",
                      flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (used by the tests)")
    ap.add_argument("--out", default="results/graph_solvers", help="output directory")
    ap.add_argument("--time-limit", type=float, default=None, help="MILP time limit, s")
    ap.add_argument("--chain-table", action="store_true", help="print docs/graphs.md's table")
    args = ap.parse_args(argv)
    if args.chain_table:
        chain_table()
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.quick:
        chains, graphs, fractions, limit = [3], [4], [1.0, 0.4, 0.0], 10.0
    else:
        chains, graphs, fractions, limit = [4, 6, 8], [6, 9, 12], [1.0, 0.6, 0.3, 0.1, 0.0], 120.0
    limit = args.time_limit or limit
    cases: list[tuple[str, int, Graph, Chain | None]] = []
    for L in chains:
        chain = make_chain(L, seed=L)
        cases.append(("chain", L, chain_to_graph(chain), chain))
    for n in graphs:
        cases.append(("resnet", n, skip_graph(n, skip=2, seed=n), None))
        cases.append(("unet", n, skip_graph(n, unet=True, seed=n), None))
    rows = []
    for family, size, g, chain in cases:
        top = simulate(g, store_all_graph_ops(g)).peak_memory
        if chain is not None:
            top = max(top, solvers.solve(chain, 10**12, method="store_all").meta["peak_memory"])
        base = g.store_all_time() if chain is None else chain.store_all_time()
        least = dtr_min_budget(g)  # >= the MILP's least budget
        for fraction in fractions:
            budget = int(least + fraction * (top - least))
            for r in run_graph(g, budget, limit, chain):
                mk = r.get("makespan")
                r.update(family=family, size=size, nodes=len(g), fraction=fraction,
                         budget=budget, overhead=None if mk is None else mk / base - 1)  # fmt: skip
                rows.append(r)
                print(
                    f"{family:6s} {size:3d} {fraction:4.2f} {r['method']:15s} {r['status']:10s}"
                    f" makespan={mk if mk is None else round(mk, 3)}"
                    f" time={r['solve_time']:.3f}s",
                    flush=True,
                )
    if not args.quick:  # solve-time targets: LP rounding on ~100 nodes, MILP on ~30 nodes
        rows += scale_rows(limit)
    with open(out / "graph_solvers.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in FIELDS})
    plot_style.save(plot(rows), out / "graph_solvers.png")


def plot(rows: list[dict]):
    """One panel of overhead against the budget per instance, and solve time against
    graph size (the slowest over the budgets) for every method."""
    instances = sorted({(r["family"], r["size"], r["nodes"]) for r in rows})
    fig, axes = plot_style.panels(len(instances) + 1, max_cols=4, size=(3.2, 2.8))
    methods = sorted({r["method"] for r in rows})
    f_label = plot_style.axis_label("budget f", "%")
    for ax, (fam, size, nodes) in zip(axes, instances, strict=False):
        for k, m in enumerate(methods):
            ok = sorted((r["fraction"], r["overhead"]) for r in rows if r["status"] == "ok"
                        and (r["family"], r["size"], r["method"]) == (fam, size, m))  # fmt: skip
            if ok:
                style = plot_style.line(m, stack=(k, len(methods)))
                ax.plot([100 * f for f, _ in ok], [100 * o for _, o in ok], **style)
        ax.set_title(f"{fam} {size} ({nodes} nodes)")
        ax.set_xlabel(f_label)
        ax.set_ylabel(plot_style.OVERHEAD)
    ax = axes[-1]
    for m in methods:
        slowest: dict[int, float] = {}
        for r in rows:
            if r["method"] == m:
                slowest[r["nodes"]] = max(slowest.get(r["nodes"], 0.0), r["solve_time"])
        if slowest:
            ax.plot(*zip(*sorted(slowest.items()), strict=True), **plot_style.line(m))
    ax.set_yscale("log")
    ax.set_title("solve time, slowest over f")
    ax.set_xlabel(plot_style.axis_label("graph size", "nodes"))
    ax.set_ylabel(plot_style.axis_label("solve time", "s"))
    fig.suptitle("graph solvers: budget = least + f (store-all peak - least), least = DTR's")
    plot_style.legend(fig)
    return fig


if __name__ == "__main__":
    main()

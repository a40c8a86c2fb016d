"""Memory/time trade-off of rematerialization strategies on profiled chains.

For each chain profile in ``examples/profiles/`` (Flax models profiled with
``jax_exec.profile``; regenerate with ``examples/make_profiles.py``), and budgets
from rotor's least budget to the store-all peak, plot the makespan overhead
(makespan / store-all time - 1) of rotor, revolve, chen_sqrt, store_all and
recompute_all. Infeasible (method, budget) pairs are left out of the CSV.
Writes ``remat_tradeoff.csv`` and ``remat_tradeoff.png`` under ``--out``.

    python paper_experiments/remat_tradeoff.py [--quick] [--out results/remat_tradeoff]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import schedir  # noqa: E402
import solvers  # noqa: E402
from schedir import plot_style  # noqa: E402
from solvers.chain.rotor import min_memory  # noqa: E402
from solvers.chain.store_all import store_all_ops  # noqa: E402

METHODS = ["rotor", "revolve", "chen_sqrt", "store_all", "recompute_all"]
FIELDS = ["model", "stages", "method", "budget", "budget_fraction", "makespan", "overhead",
          "peak", "solve_time"]  # fmt: skip


def run(profiles: list[Path], points: int) -> list[dict]:
    rows = []
    for path in profiles:
        chain = schedir.load(path)
        base = chain.store_all_time()
        top = schedir.simulate(chain, store_all_ops(chain)).peak_memory
        least = min_memory(chain)
        high = top * 105 // 100  # 5% above store-all, in exact integers
        budgets = sorted({least + (high - least) * q // (points - 1) for q in range(points)})
        for method in METHODS:
            for budget in budgets:
                try:
                    schedule = solvers.solve(chain, budget, method)
                except solvers.Infeasible:
                    continue
                meta = schedule.meta
                rows.append({
                    "model": path.stem, "stages": chain.length, "method": method,
                    "budget": budget, "budget_fraction": budget / top,
                    "makespan": meta["makespan"], "overhead": meta["makespan"] / base - 1,
                    "peak": meta["peak_memory"], "solve_time": meta["solve_time"],
                })  # fmt: skip
    return rows


def plot(rows: list[dict]):
    """Overhead against the budget, one panel per model."""
    models = sorted({r["model"] for r in rows})
    fig, axes = plot_style.panels(len(models), size=(5.0, 3.6))
    for ax, model in zip(axes, models, strict=True):
        for k, method in enumerate(METHODS):
            pts = sorted((100 * r["budget_fraction"], 100 * r["overhead"]) for r in rows
                         if r["model"] == model and r["method"] == method)  # fmt: skip
            if pts:
                ax.step(*zip(*pts, strict=True), where="post",
                        **plot_style.line(method, stack=(k, len(METHODS))))  # fmt: skip
        ax.set_title(model)
        ax.set_xlabel(plot_style.axis_label("memory budget", "% of store-all peak"))
        ax.set_ylabel(plot_style.OVERHEAD)
    plot_style.legend(fig)
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer budgets (used by the tests)")
    parser.add_argument("--out", default="results/remat_tradeoff", help="output directory")
    parser.add_argument("--profiles", nargs="*", type=Path, help="chain JSON files")
    args = parser.parse_args(argv)
    profiles = args.profiles or sorted((ROOT / "examples" / "profiles").glob("*.json"))
    if len(profiles) < 1:
        raise SystemExit("no chain profiles found; run examples/make_profiles.py")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = run(profiles, points=8 if args.quick else 40)
    with open(out / "remat_tradeoff.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    plot_style.save(plot(rows), out / "remat_tradeoff.png")
    assert all(math.isfinite(r["makespan"]) for r in rows)
    print(f"remat_tradeoff: {len(rows)} rows from {len(profiles)} profiles "
          f"in {time.perf_counter() - start:.1f}s -> {out}")  # fmt: skip


if __name__ == "__main__":
    main()

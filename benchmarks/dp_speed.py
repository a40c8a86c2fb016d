"""Speed of the exact chain DP (rotor): the table at M = 500 slots, and whole solves at scale.

Chains have random heterogeneous costs (seeded); sizes are in slots. The default run
builds the table for L = 50, 100, 200 at a budget of 500 slots (below store-all, so
the table is full width) and times a whole ``solvers.solve`` (least budget, table,
backtracking, the simulator's check), best of ``--repeat`` runs, with the ratio between
consecutive sizes (O(L^3) predicts 8x per doubling).

``--scale L [L ...]`` solves one chain of each length at the budget halfway between its
least and store-all, each in a fresh process, and reports the grid chosen (exact, or the
slots the memory cap allows), the time and the peak resident memory.

    python benchmarks/dp_speed.py [--repeat 3] [--slots 500] [--quick] [--out DIR]
    python benchmarks/dp_speed.py --scale 300 1000 2000
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import schedir
import solvers
from solvers.chain.rotor import build_table, min_memory, no_recompute_budget


def random_chain(L: int, rng: np.random.Generator) -> schedir.Chain:
    x = rng.integers(5, 30, L + 1)
    return schedir.Chain.from_rotor(
        fw=rng.uniform(1, 10, L).tolist(),
        bw=rng.uniform(2, 20, L + 1).tolist(),
        cw=x.tolist(),
        cbw=[0] + (x[1:] + rng.integers(0, 30, L)).tolist(),
        ftmp=rng.integers(0, 5, L).tolist(),
        btmp=rng.integers(0, 10, L + 1).tolist(),
    )


def best_of(repeat: int, fn, *args, **kwargs) -> float:
    """Least wall time of ``repeat`` calls of ``fn(*args, **kwargs)``, seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times)


def one_solve(L: int) -> dict:
    """Solve one chain of L stages halfway between its least and store-all budgets."""
    chain = random_chain(L, np.random.default_rng(0))
    start = time.perf_counter()
    least, top = min_memory(chain), no_recompute_budget(chain)
    budget = (least + top) // 2
    meta = solvers.solve(chain, budget, "rotor", progress=True).meta
    info = meta.get("discretization", {})
    return {
        "L": L,
        "budget": budget,
        "exact": meta["exact"],
        "slots": info.get("slots", budget),
        "limited_by": info.get("limited_by", ""),
        "makespan": meta["makespan"],
        "lower_bound": meta.get("lower_bound", meta["makespan"]),
        "seconds": round(time.perf_counter() - start, 1),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "memory_cap_gib": round(meta["memory_cap"] / 2**30, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--slots", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="L = 50, 100 only, one run")
    parser.add_argument("--out", help="directory for dp_speed.csv")
    parser.add_argument("--scale", type=int, nargs="+", metavar="L", help="whole solves")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a --scale child
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_solve(args.one)))
        return
    if args.scale:
        rows = []
        for L in args.scale:  # a fresh process each: peak RSS is per solve
            child = [sys.executable, __file__, "--one", str(L)]
            done = subprocess.run(child, stdout=subprocess.PIPE, text=True, check=True)
            rows.append(json.loads(done.stdout.splitlines()[-1]))
            print(rows[-1], flush=True)
        write(args.out, rows)
        return
    rng = np.random.default_rng(0)
    repeat = 1 if args.quick else args.repeat
    print(f"rotor DP, M = {args.slots} slots, best of {repeat}")
    print(f"{'L':>5} {'table (s)':>10} {'solve (s)':>10} {'ratio':>7}  makespan")
    previous, rows = None, []
    for L in (50, 100) if args.quick else (50, 100, 200):
        chain = random_chain(L, rng)
        budget = args.slots  # slots, including x_0
        table_time = best_of(repeat, build_table, chain, budget)
        solve_time = best_of(repeat, solvers.solve, chain, budget, "rotor")
        makespan = solvers.solve(chain, budget, "rotor").meta["makespan"]
        ratio = f"{solve_time / previous:6.2f}x" if previous else "      -"
        print(f"{L:>5} {table_time:>10.3f} {solve_time:>10.3f} {ratio}  {makespan:.1f}")
        rows.append({"L": L, "table_s": table_time, "solve_s": solve_time, "makespan": makespan})
        previous = solve_time
    write(args.out, rows)


def write(out: str | None, rows: list[dict]) -> None:
    if out is None or not rows:
        return
    path = Path(out) / "dp_speed.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()

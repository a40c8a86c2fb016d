"""Speed of the exact chain DP (rotor) for L = 50, 100, 200 stages at M = 500 slots.

Chains have random heterogeneous costs (seeded); sizes are in slots and the budget is
500 slots, well below store-all, so the table is full width. Prints the time of the
table alone and of a whole ``solvers.solve`` (min budget, table, backtracking, the
simulator's check), best of ``--repeat`` runs, and the ratio between consecutive
sizes (O(L^3) predicts 8x per doubling).

    python benchmarks/dp_speed.py [--repeat 3] [--slots 500]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import schedir
import solvers
from solvers.rotor import build_table


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--slots", type=int, default=500)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"rotor DP, M = {args.slots} slots, best of {args.repeat}")
    print(f"{'L':>5} {'table (s)':>10} {'solve (s)':>10} {'ratio':>7}  makespan")
    previous = None
    for L in (50, 100, 200):
        chain = random_chain(L, rng)
        budget = args.slots  # slots, including x_0
        table_time = best_of(args.repeat, build_table, chain, budget)
        solve_time = best_of(args.repeat, solvers.solve, chain, budget, "rotor")
        makespan = solvers.solve(chain, budget, "rotor").meta["makespan"]
        ratio = f"{solve_time / previous:6.2f}x" if previous else "      -"
        print(f"{L:>5} {table_time:>10.3f} {solve_time:>10.3f} {ratio}  {makespan:.1f}")
        previous = solve_time


if __name__ == "__main__":
    main()

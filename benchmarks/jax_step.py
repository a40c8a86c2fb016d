"""Overhead of jax_exec's two executors on the demo model, store-all schedule.

Measures, in the same process and interleaved (so machine load hits all alike):

- plain: ``jax.jit(jax.value_and_grad(loss))(params, x, y)``;
- compiled: ``jax.jit(lower(layers, loss, schedule).value_and_grad)(params, x, y)``;
- runtime: ``jax_exec.run(layers, loss, schedule, x, y)`` (the whole call, Python
  included; ``ops only`` is the sum of its per-op times).

Prints the median and the minimum of each, and their ratios to plain. Targets:
compiled within 1.05x, runtime within 1.3x.
Run: ``.venv/bin/python benchmarks/jax_step.py [--repeats N] [--quick] [--out DIR]``;
``--quick``: 2 blocks, 3 repeats; ``--out``: also write ``DIR/jax_step.csv``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import jax

import jax_exec
import solvers
from jax_exec.stages import plain_loss
from schedir_cli.models import mse_loss, transformer_stack


def timed(call) -> float:
    start = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, help="interleaved repeats (default 15)")
    parser.add_argument("--depth", type=int, help="transformer blocks (default 12)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="2 blocks, 3 repeats")
    parser.add_argument("--out", type=Path, help="also write OUT/jax_step.csv")
    args = parser.parse_args()
    args.repeats = args.repeats or (3 if args.quick else 15)
    args.depth = args.depth or (2 if args.quick else 12)

    tokens, dim, in_dim, out_dim = 64, 64, 16, 8
    layers = transformer_stack(args.depth, dim, 4, 4 * dim, in_dim, out_dim, seed=0)
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (args.batch, tokens, in_dim))
    y = jax.random.normal(ky, (args.batch, out_dim))
    chain = jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops")
    schedule = solvers.solve(chain, 10**15, "store_all")

    stages = jax_exec.stages.as_stages(layers)
    params = [s.params for s in stages]

    plain = jax.jit(jax.value_and_grad(plain_loss(stages, mse_loss)))
    compiled = jax.jit(jax_exec.stages.lower(layers, mse_loss, schedule).value_and_grad)
    runs = {
        "plain": lambda: plain(params, x, y),
        "compiled": lambda: compiled(params, x, y),
        "runtime": lambda: jax_exec.run(layers, mse_loss, schedule, x, y).loss,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    op_times = []
    for call in runs.values():  # compile and warm up
        for _ in range(2):
            timed(call)
    for _ in range(args.repeats):
        for name, call in runs.items():
            times[name].append(timed(call))
        op_times.append(jax_exec.run(layers, mse_loss, schedule, x, y).total_time)

    times["runtime (ops only)"] = op_times
    base, base_min = statistics.median(times["plain"]), min(times["plain"])
    print(f"model: {chain.length} stages, batch {args.batch}, {args.repeats} interleaved repeats")
    print(f"{'step':<20} {'median ms':>10} {'ratio':>7} {'min ms':>8} {'ratio':>7} {'target':>7}")
    targets = {"compiled": "1.05", "runtime": "1.30"}
    rows = []
    for name, values in times.items():
        median, least = statistics.median(values), min(values)
        rows.append({"step": name, "median_ms": median * 1e3, "median_ratio": median / base,
                     "min_ms": least * 1e3, "min_ratio": least / base_min,
                     "target": targets.get(name, ""), "repeats": args.repeats})  # fmt: skip
        print(
            f"{name:<20} {median * 1e3:>10.1f} {median / base:>7.3f} {least * 1e3:>8.1f} "
            f"{least / base_min:>7.3f} {targets.get(name, ''):>7}"
        )
    print("(on a shared machine the min is the steadier estimate)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "jax_step.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.out / 'jax_step.csv'}")


if __name__ == "__main__":
    main()

"""`make demo`: profile a Flax NNX transformer, solve with every chain method, run, compare.

A 14-stage model (token embedding, 12 transformer blocks, a pooled head) is profiled
on this machine (measured times, exact bytes). Every registered chain method is
solved at three activation budgets (store-all's peak, half of it, and 10% above the
least feasible one); each schedule runs op by op with ``jax_exec.run``. The table
compares predicted and measured peak memory and time (the measured time is the
median of ``--repeats`` runs: one run on a shared machine varies several-fold), says
what each answer is worth (as ``schedir solve`` labels it), and checks the gradients against plain
``jax.value_and_grad``. Bytes are in MiB (2**20 bytes) as everywhere in schedir. A
PNG of the memory curves of the three rotor schedules is written to
``OUT/memory_rotor.png``.

Run: ``make demo`` or ``.venv/bin/python examples/demo.py [--quick] [--out DIR]
[--depth N] [--repeats R]``; ``--quick`` profiles a 4-block model with 2 repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import numpy as np

import jax_exec
import schedir
import solvers
from jax_exec.stages import plain_loss
from schedir import plot_style
from schedir_cli.answers import answer_quality
from schedir_cli.models import mse_loss, transformer_stack

MiB = 2**20


def least_budget(chain: schedir.Chain) -> int:
    """The least budget rotor solves (its reported minimum, raised a little if needed)."""
    try:
        solvers.solve(chain, 1, method="rotor")
    except solvers.Infeasible as err:
        least = err.min_budget or 1
    for factor in (1.0, 1.01, 1.02, 1.05, 1.1, 1.2):
        try:
            solvers.solve(chain, int(least * factor), method="rotor")
            return int(least * factor)
        except solvers.Infeasible:
            continue
    raise RuntimeError(f"rotor solves nothing near its minimum {least}")


def plain_value_and_grad(layers, x, y):
    """Reference gradients: plain ``jax.value_and_grad`` of the whole model."""
    stages = jax_exec.stages.as_stages(layers)
    loss = plain_loss(stages, mse_loss)
    return jax.value_and_grad(loss)([s.params for s in stages], x, y)


def max_rel_error(got, want) -> float:
    worst = 0.0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = np.asarray(g), np.asarray(w)
        worst = max(worst, float(np.max(np.abs(g - w) / (1e-6 + 1e-5 * np.abs(w)))))
    return worst  # <= 1 means within rtol 1e-5, atol 1e-6


def plot(curves: list):
    """Predicted and measured memory after (resident) and during (op peak) each op of
    the rotor schedules, one panel per budget."""
    fig, axes = plot_style.panels(len(curves), size=(4.3, 3.6), sharey=True)
    for ax, (label, budget, trace, result) in zip(axes, curves, strict=True):
        steps = np.arange(1, len(trace.resident) + 1)
        ax.step(steps, np.array(trace.op_peak) / MiB, where="mid",
                **plot_style.line("predicted op peak"))  # fmt: skip
        ax.step(steps, np.array(trace.resident) / MiB, where="mid",
                **plot_style.line("predicted resident"))  # fmt: skip
        ax.plot(steps, np.array(result.op_peak_bytes) / MiB, **plot_style.line("measured op peak"))
        ax.plot(steps, np.array(result.resident_bytes) / MiB,
                **plot_style.line("measured resident"))  # fmt: skip
        ax.axhline(budget / MiB, **plot_style.line("budget", linewidth=1))
        ax.set_title(f"rotor, {label} budget ({budget / MiB:.1f} MiB)")
        plot_style.axis_labels(
            ax, ("position in the schedule", "ops"), ("activation memory", "MiB")
        )
    plot_style.legend(fig)
    return fig


def median_run(layers, schedule, x, y, repeats: int):
    """``jax_exec.run`` ``repeats`` times: the first result and the median total time, s."""
    results = [jax_exec.run(layers, mse_loss, schedule, x, y) for _ in range(repeats)]
    return results[0], statistics.median(r.total_time for r in results)


def quality(method: str, meta: dict) -> str:
    """The label ``schedir solve`` prints: ``optimal``, ``<=x%`` (at most x% above the
    optimum), ``fixed`` (one schedule whatever the budget) or ``heuristic``."""
    entry = next(m for m in solvers.available(schedir.Chain) if m.name == method)
    return answer_quality(meta, entry.exact, entry.fixed)["label"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/demo"))
    parser.add_argument("--quick", action="store_true", help="4 blocks, batch 8, 2 repeats")
    parser.add_argument("--depth", type=int, help="transformer blocks (default 12)")
    parser.add_argument("--batch", type=int, help="batch size (default 32)")
    parser.add_argument("--repeats", type=int, help="runs per schedule, median (default 5)")
    args = parser.parse_args(argv)
    depth = args.depth or (4 if args.quick else 12)
    batch = args.batch or (8 if args.quick else 32)
    repeats = args.repeats or (2 if args.quick else 5)
    if min(depth, batch, repeats) < 1:
        parser.error("--depth, --batch and --repeats must be at least 1")
    start = time.perf_counter()

    tokens, dim, in_dim, out_dim = 64, 64, 16, 8
    layers = transformer_stack(depth, dim, 4, 4 * dim, in_dim, out_dim, seed=0)
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (batch, tokens, in_dim))
    y = jax.random.normal(ky, (batch, out_dim))
    chain = jax_exec.stages.profile(layers, mse_loss, x, y, timing="measure")
    params = sum(
        x.nbytes for s in jax_exec.stages.as_stages(layers) for x in jax.tree.leaves(s.params)
    )
    print(
        f"model: {chain.length} stages, parameters {params / MiB:.2f} MiB, "
        f"input {x.nbytes / MiB:.2f} MiB, profiled in {time.perf_counter() - start:.1f} s"
    )
    want_loss, want_grads = plain_value_and_grad(layers, x, y)

    full = schedir.simulate_chain(chain, solvers.solve(chain, 10**15, "store_all")).peak_memory
    least = least_budget(chain)
    near_min = int(least * 1.1)  # 10% above the least feasible budget
    budgets = {"store-all": full, "half": max(full // 2, near_min), "near-min": near_min}
    methods = [m.name for m in solvers.available(chain)]
    jax_exec.run(layers, mse_loss, solvers.solve(chain, full, "store_all"), x, y)  # warm-up

    header = (
        f"{'method':<14} {'budget':>9} {'MiB':>8} {'quality':>9} {'pred peak':>10} "
        f"{'meas peak':>10} {'pred ms':>8} {'meas ms':>8} {'grads':>6}"
    )
    print(header)
    print("-" * len(header))
    curves = []
    for method in methods:
        for name, budget in budgets.items():
            try:
                schedule = solvers.solve(chain, budget, method=method)
            except solvers.Infeasible as err:
                row = f"{method:<14} {name:>9} {budget / MiB:>8.2f}  infeasible"
                least = err.min_budget
                print(row + (f" (needs {least / MiB:.2f} MiB)" if least is not None else ""))
                continue
            trace = schedir.simulate_chain(chain, schedule)
            result, measured = median_run(layers, schedule, x, y, repeats)
            assert result.resident_bytes == trace.resident, "runtime and simulator disagree"
            error = max(
                max_rel_error(result.grads, want_grads), max_rel_error(result.loss, want_loss)
            )
            label = quality(method, schedule.meta)
            print(
                f"{method:<14} {name:>9} {budget / MiB:>8.2f} {label:>9} "
                f"{trace.peak_memory / MiB:>10.2f} {result.peak_bytes / MiB:>10.2f} "
                f"{trace.makespan * 1e3:>8.1f} {measured * 1e3:>8.1f} "
                f"{'ok' if error <= 1 else 'FAIL':>6}"
            )
            if method == "rotor":
                curves.append((name, budget, trace, result))
    if curves:
        path = plot_style.save(plot(curves), args.out / "memory_rotor.png")
        print(f"wrote {path}")
    print(
        "peaks: activation bytes (a_0, kept activations and residuals, activation "
        "gradients, op temporaries) in MiB; measured resident bytes equal the simulator's "
        f"after every op. meas ms: median of {repeats} runs (pred ms: the profile's "
        "measured op times summed); quality as in `schedir solve`: optimal (an optimum of "
        "the method's model), <=x% (at most x% above it), fixed (one schedule whatever the "
        f"budget), heuristic. Total {time.perf_counter() - start:.1f} s."
    )


if __name__ == "__main__":
    main()

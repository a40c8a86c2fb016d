"""Fidelity of the automatic planner's predictions to the compiled step (docs/auto.md).

For each example model (``examples/auto_models.py``) and five budgets from the least
feasible one to the store-all peak (``jax_exec.auto.plan``, estimated temporaries as
``value_and_grad`` plans), the compiled training step ``jax.jit(jax.value_and_grad(
plan.lowered()))`` next to the plain one (``nnx.value_and_grad``):

- XLA's own figures of the compiled executable: ``memory_analysis()`` temporary bytes,
  ``cost_analysis()`` FLOPs, and the instructions of the optimized HLO text (all, and
  dots + convolutions): the extra dots/convolutions and FLOPs of the planned step over
  the plain one are the recomputations that survive XLA's optimizations (CSE, DCE,
  fusion), next to the plan's predicted overhead;
- on a GPU: the step's measured peak device memory (``memory_stats()``:
  ``peak_bytes_in_use`` minus the bytes in use before the step; runs go in increasing
  order of predicted peak because the allocator's peak cannot be reset, so a reading
  that does not rise above an earlier one is marked ``lower_bound``) and its median
  step time, next to the plan's predicted peak and makespan.

On CPU it runs in a reduced mode: XLA's CPU backend neither schedules for memory nor
keeps rematerialization barriers (its temporary bytes are not the GPU's), and the
host allocator has no peak statistics, so peak memory and the fidelity of step times
cannot be shown; it says so and reports the HLO counts, FLOPs and XLA's estimate.
Writes ``gpu_fidelity.csv`` under ``--out``.

    PYTHONPATH=. python benchmarks/gpu_fidelity.py [--quick] [--out results/gpu_fidelity]
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
import time
from pathlib import Path

import jax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from auto_models import MODELS, budget_sweep  # noqa: E402

from jax_exec import auto  # noqa: E402

FIELDS = ["model", "step", "budget", "predicted_peak", "predicted_overhead", "xla_temp",
          "hlo_instructions", "hlo_dots_convs", "plain_scans", "extra_dots_convs", "flops",
          "extra_flops_fraction", "measured_peak", "lower_bound", "step_time",
          "predicted_makespan"]  # fmt: skip
INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s.*?\s([a-z][a-z0-9\-]*)\(", re.M)


def hlo_counts(text: str) -> tuple[int, int]:
    """(instructions, dots + convolutions) of an optimized HLO module's text (every
    computation, fused ones included; a loop's body is counted once, as XLA's
    ``cost_analysis`` counts its FLOPs once)."""
    ops = INSTRUCTION.findall(text)
    return len(ops), sum(op in ("dot", "convolution") for op in ops)


def on_gpu() -> bool:
    return jax.devices()[0].platform == "gpu"


def measure(compiled, inputs: tuple, repeats: int) -> tuple[int | None, float]:
    """(peak device bytes over those in use before, or None off GPU; median seconds)."""
    device = jax.devices()[0]
    before = device.memory_stats()["bytes_in_use"] if on_gpu() else 0
    jax.block_until_ready(compiled(*inputs))  # warm-up; the peak is the allocator's
    peak = device.memory_stats()["peak_bytes_in_use"] - before if on_gpu() else None
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*inputs))
        times.append(time.perf_counter() - start)
    return peak, statistics.median(times)


def run_model(name: str, quick: bool, points: int, repeats: int) -> list[dict]:
    factory, loss_fn, args = MODELS[name](quick=quick)
    graphdef, params, rest = nnx.split(factory(), nnx.Param, ...)

    def plain(params, rest, args):
        model = nnx.merge(graphdef, params, rest)
        loss, grads = nnx.value_and_grad(loss_fn)(model, *args)
        return (loss, nnx.state(model, nnx.Not(nnx.Param))), grads

    p = auto.plan(loss_fn, factory(), *args, budget="100%", exact=False)
    entries = [("plain", None, plain)]
    entries += [
        ("auto", q, jax.value_and_grad(q.lowered(), has_aux=True))
        for q in map(p.replan, budget_sweep(p, points))
    ]
    inputs = (params, rest, args)
    done = []  # (row, compiled executable, predicted peak)
    for kind, q, fn in entries:
        compiled = jax.jit(fn).lower(*inputs).compile()
        n_ops, heavy = hlo_counts(compiled.as_text())
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list | tuple) else cost
        flops = float((cost or {}).get("flops", 0.0))
        base = done[0][0] if done else {"hlo_dots_convs": heavy, "flops": flops}
        peak = q.schedule.meta["peak_memory"] if q else p.store_all_peak
        row = {
            "model": name, "step": kind, "budget": q.budget if q else "",
            "predicted_peak": peak, "predicted_overhead": q.overhead if q else 0.0,
            "xla_temp": int(compiled.memory_analysis().temp_size_in_bytes),
            "hlo_instructions": n_ops, "hlo_dots_convs": heavy,
            "plain_scans": bool(p.model.program.scans),
            "extra_dots_convs": heavy - base["hlo_dots_convs"], "flops": flops,
            "extra_flops_fraction": flops / base["flops"] - 1 if base["flops"] else 0.0,
            "predicted_makespan": q.schedule.meta["makespan"] if q else p.store_all_time,
        }  # fmt: skip
        done.append((row, compiled, peak))
    highest = -1
    # increasing predicted peak, the plain step last: the allocator's peak cannot be reset
    for row, compiled, _ in sorted(done[1:], key=lambda e: e[2]) + done[:1]:
        peak, seconds = measure(compiled, inputs, repeats)
        row["measured_peak"] = "" if peak is None else peak
        row["lower_bound"] = peak is not None and peak <= highest
        highest = max(highest, -1 if peak is None else peak)
        row["step_time"] = seconds
    return [row for row, _, _ in done]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models")
    parser.add_argument("--out", default="results/gpu_fidelity", help="output directory")
    parser.add_argument("--points", type=int, default=5, help="budgets per model")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per budget")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ns = parser.parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    if not on_gpu():
        print(f"platform {jax.devices()[0].platform}: reduced mode. XLA's CPU backend does not "
              "schedule for memory nor keep rematerialization barriers and the host has no "
              "allocator peak: measured peak memory and GPU step times cannot be shown here; "
              "reported: optimized-HLO counts, FLOPs, XLA's temporary bytes, CPU step "
              "times (not the roofline's GPU).")  # fmt: skip
    rows = []
    for name in ns.models:
        rows += run_model(name, ns.quick, ns.points, ns.repeats)
    with open(out / "gpu_fidelity.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{'model':<8} {'step':<6} {'pred peak B':>12} {'pred ovh':>8} {'XLA temp B':>11} "
          f"{'dots+convs':>10} {'extra':>5} {'extra FLOPs':>11} {'meas peak B':>12} "
          f"{'step ms':>8}")  # fmt: skip
    for r in rows:
        peak = f"{r['measured_peak']:,}" if r["measured_peak"] != "" else "n/a"
        peak += "+" if r["lower_bound"] else ""
        print(f"{r['model']:<8} {r['step']:<6} {r['predicted_peak']:>12,} "
              f"{r['predicted_overhead']:>+8.1%} {r['xla_temp']:>11,} {r['hlo_dots_convs']:>10} "
              f"{r['extra_dots_convs']:>5} {r['extra_flops_fraction']:>+11.1%} {peak:>12} "
              f"{1e3 * r['step_time']:>8.2f}")  # fmt: skip
    print(
        "plain: nnx.value_and_grad compiled (predicted peak: the store-all reference); "
        "'+': the allocator's peak did not rise, a lower bound only"
    )
    looped = sorted({r["model"] for r in rows if r["plain_scans"]})
    if looped:
        print(
            f"{', '.join(looped)}: the plain step keeps the scan as a loop, whose body's dots "
            "and FLOPs XLA counts once, not per iteration: 'extra' is not comparable there"
        )
    print(f"wrote {out / 'gpu_fidelity.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

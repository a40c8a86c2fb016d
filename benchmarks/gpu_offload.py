"""The compiled step with host offload on the device at hand, next to the plan's
prediction (docs/auto.md, "Host offload"): the GPU check of the joint planner.

For each example model (``examples/auto_models.py``) and budgets below the store-all
peak, ``jax_exec.plan(..., platform=measure_platform())`` (the copy engines timed on
this machine) and its compiled step ``jax.jit(jax.value_and_grad(plan.lowered()))``:

- the residuals JAX keeps in ``pinned_host`` memory (their bytes, from the step's saved
  residuals) next to the plan's predicted host peak;
- on a GPU: the allocator's peak device bytes of the step (``memory_stats()``:
  ``peak_bytes_in_use`` less the bytes in use before; the allocator's peak cannot be
  reset, so runs go in increasing order of predicted peak and a reading that does not
  rise is marked ``lower_bound``), the median step time of ``--repeats`` runs, and the
  remat-only plan's at the same budget: measured speed-up of offload next to the
  predicted one.

On CPU both memories are the host's RAM and the allocator keeps no peak: it says so,
and reports the host residuals and the predictions only.

    PYTHONPATH=. python benchmarks/gpu_offload.py [--quick] [--repeats 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import jax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from auto_models import MODELS  # noqa: E402

import jax_exec  # noqa: E402
from jax_exec.execute.residuals import saved_residuals  # noqa: E402

FIELDS = ["model", "plan", "budget_fraction", "predicted_peak", "predicted_host",
          "host_residual_bytes", "predicted_overhead", "measured_peak", "lower_bound",
          "step_time", "offloaded"]  # fmt: skip


def host_residual_bytes(fn, params, rest, args) -> int:
    total = 0
    for aval, _ in saved_residuals(lambda p, r, a: fn(p, r, a)[0], params, rest, args):
        if "host" in str(getattr(aval, "memory_space", "")).lower():
            total += int(aval.size) * aval.dtype.itemsize
    return total


def measure(p, factory, args, repeats: int, device) -> tuple[int | None, float]:
    _, params, rest = nnx.split(factory(), nnx.Param, ...)
    step = jax.jit(jax.value_and_grad(p.lowered(), has_aux=True))
    stats = device.memory_stats() or {}
    before = stats.get("bytes_in_use")
    jax.block_until_ready(step(params, rest, args))
    after = device.memory_stats() or {}
    peak = after.get("peak_bytes_in_use")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(params, rest, args))
        times.append(time.perf_counter() - start)
    used = None if peak is None or before is None else peak - before
    return used, statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="results/gpu_offload")
    ns = parser.parse_args(argv)
    device = jax.devices()[0]
    gpu = device.platform == "gpu"
    platform = jax_exec.measure_platform()
    print(f"{device}: offload {platform.offload.bandwidth / 1e9:.1f} GB/s, prefetch "
          f"{platform.prefetch.bandwidth / 1e9:.1f} GB/s (measured)")  # fmt: skip
    if not gpu:
        print("not a GPU: device and host memory are the same RAM and the allocator keeps "
              "no peak; host residuals and predictions only")  # fmt: skip
    rows, last_peak = [], 0
    for name, make in MODELS.items():
        factory, loss_fn, args = make(quick=ns.quick)
        top = jax_exec.plan(loss_fn, factory(), *args, budget="100%", exact=False)
        for fraction in (0.8, 0.6) if ns.quick else (0.9, 0.75, 0.6, 0.45):
            budget = int(top.store_all_peak * fraction)
            for label, plat in (("remat", None), ("joint", platform)):
                try:
                    p = top.replan(budget, platform=plat)
                except Exception as err:  # noqa: BLE001 - reported, the sweep goes on
                    print(f"{name} {label} {fraction:.0%}: {err}")
                    continue
                meta = p.schedule.meta
                _, params, rest = nnx.split(factory(), nnx.Param, ...)
                host = host_residual_bytes(p.lowered(), params, rest, args)
                peak, seconds = measure(p, factory, args, ns.repeats, device) if gpu else (None, 0)
                lower = peak is not None and peak <= last_peak
                last_peak = max(last_peak, peak or 0)
                rows.append({
                    "model": name, "plan": label, "budget_fraction": fraction,
                    "predicted_peak": meta["peak_memory"],
                    "predicted_host": meta.get("host_peak", 0),
                    "host_residual_bytes": host, "predicted_overhead": p.overhead,
                    "measured_peak": peak, "lower_bound": lower, "step_time": seconds,
                    "offloaded": " ".join(meta.get("offloaded", [])),
                })  # fmt: skip
                print(rows[-1], flush=True)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu_offload.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Remat + activation offloading versus remat alone, on profiled chains (docs/offload.md).

Reproduces the qualitative claim of Beaumont, Eyraud-Dubois, Shilova (NeurIPS 2021):
combining offloading with rematerialization removes a large part of the recompute
overhead. For each chain profile in ``examples/profiles/`` and budgets from the least
budget of ``rotor_offload`` to the store-all peak, it computes the makespan overhead
(makespan / store-all time - 1) of rotor (recomputation only, tight model) and of
rotor_offload at three host-link bandwidths (PCIe 3, PCIe 5, NVLink-C2C class;
``schedir.PRESETS``). Every schedule is checked by the simulator. Printed: the share
of rotor's overhead that offloading removes at each bandwidth (mean over the budgets
where rotor is feasible and recomputes).

The profiles were measured on a CPU; ``--speedup`` divides their times to emulate an
accelerator (default 50, GPU-class compute against these CPU timings: the ratio of
bytes to compute time is what decides whether transfers hide). ``--speedup 1`` keeps
the measured times (then every bandwidth hides all transfers).
Writes ``remat_offload.csv`` and ``remat_offload.png`` under ``--out``.

    python paper_experiments/remat_offload.py [--quick] [--speedup 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import schedir  # noqa: E402
from schedir import OffloadProblem, Platform, plot_style, simulate_offload  # noqa: E402
from solvers.chain.store_all import store_all_ops  # noqa: E402
from solvers.offload.rotor_offload import build_table  # noqa: E402

BANDWIDTHS = ["pcie3", "pcie5", "nvlink-c2c"]
FIELDS = ["model", "stages", "method", "bandwidth", "budget", "budget_fraction", "makespan",
          "overhead", "peak", "host_peak"]  # fmt: skip


def run(profiles: list[Path], points: int, slots: int, speedup: float) -> tuple[list, list]:
    rows, shares = [], []
    for path in profiles:
        chain = schedir.load(path)
        chain = replace(
            chain,
            fwd_time=tuple(t / speedup for t in chain.fwd_time),
            bwd_time=tuple(t / speedup for t in chain.bwd_time),
        )
        base = chain.store_all_time()
        top = schedir.simulate(chain, store_all_ops(chain)).peak_memory
        slot = -(-top // slots)
        methods = [("rotor", 0.0)] + [("rotor_offload", b) for b in BANDWIDTHS]
        tables = {}
        for name, bw in methods:
            problem = OffloadProblem(chain, Platform.host_offload(bw))
            tables[name, bw] = (problem, build_table(problem, slot))
        least = min(t.min_budget() for _, t in tables.values())
        budgets = sorted({least + (top - least) * q // (points - 1) for q in range(points)})
        over = {}
        for (name, bw), (problem, table) in tables.items():
            for budget in budgets:
                if not math.isfinite(table.value(budget)):
                    continue
                trace = simulate_offload(problem, table.ops(budget))
                assert trace.peak_memory <= budget and trace.program_peak <= budget
                assert math.isclose(trace.makespan, table.value(budget), rel_tol=1e-9)
                over[name, bw, budget] = trace.makespan / base - 1
                rows.append({
                    "model": path.stem, "stages": chain.length, "method": name,
                    "bandwidth": bw if isinstance(bw, str) else "none", "budget": budget,
                    "budget_fraction": budget / top, "makespan": trace.makespan,
                    "overhead": over[name, bw, budget], "peak": trace.peak_memory,
                    "host_peak": trace.host_peak,
                })  # fmt: skip
        for bw in BANDWIDTHS:
            removed = [
                1 - over["rotor_offload", bw, b] / over["rotor", 0.0, b]
                for b in budgets
                if over.get(("rotor", 0.0, b), 0.0) > 1e-9
            ]
            shares.append((path.stem, bw, float(np.mean(removed)) if removed else float("nan")))
    return rows, shares


def plot(rows: list[dict]):
    """Overhead against the device budget, one panel per model: rotor (recomputation
    only) and rotor_offload at each host-link bandwidth."""
    models = sorted({r["model"] for r in rows})
    fig, axes = plot_style.panels(len(models), size=(5.0, 3.6))
    series = ["none", *BANDWIDTHS]
    for ax, model in zip(axes, models, strict=True):
        for k, bw in enumerate(series):
            pts = sorted((100 * r["budget_fraction"], 100 * r["overhead"]) for r in rows
                         if r["model"] == model and r["bandwidth"] == bw)  # fmt: skip
            if pts:
                label = "rotor" if bw == "none" else f"rotor_offload {bw}"
                ax.step(*zip(*pts, strict=True), where="post",
                        **plot_style.line(label, stack=(k, len(series))))  # fmt: skip
        ax.set_title(model)
        ax.set_xlabel(plot_style.axis_label("device memory budget", "% of store-all peak"))
        ax.set_ylabel(plot_style.OVERHEAD)
    plot_style.legend(fig, title="rotor: recomputation only; rotor_offload: with its host link")
    return fig


def main(argv: list[str] | None = None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer budgets, coarser slots")
    parser.add_argument("--out", default="results/remat_offload", help="output directory")
    parser.add_argument("--speedup", type=float, default=50.0, help="divide profiled times")
    parser.add_argument("--profiles", nargs="*", type=Path, help="chain JSON files")
    args = parser.parse_args(argv)
    profiles = args.profiles or sorted((ROOT / "examples" / "profiles").glob("*.json"))
    if not profiles:
        raise SystemExit("no chain profiles found; run examples/make_profiles.py")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    points, slots = (8, 150) if args.quick else (40, 500)
    rows, shares = run(profiles, points, slots, args.speedup)
    with open(out / "remat_offload.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    plot_style.save(plot(rows), out / "remat_offload.png")
    print(f"share of rotor's remat overhead removed by offloading (times / {args.speedup:g}):")
    for model, bw, share in shares:
        print(f"  {model:16} {bw:11} {100 * share:5.1f}%")
    print(f"remat_offload: {len(rows)} rows from {len(profiles)} profiles "
          f"in {time.perf_counter() - start:.1f}s -> {out}")  # fmt: skip
    return shares


if __name__ == "__main__":
    main()

"""Training pipeline schedules versus memory per device: baselines and the joint planner.

Instances: a uniform chain (16 identical stages, T_F = T_B = T_W as in Qi et al.
2023) and the profiled chains of ``examples/profiles/`` (heterogeneous stages), on 4
identical devices with 25 GB/s links (10 us latency) and a PCIe-4 host link per
device (25 GB/s each way, for activation offload), m = 8 micro-batches. The
profiles hold no split of the backward nor parameter sizes: the weight gradient is
taken as half of every backward (``wgrad_fraction`` 0.5, the papers' T_B = T_W for
matmul layers), W holds what its input part would have freed (``wgrad_bytes``
None: no early release), and weights as 0 (memory is for activations).

For every memory per device (fractions of the largest store-all baseline peak) it
simulates over 3 repeated steps (:func:`schedir.pipeline.steps.step_report`):

- the baselines of :mod:`schedir.pipeline.baselines` (GPipe, 1F1B, interleaved 1F1B
  with 2 chunks, ZB-H1, ZB-H2, V-shape) on balanced cuts as published (every
  activation stored), and each with full rematerialization (every chunk at rotor's
  least memory, ``+remat``); one that exceeds a device gets no throughput;
- ``pipeline_joint``: partition, F/B/W schedule, per-chunk rotor / rotor_offload.

Throughput = micro-batches per second of the repeated steps; peak = the largest
device peak. Acceptance (checked, printed): at every memory the joint planner's
throughput is at least the best baseline's, and strictly higher where no baseline
fits without rematerialization. Writes ``pipeline_schedules.csv`` and
``pipeline_schedules.png`` under ``--out`` and prints the table.

    python paper_experiments/pipeline_schedules.py [--quick] [--out results/pipeline_schedules]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import schedir  # noqa: E402
import solvers  # noqa: E402
from schedir import plot_style  # noqa: E402
from schedir.pipeline.baselines import BASELINES  # noqa: E402
from schedir.pipeline.steps import step_report  # noqa: E402
from solvers.pipeline.joint import full_remat  # noqa: E402

FIELDS = ["instance", "memory", "memory_fraction", "schedule", "throughput", "relative",
          "peak", "fits", "pattern", "plans", "solve_time"]  # fmt: skip
P, M = 4, 8


def uniform_chain(L: int = 16) -> schedir.Chain:
    """L identical stages: 1 ms forward, 2 ms backward, 64 MB stash, 4 MB boundary."""
    MB = 2**20
    return schedir.Chain(fwd_time=(1e-3,) * L + (0.0,), bwd_time=(2e-3,) * L + (1e-4,),
                         in_size=(4 * MB,) * (L + 1), saved_size=(64 * MB,) * L + (0,),
                         fwd_tmp=(8 * MB,) * L + (0,), bwd_tmp=(8 * MB,) * (L + 1))  # fmt: skip


def problem(chain: schedir.Chain, memory: int | None) -> schedir.PipelineProblem:
    devs = [schedir.Device(f"g{k}", memory=memory) for k in range(P)]
    links = schedir.Platform.fully_connected(devs, 25e9, 1e-5).links
    host = schedir.CopyEngine(schedir.PRESETS["pcie4"])
    plat = schedir.Platform(offload=host, prefetch=host, devices=tuple(devs), links=links)
    L = chain.length
    return schedir.PipelineProblem(chain, [0] * L, plat, microbatches=M, training=True,
                                   wgrad_fraction=(0.5,) * L)  # fmt: skip


def baseline(pb, name: str, remat: bool):
    """The baseline's schedule (``remat``: every chunk at rotor's least memory)."""
    kw = {"chunks": 2} if name == "interleaved_1f1b" else {}
    s = BASELINES[name](pb, **kw)
    return full_remat(pb, s) if remat else s


def run(instances: dict, fractions: list[float], max_evals: int) -> list[dict]:
    rows = []
    for inst, chain in instances.items():
        loose = problem(chain, None)
        top = 0
        for name in BASELINES:
            if name == "interleaved_1f1b" and M % P:
                continue
            top = max(
                top, max(step_report(loose, baseline(loose, name, False)).device_peak.values())
            )
        for frac in fractions:
            mem = int(top * frac)
            pb = problem(chain, mem)
            group = []
            for name in BASELINES:
                for remat in (False, True):
                    t0 = time.perf_counter()
                    r = step_report(pb, baseline(pb, name, remat))
                    peak = max(r.device_peak.values())
                    group.append({"schedule": name + ("+remat" if remat else ""),
                                  "throughput": r.throughput if peak <= mem else 0.0,
                                  "peak": peak, "fits": peak <= mem, "pattern": name,
                                  "plans": "least" if remat else "store_all",
                                  "solve_time": time.perf_counter() - t0})  # fmt: skip
            t0 = time.perf_counter()
            try:
                s = solvers.solve(pb, None, "pipeline_joint", max_evals=max_evals)
                r = step_report(pb, dataclasses.replace(s, periodic=None))
                kinds = "/".join(sorted({p.kind for p in s.plans}))
                group.append({"schedule": "pipeline_joint", "throughput": r.throughput,
                              "peak": max(r.device_peak.values()), "fits": True,
                              "pattern": s.meta["pattern"], "plans": kinds,
                              "solve_time": time.perf_counter() - t0})  # fmt: skip
            except solvers.Infeasible:
                group.append({"schedule": "pipeline_joint", "throughput": 0.0, "peak": 0,
                              "fits": False, "pattern": "", "plans": "",
                              "solve_time": time.perf_counter() - t0})  # fmt: skip
            best = max(g["throughput"] for g in group if g["schedule"] != "pipeline_joint")
            for g in group:
                g.update(instance=inst, memory=mem, memory_fraction=frac,
                         relative=g["throughput"] / best if best > 0 else math.nan)  # fmt: skip
            rows += group
    return rows


def acceptance(rows: list[dict]) -> list[str]:
    """The failed acceptance lines (empty: all hold)."""
    failed = []
    for key in {(r["instance"], r["memory"]) for r in rows}:
        group = [r for r in rows if (r["instance"], r["memory"]) == key]
        joint = next(r for r in group if r["schedule"] == "pipeline_joint")["throughput"]
        best = max(r["throughput"] for r in group if r["schedule"] != "pipeline_joint")
        stored = [r for r in group if r["plans"] == "store_all" and r["fits"]]
        if joint < best * (1 - 1e-9):
            failed.append(f"{key}: joint {joint:.4g} < best baseline {best:.4g}")
        if not stored and not joint > best * (1 + 1e-9):
            failed.append(f"{key}: memory is tight and joint {joint:.4g} is not above {best:.4g}")
    return failed


def table(rows: list[dict]) -> str:
    names = list(dict.fromkeys(r["schedule"] for r in rows))
    lines = ["instance      mem/dev  " + " ".join(f"{n[:14]:>14}" for n in names)]
    for key in dict.fromkeys((r["instance"], r["memory"]) for r in rows):
        group = {r["schedule"]: r for r in rows if (r["instance"], r["memory"]) == key}
        cells = [f"{group[n]['throughput']:14.1f}" if group[n]["fits"] else f"{'-':>14}"
                 for n in names]  # fmt: skip
        lines.append(f"{key[0][:12]:12} {key[1] / 2**30:6.2f}G  " + " ".join(cells))
    return "\n".join(lines) + "\n(micro-batches per second over repeated steps; - : over memory)"


def plot(rows: list[dict]):
    """Throughput against the memory per device, one panel per instance; a schedule
    over its devices' memory has no point there."""
    insts = list(dict.fromkeys(r["instance"] for r in rows))
    fig, axes = plot_style.panels(len(insts), size=(5.0, 3.8))
    names = list(dict.fromkeys(r["schedule"] for r in rows))
    for ax, inst in zip(axes, insts, strict=True):
        for k, name in enumerate(names):
            sel = sorted((r["memory"] / 2**30, r["throughput"]) for r in rows if r["fits"]
                         and (r["instance"], r["schedule"]) == (inst, name))  # fmt: skip
            if sel:
                ax.plot(*zip(*sel, strict=True), **plot_style.line(name, stack=(k, len(names))))
        ax.set_title(inst)
        ax.set_xlabel(plot_style.axis_label("memory per device", "GiB"))
        ax.set_ylabel(plot_style.axis_label("throughput", "micro-batches/s"))
    plot_style.legend(fig, title="+remat: every chunk at rotor's least memory")
    return fig


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (used by tests)")
    parser.add_argument("--out", default="results/pipeline_schedules", help="output folder")
    args = parser.parse_args(argv)
    instances = {"uniform": uniform_chain()}
    for path in sorted((ROOT / "examples" / "profiles").glob("*.json")):
        instances[path.stem] = schedir.load(path)
    if args.quick:
        rows = run({"uniform": instances["uniform"]}, [0.5], 60)
        rows += run({"transformer": instances["transformer"]}, [1.0, 0.5], 60)
    else:
        rows = run(instances, [1.0, 0.8, 0.6, 0.45, 0.35, 0.25], 400)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "pipeline_schedules.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({k: r[k] for k in FIELDS} for r in rows)
    plot_style.save(plot(rows), out / "pipeline_schedules.png")
    print(table(rows))
    failed = acceptance(rows)
    print("acceptance: " + ("holds on every instance" if not failed else "; ".join(failed)))
    print(f"wrote {out / 'pipeline_schedules.csv'} ({len(rows)} rows) and pipeline_schedules.png")
    return rows


if __name__ == "__main__":
    main()

"""Dynamic scheduling of training on heterogeneous devices with memory limits.

For each profiled chain in ``examples/profiles/`` (merged into 8 groups of near-equal
forward time) on 4 devices at two heterogeneity levels (speeds 1.25/1/1/0.8 and
2/1/1/0.5), with a memory cap per device (1.2 times the stash of one micro-batch of
the whole model, plus all the weights; each stage's weights, with their gradients and
optimizer state, are taken as the bytes of its input activation, the profiles holding
none), links on which an activation takes 0.2 mean stage times, and host links at
half that bandwidth (offloading), one training step of 16 micro-batches
(:func:`schedir.dynamic.training_graph`) is run in the simulator of the dynamic
runtime:

- static plans, executed as they are: ``1f1b`` (the ``pipeline_1f1b`` solver's
  mapping and order), ``gpipe`` (its mapping, GPipe's order), ``heft`` (HEFT's lists
  at the profile's times);
- dynamic policies: ``eager``, ``dmda``, ``dmdas`` and ``guided`` (follows the best
  of the three static plans, backfills, re-plans on significant drift).

Every run follows the same rules (the parameters start on the host, memory is
admitted and evicted by the runtime, DTR's rule). ``1f1b_judge`` is the 1F1B
schedule in the pipeline simulator (``simulate_pipeline``, its own memory model and
parameters resident from the start), for reference. Task times get log-normal noise
of 0, 10% and 30%, per task (``task``) or per task plus a persistent per-device factor
of the same level (``task+device``), several seeds (the same for every method).
Throughput = micro-batches / makespan. ``relative_static``: to the best static plan
(mean over seeds) at the same noise; ``lp_bound``: the steady-state LP
(``solvers.pipeline.training_lp``) at the profile's times, an upper bound of every run
without noise; ``run_bound``: the LP with the run's own durations, which no run may
exceed (checked); peak bytes per device, as the runtime counted them.

Writes ``dynamic_training.csv``, ``dynamic_training.png`` (throughput against noise)
and ``dynamic_training_memory.png`` (peak memory per device) under ``--out``; prints
the table of the best static plan against the best dynamic policy.

    python paper_experiments/dynamic_training.py [--quick] [--out results/dynamic_training]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import schedir  # noqa: E402
import solvers  # noqa: E402
from paper_experiments.steady_state import NOISE_AXIS, RELATIVE_AXIS, coarsen  # noqa: E402
from schedir import CopyEngine, Device, Platform, plot_style  # noqa: E402
from schedir.dynamic import training_graph  # noqa: E402
from schedir.pipeline.baselines import gpipe_ops  # noqa: E402
from schedir.pipeline.problem import PipelineProblem  # noqa: E402
from schedir.pipeline.simulate import Noise, simulate_pipeline  # noqa: E402
from solvers.pipeline.dynamic import run_policy  # noqa: E402
from solvers.pipeline.training_lp import bound_of_trace, training_lp  # noqa: E402

STATIC = ["1f1b", "gpipe", "heft"]
DYNAMIC = ["eager", "dmda", "dmdas", "guided"]
NOISE = [0.0, 0.1, 0.3]
KINDS = ["task", "task+device"]
HETEROGENEITY = {"mild": (1.25, 1.0, 1.0, 0.8), "strong": (2.0, 1.0, 1.0, 0.5)}
DEVICES = 4
FIELDS = ["model", "heterogeneity", "method", "kind", "noise_kind", "noise", "seed",
          "microbatches", "throughput", "relative_static", "lp_bound", "relative_lp",
          "run_bound", "offloads", "drops", "replans", *(f"peak_d{u}" for u in range(DEVICES)),
          "cap", "solve_time"]  # fmt: skip


def instance(path: Path, speeds, microbatches: int, parts: int = 8) -> PipelineProblem:
    """The training problem of one profile and heterogeneity level (module docstring)."""
    chain = coarsen(schedir.load(path), parts)
    L = chain.length
    stage = sum(chain.fwd_time[:L] + chain.bwd_time[:L]) / L
    act = sum(chain.in_size[1:L]) / max(1, L - 1)
    bandwidth = act / (0.2 * stage)
    weights = [chain.in_size[k] for k in range(L)]
    cap = int(1.2 * sum(chain.saved_size[:L]) + sum(weights))
    devices = [Device(f"d{u}", s, cap) for u, s in enumerate(speeds)]
    links = Platform.fully_connected(devices, bandwidth).links
    host = CopyEngine(bandwidth / 2)
    platform = Platform(offload=host, prefetch=host, devices=tuple(devices), links=links)
    return PipelineProblem(chain, weights, platform, microbatches, True)


def run_instance(pb: PipelineProblem, seeds: int) -> list[dict]:
    graph = training_graph(pb)
    m = pb.microbatches
    start = time.perf_counter()
    sched = solvers.solve(pb, None, "pipeline_1f1b")
    plans = {"1f1b": sched, "gpipe": gpipe_ops(pb, sched.mapping), "heft": "heft"}
    plan_time = time.perf_counter() - start
    lp = training_lp(graph, pb.platform)
    cap = pb.platform.devices[0].memory
    rows = []
    for kind, noise, seed in itertools.product(KINDS, NOISE, range(seeds)):
        if kind == "task+device" and noise == 0:
            continue  # the same runs as "task" at zero noise
        nz = Noise(noise, seed, noise if kind == "task+device" else 0.0)
        base = {"noise_kind": kind, "noise": noise, "seed": seed, "microbatches": m,
                "lp_bound": lp.throughput, "cap": cap}  # fmt: skip
        judge = simulate_pipeline(pb, sched, noise=nz)
        rows.append({**base, "method": "1f1b_judge", "kind": "static",
                     "throughput": m / judge.makespan, "run_bound": "", "offloads": 0,
                     "drops": 0, "replans": "", "solve_time": plan_time,
                     **{f"peak_d{u}": judge.device_peak.get(f"d{u}", 0)
                        for u in range(DEVICES)}})  # fmt: skip
        for method in STATIC + DYNAMIC:
            t0 = time.perf_counter()
            if method in STATIC:
                trace = run_policy(graph, pb.platform, "static", plan=plans[method], noise=nz)
                replans = ""
            else:
                plan = list(plans.values()) if method == "guided" else None
                trace, replans = _dynamic(graph, pb, method, plan, nz)
            bound = bound_of_trace(graph, pb.platform, trace).throughput
            if trace.throughput > bound * (1 + 1e-9):
                raise AssertionError(f"{method}: {trace.throughput} items/s above its LP bound "
                                     f"{bound}")  # fmt: skip
            if noise == 0 and trace.throughput > lp.throughput * (1 + 1e-9):
                raise AssertionError(f"{method}: above the LP bound {lp.throughput}")
            modes = [mode for *_, mode in trace.evictions]
            rows.append({**base, "method": method,
                         "kind": "static" if method in STATIC else "dynamic",
                         "throughput": trace.throughput, "run_bound": bound,
                         "offloads": modes.count("offload"), "drops": modes.count("drop"),
                         "replans": replans, "solve_time": time.perf_counter() - t0
                         + (plan_time if method in ("1f1b", "gpipe", "guided") else 0.0),
                         **{f"peak_d{u}": trace.device_peak[f"d{u}"]
                            for u in range(DEVICES)}})  # fmt: skip
    for r in rows:
        same = [x for x in rows if x["noise_kind"] == r["noise_kind"] and x["noise"] == r["noise"]]
        r["relative_static"] = r["throughput"] / best(same, STATIC)[1]
        r["relative_lp"] = r["throughput"] / lp.throughput
    return rows


def _dynamic(graph, pb, method, plan, noise):
    from schedir.dynamic import simulate_dynamic
    from solvers.pipeline.dynamic import make_policy

    pol = make_policy(method, graph, pb.platform, plan=plan)
    return simulate_dynamic(graph, pb.platform, pol, noise=noise), getattr(pol, "replans", "")


def best(rows: list[dict], methods: list[str]) -> tuple[str, float]:
    """The method of ``methods`` with the highest mean throughput over ``rows``."""
    means = {m: statistics.mean(r["throughput"] for r in rows if r["method"] == m)
             for m in methods if any(r["method"] == m for r in rows)}  # fmt: skip
    name = max(means, key=means.get)
    return name, means[name]


def summary(rows: list[dict]) -> list[dict]:
    """Per instance, noise kind and level: the best static plan and dynamic policy."""
    out = []
    keys = dict.fromkeys((r["model"], r["heterogeneity"], r["noise_kind"], r["noise"])
                         for r in rows)  # fmt: skip
    for model, het, kind, noise in keys:
        sel = [r for r in rows if (r["model"], r["heterogeneity"], r["noise_kind"], r["noise"])
               == (model, het, kind, noise)]  # fmt: skip
        s_name, s_val = best(sel, STATIC)
        d_name, d_val = best(sel, DYNAMIC)
        out.append({"model": model, "heterogeneity": het, "noise_kind": kind, "noise": noise,
                    "static": s_name, "static_tp": s_val, "dynamic": d_name, "dynamic_tp": d_val,
                    "lp": sel[0]["lp_bound"], "judge": best(sel, ["1f1b_judge"])[1]})  # fmt: skip
    return out


def print_table(table: list[dict]) -> None:
    head = (
        f"{'model':16s} {'het':6s} {'noise':>12s} {'best static':>16s} "
        f"{'best dynamic':>17s} {'dyn/static':>10s} {'dyn/LP':>7s} {'1f1b judge':>10s}"
    )
    print(head)
    for t in table:
        noise = f"{t['noise_kind']} {100 * t['noise']:.0f}%"
        print(f"{t['model']:16s} {t['heterogeneity']:6s} {noise:>12s} "
              f"{t['static']:>6s} {t['static_tp']:9.3f} {t['dynamic']:>7s} {t['dynamic_tp']:9.3f} "
              f"{t['dynamic_tp'] / t['static_tp']:10.3f} {t['dynamic_tp'] / t['lp']:7.3f} "
              f"{t['judge']:10.3f}")  # fmt: skip


def check(table: list[dict]) -> list[dict]:
    """The rows at 30% noise where the best dynamic policy is below the best static plan."""
    return [t for t in table if t["noise"] == 0.3 and t["dynamic_tp"] < t["static_tp"]]


def plot(rows: list[dict]):
    """Two figures: throughput against noise (one panel per noise kind and instance,
    relative to the best static plan at zero noise, with the LP bound), and the peak
    memory of each device at zero noise against the cap."""
    insts = list(dict.fromkeys((r["model"], r["heterogeneity"]) for r in rows))
    methods = ["1f1b_judge", *STATIC, *DYNAMIC]
    fig, axes = plot_style.panels(len(KINDS) * len(insts), max_cols=2, size=(5.0, 3.2),
                                  sharey=True)  # fmt: skip
    for ax, (kind, inst) in zip(axes, itertools.product(KINDS, insts), strict=True):
        sel = [r for r in rows if (r["model"], r["heterogeneity"]) == inst]
        ref = best([r for r in sel if r["noise"] == 0], STATIC)[1] / 100
        for k, method in enumerate(methods):
            ys = []
            for n in NOISE:
                got = [r["throughput"] for r in sel if r["method"] == method and r["noise"] == n
                       and (r["noise_kind"] == kind or n == 0)]  # fmt: skip
                ys.append(statistics.mean(got) / ref if got else float("nan"))
            ax.plot([100 * n for n in NOISE], ys,
                    **plot_style.line(method, stack=(k, len(methods))))  # fmt: skip
        ax.axhline(sel[0]["lp_bound"] / ref, **plot_style.line("LP bound", linewidth=1))
        ax.set_title(f"{inst[0]}, {inst[1]} ({kind} noise)")
        plot_style.axis_labels(ax, NOISE_AXIS, RELATIVE_AXIS)
    plot_style.legend(fig)
    # peak memory per device at zero noise, per method, against the cap
    memory, axes = plot_style.panels(len(insts), max_cols=2, size=(5.5, 3.4))
    width = 0.8 / len(methods)
    for ax, inst in zip(axes, insts, strict=True):
        sel = [r for r in rows if (r["model"], r["heterogeneity"]) == inst and r["noise"] == 0
               and r["seed"] == 0]  # fmt: skip
        for k, method in enumerate(methods):
            r = next(r for r in sel if r["method"] == method)
            peaks = [r[f"peak_d{u}"] / 2**20 for u in range(DEVICES)]
            ax.bar([u + (k - (len(methods) - 1) / 2) * width for u in range(DEVICES)], peaks,
                   width, **plot_style.bar(method))  # fmt: skip
        ax.axhline(sel[0]["cap"] / 2**20, **plot_style.line("memory cap", linewidth=1))
        ax.set_xticks(range(DEVICES), [f"d{u}" for u in range(DEVICES)])
        ax.set_xlabel("device")
        ax.set_title(f"{inst[0]}, {inst[1]}: peak memory at 0% noise")
        ax.set_ylabel(plot_style.axis_label("peak memory", "MiB"))
        ax.grid(False, axis="x")
    plot_style.legend(memory)
    return fig, memory


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (used by tests)")
    parser.add_argument("--out", default="results/dynamic_training", help="output folder")
    args = parser.parse_args(argv)
    profiles = sorted((ROOT / "examples" / "profiles").glob("*.json"))
    if args.quick:
        profiles, seeds, m = profiles[:1], 2, 12
    else:
        seeds, m = 5, 16
    rows = []
    for path, (het, speeds) in itertools.product(profiles, HETEROGENEITY.items()):
        pb = instance(path, speeds, m)
        for r in run_instance(pb, seeds):
            rows.append({"model": path.stem, "heterogeneity": het, **r})
        print(f"{path.stem}, {het}: done", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "dynamic_training.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    throughput, memory = plot(rows)
    plot_style.save(throughput, out / "dynamic_training.png")
    plot_style.save(memory, out / "dynamic_training_memory.png")
    table = summary(rows)
    print_table(table)
    failed = check(table)
    n30 = sum(t["noise"] == 0.3 for t in table)
    print(
        f"at 30% noise the best dynamic policy reaches the best static plan on "
        f"{n30 - len(failed)} of {n30} instance x noise kind; every run is within its LP bound"
    )
    print(
        f"wrote {out / 'dynamic_training.csv'} ({len(rows)} rows), dynamic_training.png, "
        "dynamic_training_memory.png"
    )
    return rows


if __name__ == "__main__":
    main()

"""Steady-state inference pipelines on heterogeneous platforms: static versus dynamic.

For each profiled chain in ``examples/profiles/`` and each platform (1 fast + 3 slow
devices with fast, slow, or fast-to-the-fast-device-only links; and 4 identical
devices), map the chain with the static solvers (``pipeline_dp`` on identical
devices, ``pipeline_milp``, ``pipeline_greedy``) and run it in the discrete-event
simulator, and run the pipeline's task graph (one task per stage and item) under the
dynamic policies ``eager`` and ``dmda`` and the static list scheduler ``heft``. Task
times get multiplicative log-normal noise of level 0, 10% and 30%: ``task`` noise is
independent per task; ``task+device`` adds a persistent per-device factor of the same
level (devices slower or faster than their profile all along; full runs only).
Throughput = items / makespan of the same number of items for every method; the
analytical period of the static mappings is in the CSV too. Weights are taken as
0 and memory as unlimited (the profiles hold no parameter sizes). Chains are merged
into 12 (full) or 6 (quick) groups of near-equal forward time, which keeps the MILP
within its time limit.

Writes ``steady_state.csv`` and ``steady_state.png`` under ``--out``.

    python paper_experiments/steady_state.py [--quick] [--out results/steady_state]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import schedir  # noqa: E402
import solvers  # noqa: E402
from schedir import Chain, Device, Link, Platform, plot_style  # noqa: E402
from schedir.dynamic import pipeline_graph  # noqa: E402
from schedir.pipeline.problem import PipelineProblem  # noqa: E402
from schedir.pipeline.simulate import Noise, simulate_pipeline  # noqa: E402
from solvers.pipeline.dynamic import run_policy  # noqa: E402

STATIC = ["pipeline_dp", "pipeline_milp", "pipeline_greedy"]
DYNAMIC = ["eager", "dmda", "heft"]
NOISE = [0.0, 0.1, 0.3]
FIELDS = ["model", "stages", "platform", "method", "kind", "noise_kind", "noise", "seed", "items",
          "throughput", "relative", "model_period", "exact", "solve_time"]  # fmt: skip


def coarsen(chain: Chain, parts: int) -> Chain:
    """Merge consecutive stages into ``parts`` groups of near-equal forward time."""
    L = chain.length
    if parts >= L:
        return chain
    target = sum(chain.fwd_time[:L]) / parts
    cuts, acc = [0], 0.0
    for k in range(L):
        acc += chain.fwd_time[k]
        if acc >= target * len(cuts) and len(cuts) < parts and k + 1 < L:
            cuts.append(k + 1)
    cuts.append(L)
    g = list(zip(cuts, cuts[1:], strict=False))
    return Chain(
        fwd_time=(*(sum(chain.fwd_time[a:b]) for a, b in g), chain.fwd_time[L]),
        bwd_time=(*(sum(chain.bwd_time[a:b]) for a, b in g), chain.bwd_time[L]),
        in_size=(*(chain.in_size[a] for a, _ in g), chain.in_size[L]),
        saved_size=(*(sum(chain.saved_size[a:b]) for a, b in g), 0),
        fwd_tmp=(*(max(chain.fwd_tmp[a:b]) for a, b in g), 0),
        bwd_tmp=(*(max(chain.bwd_tmp[a:b]) for a, b in g), chain.bwd_tmp[L]),
    )


def platforms(chain: Chain) -> dict[str, Platform]:
    """Bandwidths relative to the chain: a mean activation takes ``r`` mean stage times."""
    L = chain.length
    stage = sum(chain.fwd_time[:L]) / L
    act = sum(chain.in_size[1:L]) / max(1, L - 1)

    def bw(r: float) -> float:
        return act / (r * stage)

    hetero = [Device("fast", 3.0)] + [Device(f"slow{i}", 1.0) for i in range(3)]
    star_links = []
    for a in hetero:
        for b in hetero:
            if a != b:
                near = "fast" in (a.name, b.name)
                star_links.append(Link(a.name, b.name, bw(0.2 if near else 2.0), 0.0))
    return {
        "1fast+3slow, fast links": Platform.fully_connected(hetero, bw(0.2)),
        "1fast+3slow, slow links": Platform.fully_connected(hetero, bw(1.5)),
        "1fast+3slow, fast hub": Platform(devices=tuple(hetero), links=tuple(star_links)),
        "4 identical": Platform.fully_connected([Device(f"gpu{i}") for i in range(4)], bw(0.5)),
    }


def static_solve(pb: PipelineProblem, method: str, **opts):
    """``solvers.solve`` with no budget: the devices' own memories bound the mapping, and
    the simulator judges the schedule (meta: solve_time, exact, time_limited)."""
    return solvers.solve(pb, None, method, **opts)


def run(profiles: list[Path], items: int, seeds: int, parts: int | None, milp_limit: float,
        kinds: tuple[str, ...] = ("task",)):  # fmt: skip
    rows = []
    for path in profiles:
        chain = schedir.load(path)
        if parts:
            chain = coarsen(chain, parts)
        for pname, plat in platforms(chain).items():
            pb = PipelineProblem(chain, [0] * chain.length, plat, items)
            graph = pipeline_graph(pb, items)
            local = []
            for method in STATIC:
                opts = {"time_limit": milp_limit} if method == "pipeline_milp" else {}
                try:
                    s = static_solve(pb, method, **opts)
                except (schedir.InvalidProblem, solvers.Infeasible):
                    continue  # pipeline_dp needs identical devices
                for kind, noise, seed in itertools.product(kinds, NOISE, range(seeds)):
                    dev = noise if kind == "task+device" else 0.0
                    tr = simulate_pipeline(pb, s, items=items, release_interval=0.0,
                                               noise=Noise(noise, seed, dev))  # fmt: skip
                    local.append({"method": method, "kind": "static", "noise": noise,
                                      "noise_kind": kind,
                                      "seed": seed, "throughput": items / tr.makespan,
                                      "model_period": s.meta["period"],
                                      "exact": s.meta["exact"],
                                      "solve_time": s.meta["solve_time"]})  # fmt: skip
            for method in DYNAMIC:
                for kind, noise, seed in itertools.product(kinds, NOISE, range(seeds)):
                    dev = noise if kind == "task+device" else 0.0
                    start = time.perf_counter()
                    tr = run_policy(graph, plat, method, noise=Noise(noise, seed, dev))
                    local.append({"method": method, "kind": "dynamic", "noise": noise,
                                      "noise_kind": kind,
                                      "seed": seed, "throughput": items / tr.makespan,
                                      "model_period": "", "exact": False,
                                      "solve_time": time.perf_counter() - start})  # fmt: skip
            best = max(r["throughput"] for r in local if r["kind"] == "static" and r["noise"] == 0)
            for r in local:
                rows.append({"model": path.stem, "stages": chain.length, "platform": pname,
                             "items": items, **r, "relative": r["throughput"] / best})  # fmt: skip
    return rows


# the axes of throughput against noise (here and in dynamic_training.py)
NOISE_AXIS, RELATIVE_AXIS = ("task-time noise", "%"), ("throughput", "% of best static at 0%")


def plot(rows: list[dict]):
    """Throughput against task-time noise, one panel per platform and noise kind."""
    plats = list(dict.fromkeys(r["platform"] for r in rows))
    kinds = list(dict.fromkeys(r["noise_kind"] for r in rows))
    fig, axes = plot_style.panels(len(kinds) * len(plats), max_cols=2, size=(5.0, 3.2),
                                  sharey=True)  # fmt: skip
    methods = STATIC + DYNAMIC
    for ax, (kind, pname) in zip(axes, itertools.product(kinds, plats), strict=True):
        for k, method in enumerate(methods):
            sel = [r for r in rows if r["platform"] == pname and r["method"] == method
                   and r["noise_kind"] == kind]  # fmt: skip
            if not sel:
                continue
            ys = [100 * np.mean([r["relative"] for r in sel if r["noise"] == n]) for n in NOISE]
            ax.plot([100 * n for n in NOISE], ys,
                    **plot_style.line(method, stack=(k, len(methods))))  # fmt: skip
        ax.set_title(f"{pname} ({kind} noise)")
        plot_style.axis_labels(ax, NOISE_AXIS, RELATIVE_AXIS)
    plot_style.legend(fig)
    return fig


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (used by tests)")
    parser.add_argument("--out", default="results/steady_state", help="output folder")
    args = parser.parse_args(argv)
    profiles = sorted((ROOT / "examples" / "profiles").glob("*.json"))
    if args.quick:
        rows = run(profiles[:1], items=40, seeds=1, parts=6, milp_limit=20.0)
    else:
        rows = run(profiles, items=200, seeds=3, parts=12, milp_limit=60.0,
                   kinds=("task", "task+device"))  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "steady_state.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    plot_style.save(plot(rows), out / "steady_state.png")
    print(f"wrote {out / 'steady_state.csv'} ({len(rows)} rows) and steady_state.png")
    return rows


if __name__ == "__main__":
    main()

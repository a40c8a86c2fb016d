"""Remat and host offload chosen together by the automatic planner, against remat alone
and JAX's hand offload policy (docs/auto.md, "Host offload").

For each model of ``examples/auto_models.py`` (and a 24-layer transformer) and budgets
from store-all down to the least: the predicted overhead (roofline seconds of the step
over the plain step's, copies on their own engines) of ``jax_exec.plan``'s remat-only
plan, of offload alone (no recomputation: store-all's recordings of the first blocks
copied out and prefetched one backward ahead, the fewest that fit) and of the joint
remat + offload plan at the host-link presets of
``schedir.PRESETS`` (PCIe 4 and 5, NVLink-C2C class), and the share of the remat
overhead that offloading removes. The anchor: Beaumont, Eyraud-Dubois, Shilova
(NeurIPS 2021, "POFO") remove about a third of rotor's overhead at PCIe bandwidths on
large networks. JAX's hand policy, ``save_and_offload_only_these_names`` of the matmul
outputs (every block under ``checkpoint_dots`` with its saved values offloaded after its
forward and prefetched before its backward), is priced by the same simulators at its
own device peak, next to the joint plan at that budget.

Every figure is predicted (the planner's estimates: ``exact=False``, temporaries
estimated, times from the roofline cost model); the tests check that offload plans run
op by op with the predicted bytes and compile to the plain gradients.

Writes ``auto_offload.csv``, ``auto_offload.md`` and ``auto_offload.png``.

    python paper_experiments/auto_offload.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from auto_models import MODELS, gpt  # noqa: E402

from jax_exec import auto  # noqa: E402
from jax_exec.auto.reference import reference_schedule  # noqa: E402
from schedir import (  # noqa: E402
    B,
    F_all,
    Loss,
    Offload,
    OffloadProblem,
    Platform,
    Prefetch,
    Wait,
    plot_style,  # noqa: E402
    simulate_offload,
)
from schedir.blocks.schedule import BlockSchedule  # noqa: E402
from schedir.blocks.simulate import simulate_blocks  # noqa: E402
from schedir_cli.common import make_folder  # noqa: E402

PRESETS = ("pcie4", "pcie5", "nvlink-c2c")
FRACTIONS = (1.0, 0.8, 0.6, 0.45, 0.3)
FIELDS = ["model", "link", "budget_fraction", "budget", "remat_overhead", "joint_overhead",
          "removed", "offloaded", "offload_only_overhead", "hand_peak_fraction",
          "hand_overhead"]  # fmt: skip


def hand_policy(p, platform: Platform) -> tuple[int, float] | None:
    """JAX's ``save_and_offload_only_these_names`` of the matmul outputs: every block
    recorded under ``checkpoint_dots``, its recording offloaded after its forward and
    prefetched before its backward; ``(device peak, makespan)``."""
    bm = p.base or p.model
    try:
        options = tuple(
            [o.label for o in bm.options[k]].index("checkpoint_dots") for k in range(bm.length)
        )
    except ValueError:
        return None
    L = bm.length
    ops: list = [F_all(0)]
    for k in range(1, L):  # block k's forward read abar[k]: it goes to the host
        ops += [F_all(k), Offload(f"abar[{k}]"), Wait(f"abar[{k}]")]
    ops.append(Loss())
    for k in range(L - 1, -1, -1):  # B(k) reads abar[k] (prefetched) and abar[k+1]
        if k >= 1:
            ops += [Prefetch(f"abar[{k}]"), Wait(f"abar[{k}]")]
        ops.append(B(k))
    schedule = BlockSchedule(tuple(ops), {}, options)
    peak = simulate_blocks(bm.problem, schedule).peak_memory
    chain = bm.problem.to_chain(options)
    makespan = simulate_offload(OffloadProblem(chain, platform), schedule.ops).makespan
    return peak, makespan


def offload_only(p, platform: Platform, budget: int) -> float | None:
    """Offload without recomputation: every block recorded once under store-all's
    options; the recordings of blocks 1..n (the longest idle first) copied to the host
    after the next block's forward has read them (waited for one forward later) and
    prefetched one backward ahead of their own; the least n whose device peak fits.
    The makespan of that schedule, or None when no n fits."""
    bm = p.base or p.model
    options = reference_schedule(bm).options
    L = bm.length
    chain = bm.problem.to_chain(options)
    for n in range(L):
        chosen = set(range(1, n + 1))
        ops: list = [F_all(0)]
        pending = None
        for k in range(1, L):
            ops.append(F_all(k))
            if pending:
                ops.append(Wait(pending))
                pending = None
            if k in chosen:
                ops.append(Offload(f"abar[{k}]"))
                pending = f"abar[{k}]"
        if pending:
            ops.append(Wait(pending))
        if L - 1 in chosen:
            ops.append(Prefetch(f"abar[{L - 1}]"))
        ops.append(Loss())
        for k in range(L - 1, -1, -1):
            if k in chosen:
                ops.append(Wait(f"abar[{k}]"))
            if k - 1 in chosen:
                ops.append(Prefetch(f"abar[{k - 1}]"))
            ops.append(B(k))
        schedule = BlockSchedule(tuple(ops), {}, options)
        if simulate_blocks(bm.problem, schedule).peak_memory <= budget:
            return simulate_offload(OffloadProblem(chain, platform), schedule.ops).makespan
    return None


def run_model(name: str, make, quick: bool) -> list[dict]:
    factory, loss_fn, args = make(quick=quick)
    top = auto.plan(loss_fn, factory(), *args, budget="100%", exact=False)
    least = top.least_budget()
    rows = []
    fractions = FRACTIONS[::2] if quick else FRACTIONS
    for link in PRESETS:
        platform = Platform.host_offload(link)
        hand = hand_policy(top, platform)
        for fraction in fractions:
            budget = max(int(top.store_all_peak * fraction), least)
            remat = top.replan(budget, platform=None)
            joint = top.replan(budget, platform=platform)
            gap = remat.overhead
            removed = (gap - joint.overhead) / gap if gap > 1e-9 else 0.0
            alone = offload_only(top, platform, budget)
            row = {
                "model": name, "link": link,
                "budget_fraction": round(budget / top.store_all_peak, 3),
                "budget": budget, "remat_overhead": remat.overhead,
                "joint_overhead": joint.overhead, "removed": removed,
                "offloaded": len(joint.schedule.meta.get("offloaded", [])),
                "offload_only_overhead": "" if alone is None
                                         else alone / top.store_all_time - 1.0,
                "hand_peak_fraction": "", "hand_overhead": "",
            }  # fmt: skip
            if hand is not None and fraction == fractions[0]:
                row["hand_peak_fraction"] = hand[0] / top.store_all_peak
                row["hand_overhead"] = hand[1] / top.store_all_time - 1.0
            rows.append(row)
    return rows


def summary(rows: list[dict]) -> str:
    lines = [
        "| model | link | budget (% store-all) | remat only | offload only | remat + offload "
        "| removed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        alone = r["offload_only_overhead"]
        alone = "does not fit" if alone == "" else f"{100 * float(alone):+.1f}%"
        lines.append(
            f"| {r['model']} | {r['link']} | {100 * r['budget_fraction']:.0f}% | "
            f"{100 * r['remat_overhead']:+.1f}% | {alone} | {100 * r['joint_overhead']:+.1f}% | "
            f"{100 * r['removed']:.0f}% |"
        )
    hands = [r for r in rows if r["hand_overhead"] != ""]
    if hands:
        lines += ["", "| model | link | JAX's dots-offload policy: peak | its overhead |",
                  "|---|---|---|---|"]  # fmt: skip
        for r in hands:
            lines.append(f"| {r['model']} | {r['link']} | {100 * r['hand_peak_fraction']:.0f}% | "
                         f"{100 * r['hand_overhead']:+.1f}% |")  # fmt: skip
    recomputing = [r for r in rows if r["remat_overhead"] > 1e-3]
    for link in PRESETS:
        here = [r["removed"] for r in recomputing if r["link"] == link]
        if here:
            lines.append(f"\n{link}: offload removes {100 * sum(here) / len(here):.0f}% of the "
                         f"remat overhead on average over {len(here)} budgets where remat "
                         f"recomputes (POFO: about a third at PCIe class).")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(rows: list[dict]):
    """Predicted overhead against the budget, one panel per model: remat only
    (``auto``), the joint plans per host link, JAX's hand offload policy at its peak."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plot_style.panels(len(models), max_cols=2, size=(5.0, 3.6))
    for ax, name in zip(axes, models, strict=True):
        mine = [r for r in rows if r["model"] == name]
        series = {"auto": [(r["budget_fraction"], r["remat_overhead"]) for r in mine
                           if r["link"] == PRESETS[0]]}  # fmt: skip
        for link in PRESETS:
            series[f"auto + offload {link}"] = [(r["budget_fraction"], r["joint_overhead"])
                                                for r in mine if r["link"] == link]  # fmt: skip
        for k, (label, pts) in enumerate(series.items()):
            xs, ys = zip(*sorted((100 * x, 100 * y) for x, y in pts), strict=True)
            ax.plot(xs, ys, **plot_style.line(label, stack=(k, len(series))))
        for r in mine:
            if r["hand_overhead"] != "":
                ax.plot([100 * r["hand_peak_fraction"]], [100 * r["hand_overhead"]],
                        **plot_style.line(f"checkpoint_dots + offload {r['link']}"))  # fmt: skip
        ax.set_title(f"{name} (predicted)")
        plot_style.axis_labels(ax, ("memory budget", "% of store-all peak"),
                               ("overhead vs store-all", "%"))  # fmt: skip
    plot_style.legend(fig)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, three budgets")
    parser.add_argument("--out", default="results/auto_offload", help="output directory")
    ns = parser.parse_args(argv)
    out = Path(ns.out)
    make_folder(out)  # says on stderr when it creates it
    models = dict(MODELS)
    models["gpt24"] = lambda quick: gpt(quick=quick, depth=24)
    if ns.quick:
        models = {k: models[k] for k in ("gpt", "resnet")}
    rows = []
    for name, make in models.items():
        if name == "scanned":
            continue  # the scanned stack: the same layers as the GPT
        start = time.perf_counter()
        rows += run_model(name, make, ns.quick)
        print(f"auto_offload: {name} done in {time.perf_counter() - start:.1f} s", flush=True)
    with open(out / "auto_offload.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    text = summary(rows)
    (out / "auto_offload.md").write_text(text)
    plot_style.save(plot(rows), out / "auto_offload.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

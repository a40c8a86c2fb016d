"""Regenerate the figures of docs/concepts.md and docs/cli.md (committed PNGs).

.venv/bin/python docs/img/make_figures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import schedir  # noqa: E402
import solvers  # noqa: E402
from schedir import render  # noqa: E402

HERE = Path(__file__).resolve().parent


def cost_model_figure(chain: schedir.Chain, path: Path) -> None:
    """Left: memory over time of three schedules. Right: makespan versus budget."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    cases = [("store_all", 10**9), ("rotor", 1300), ("recompute_all", 1200)]
    for method, budget in cases:
        schedule = solvers.solve(chain, budget, method)
        trace = schedir.simulate(chain, schedule)
        times, values = render.memory_curve(trace)
        left.step(times, values, where="post",
                  label=f"{method}: {trace.makespan:g} s, peak {trace.peak_memory} B")  # fmt: skip
    left.set_xlabel("time (s)")
    left.set_ylabel("memory (bytes)")
    left.set_title("memory curve of one training step (chain_small.json)", fontsize=9)
    left.legend(fontsize=7)
    budgets = list(range(1100, 1700, 10))
    for method in ("rotor", "revolve", "chen_sqrt", "recompute_all", "store_all"):
        curve = solvers.tradeoff(chain, budgets, method)
        right.step(budgets, curve.makespans, where="post", label=method)
    right.set_xlabel("memory budget (bytes)")
    right.set_ylabel("makespan (s)")
    right.set_title("trade-off: least makespan under a budget", fontsize=9)
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    chain = schedir.load(ROOT / "examples" / "chain_small.json")
    cost_model_figure(chain, HERE / "cost_model.png")
    schedule = solvers.solve(chain, 1400, "rotor")
    render.plot(chain, schedule, HERE / "schedule_rotor.png")
    print("wrote", HERE / "cost_model.png", HERE / "schedule_rotor.png")


if __name__ == "__main__":
    main()

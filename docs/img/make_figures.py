"""Regenerate the figures of docs/concepts.md, docs/cli.md and docs/auto.md (committed
PNGs).

.venv/bin/python docs/img/make_figures.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import schedir  # noqa: E402
import solvers  # noqa: E402
from schedir import plot_style, render  # noqa: E402

HERE = Path(__file__).resolve().parent


def plan_figure():
    """docs/auto.md's: the GPT of examples/auto_models.py (quick sizes) planned at 50%."""
    from jax_exec import auto

    # by path: tests/ has an auto_models module too, which a test process may hold
    path = ROOT / "examples" / "auto_models.py"
    spec = importlib.util.spec_from_file_location("example_models", path)
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    factory, loss_fn, args = models.gpt(quick=True)
    return auto.plan(loss_fn, factory(), *args, budget="50%").figure()


def cost_model_figure(chain: schedir.Chain):
    """Left: memory over time of three schedules. Right: makespan versus budget."""
    fig, (left, right) = plot_style.panels(2, size=(5.5, 3.8))
    cases = [("store_all", 10**9), ("rotor", 1300), ("recompute_all", 1200)]
    scale, unit = render.byte_unit(1600)
    for method, budget in cases:
        trace = schedir.simulate(chain, solvers.solve(chain, budget, method))
        times, values = render.memory_curve(trace)
        left.step(times, [v / scale for v in values], where="post",
                  **plot_style.line(method, markevery=0.3))  # fmt: skip
    left.set_xlabel(plot_style.axis_label("time", "s"))
    left.set_ylabel(plot_style.axis_label("memory", unit))
    left.set_title("memory over one training step (chain_small.json)")
    budgets = list(range(1100, 1700, 10))
    methods = ("rotor", "revolve", "chen_sqrt", "recompute_all", "store_all")
    for k, method in enumerate(methods):
        curve = solvers.tradeoff(chain, budgets, method)
        right.step([b / scale for b in budgets], curve.makespans, where="post",
                   **plot_style.line(method, markevery=0.15, stack=(k, len(methods))))  # fmt: skip
    right.set_xlabel(plot_style.axis_label("memory budget", unit))
    right.set_ylabel(plot_style.axis_label("makespan", "s"))
    right.set_title("least makespan under a budget")
    plot_style.legend(fig)
    return fig


def main() -> None:
    chain = schedir.load(ROOT / "examples" / "chain_small.json")
    plot_style.save(cost_model_figure(chain), HERE / "cost_model.png")
    schedule = solvers.solve(chain, 1400, "rotor")
    render.plot(chain, schedule, HERE / "schedule_rotor.png")
    plot_style.save(plan_figure(), HERE / "auto_plan_gpt.png")
    print(
        "wrote", *(HERE / n for n in ("cost_model.png", "schedule_rotor.png", "auto_plan_gpt.png"))
    )


if __name__ == "__main__":
    main()

"""The automatic planner on three Flax models, next to JAX's own checkpoint policies.

For the GPT (tied embeddings, dropout, integer tokens), the ResNet (BatchNorm in
training mode) and the U-Net (skip concatenations) of ``examples/auto_models.py``:
plan the training step at budgets from the least feasible one to the store-all peak
(``jax_exec.plan``, exact: the kernels each schedule runs are compiled, so the
predicted peak is the op-by-op runtime's), and print the predicted activation peak and
time overhead of each, next to JAX's policies ``checkpoint_dots``,
``nothing_saveable`` and ``everything_saveable`` applied to every block, rotor on the
chain of the store-all options (``method="rotor"``), the whole-graph save-set MILP
that ``auto`` falls back to on small graphs (``method="whole_milp"``), DTR and
Checkmate's MILP on the block graph (``method="dtr"``, ``"checkmate_milp"``: 10 s
each, at the middle budget),
all priced by the exact simulators of the op-by-op runtime. One PNG per model plots
all of them, and another draws auto's plan at the middle budget: its ops on a timeline
and the memory after every op under the budget (``Plan.figure()``; ``--out``).

Then trains the GPT a few optax steps with ``jax_exec.auto.value_and_grad`` at 50% of
the store-all peak and checks its losses equal the plain ``nnx.value_and_grad`` loop's.

    PYTHONPATH=. python examples/auto_schedule.py [--quick] [--out results/auto_schedule]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from auto_models import MODELS, budget_sweep, policy_plans  # noqa: E402

import solvers  # noqa: E402
from jax_exec import auto  # noqa: E402
from schedir import plot_style  # noqa: E402

SWEPT = ("whole_milp", "rotor", "dtr")  # other methods planned at every budget of the sweep

KIB = 1024


def curves(name: str, quick: bool, points: int) -> tuple[dict, int, auto.Plan]:
    """``{method: [(peak bytes, overhead), ...]}`` for one model, its store-all peak
    (bytes) and auto's plan at the middle budget; prints a table."""
    factory, loss_fn, args = MODELS[name](quick=quick)
    start = time.perf_counter()
    p = auto.plan(loss_fn, factory(), *args, budget="100%")
    budgets = budget_sweep(p, points)
    print(f"\n{name}: {len(p.model.program.eqns)} equations, {p.problem.length} blocks + loss; "
          f"store-all peak {p.store_all_peak / KIB:,.1f} KiB, least feasible "
          f"{budgets[0] / KIB:,.1f} KiB")  # fmt: skip
    print(f"  {'method':<20} {'budget KiB':>11} {'peak KiB':>10} {'of store-all':>12} "
          f"{'overhead':>9}")  # fmt: skip
    result: dict = {"auto": []}
    middle = budgets[len(budgets) // 2]
    for budget in budgets:
        q = p.replan(budget)
        if budget == middle:
            shown = q
        peak = q.schedule.meta["peak_memory"]
        result["auto"].append((peak, q.overhead))
        print(f"  {'auto':<20} {budget / KIB:>11,.1f} {peak / KIB:>10,.1f} "
              f"{peak / p.store_all_peak:>12.0%} {q.overhead:>+9.1%}")  # fmt: skip
    for policy, q in policy_plans(p).items():
        peak = q.schedule.meta["peak_memory"]
        result[policy] = [(peak, q.overhead)]
        print(f"  {policy:<20} {'-':>11} {peak / KIB:>10,.1f} "
              f"{peak / p.store_all_peak:>12.0%} {q.overhead:>+9.1%}")  # fmt: skip
    runs = [(m, b, {}) for m in SWEPT for b in budgets]
    runs.append(("checkmate_milp", middle, {"time_limit": 10, "graph_option": "nothing_saveable"}))
    for method, budget, options in runs:
        try:
            q = p.replan(budget, method=method, **options)
        except solvers.Infeasible:
            continue
        peak = q.schedule.meta["peak_memory"]
        result.setdefault(method, []).append((peak, q.overhead))
        note = f" ({q.schedule.meta['status']})" if "status" in q.schedule.meta else ""
        print(f"  {method:<20} {budget / KIB:>11,.1f} {peak / KIB:>10,.1f} "
              f"{peak / p.store_all_peak:>12.0%} {q.overhead:>+9.1%}{note}")  # fmt: skip
    count = sum(len(pts) for pts in result.values())
    print(f"  planned {count} schedules in {time.perf_counter() - start:.1f} s")
    return result, p.store_all_peak, shown


def plot(name: str, result: dict, store_all_peak: int):
    """Predicted overhead against the predicted activation peak, every method."""
    fig, (ax,) = plot_style.panels(1, size=(6.5, 4.0))
    for k, (method, pts) in enumerate(result.items()):
        xs = [100 * peak / store_all_peak for peak, _ in pts]
        ys = [100 * overhead for _, overhead in pts]
        ax.plot(xs, ys, **plot_style.line(method, stack=(k, len(result))))
    ax.set_xlabel(plot_style.axis_label("predicted activation peak", "% of store-all peak"))
    ax.set_ylabel(plot_style.OVERHEAD)
    ax.set_title(f"{name}: jax_exec.plan, every method (predicted)")
    plot_style.legend(fig)
    return fig


def train(quick: bool, steps: int) -> None:
    """A few adam steps of the GPT with the planner's value_and_grad and with plain
    nnx.value_and_grad: the losses must be equal."""
    factory, loss_fn, args = MODELS["gpt"](quick=quick)

    def losses(grad_fn) -> list[float]:
        model = factory()
        opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

        @nnx.jit
        def step(model, opt, *batch):
            loss, grads = grad_fn(model, *batch)
            opt.update(model, grads)
            return loss

        return [float(step(model, opt, *args)) for _ in range(steps)]

    ours = losses(auto.value_and_grad(loss_fn, budget="50%"))
    plain = losses(nnx.value_and_grad(loss_fn))
    np.testing.assert_allclose(ours, plain, rtol=1e-5)
    print(f"\ngpt trained {steps} adam steps with auto.value_and_grad(budget='50%'): "
          f"losses {', '.join(f'{x:.5f}' for x in ours)} (plain nnx.value_and_grad: "
          f"{', '.join(f'{x:.5f}' for x in plain)}): equal")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, fewer budgets")
    parser.add_argument("--out", default="results/auto_schedule", help="folder of the PNGs")
    parser.add_argument("--points", type=int, help="budgets per model (default 4, 8)")
    parser.add_argument("--steps", type=int, default=3, help="training steps")
    ns = parser.parse_args(argv)
    points = ns.points or (4 if ns.quick else 8)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("gpt", "resnet", "unet"):
        result, store_all_peak, middle = curves(name, ns.quick, points)
        path = plot_style.save(
            plot(name, result, store_all_peak), out / f"auto_schedule_{name}.png"
        )
        drawn = plot_style.save(middle.figure(), out / f"auto_plan_{name}.png")
        print(f"  figures: {path}, {drawn}")
    train(ns.quick, ns.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

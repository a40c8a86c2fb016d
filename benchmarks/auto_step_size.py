"""The size of the planned step against the plain step's, over the model zoo (tests/zoo):
the number of StableHLO operations of ``jax.jit(jax.value_and_grad(plan.lowered()))``
lowered, over plain ``jax.jit(nnx.value_and_grad)``'s, at store-all, 65% and the least
budget, and the optimized HLO instructions XLA compiles; also the XLA compile seconds'
ratio (one run each: noisy on a loaded machine, where the counts are not: they are
deterministic).

    python benchmarks/auto_step_size.py [--families a,b] [--budgets 100%,65%,least]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import jax
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
sys.path.append(str(ROOT / "tests"))  # the zoo (appended: tests/ holds package-named folders)

import zoo  # noqa: E402

import solvers  # noqa: E402
from jax_exec import auto  # noqa: E402
from jax_exec.execute.lowering import scan_runs  # noqa: E402

OP = re.compile(r'^\s*(?:%[^=]+= )?"?(?:stablehlo|chlo|func\.call|sdy)[.\w]*')
HLO = re.compile(r"^\s+(?:ROOT )?%?[\w.\-]+ = ")


def ops(lowered) -> int:
    """StableHLO operations of a lowered computation (every function, nested regions)."""
    return sum(1 for line in lowered.as_text().splitlines() if OP.match(line))


def instructions(compiled) -> int:
    """HLO instructions of the optimized computation (fusions' insides included)."""
    return sum(1 for line in compiled.as_text().splitlines() if HLO.match(line))


def measure(step, args) -> tuple[int, int, float]:
    """``(StableHLO ops, optimized HLO instructions, compile seconds)``."""
    lowered = jax.jit(step).lower(*args)
    start = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    return ops(lowered), instructions(compiled), seconds


def plain_step(factory, loss_fn):
    graphdef = nnx.split(factory(), nnx.Param, ...)[0]

    def step(params, rest, args):
        return nnx.value_and_grad(loss_fn)(nnx.merge(graphdef, params, rest), *args)

    return step


def plans(case, budgets):
    """``(label, plan)`` per budget ("least": the least budget; a budget below it: the
    least budget's plan, labelled so)."""
    model = case.factory()
    first = None
    for label in budgets:
        try:
            if label == "least":
                base = first or auto.plan(case.loss_fn, model, *case.args, budget="100%")
                p = base.replan(base.least_budget())
            elif first is None:
                p = first = auto.plan(case.loss_fn, model, *case.args, budget=label)
            else:
                p = first.replan(label)
        except solvers.Infeasible as err:
            p = (first or auto.plan(case.loss_fn, model, *case.args, budget="100%")).replan(
                err.min_budget
            )
            label = f"{label}>least"
        yield label, p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="", help="comma-separated zoo families")
    parser.add_argument("--budgets", default="100%,65%,least")
    ns = parser.parse_args(argv)
    families = ns.families.split(",") if ns.families else sorted(zoo.FAMILIES)
    print(f"{'family':>12} {'budget':>10} {'blocks':>6} {'looped':>6} {'ops':>7} {'plain':>7} "
          f"{'ratio':>6} {'hlo':>6} {'plain':>6} {'ratio':>6} {'compile':>8} "
          f"{'overhead':>9}")  # fmt: skip
    for name in families:
        case = zoo.case(name)
        _, params, rest = nnx.split(case.factory(), nnx.Param, ...)
        args = (params, rest, case.args)
        plain, plain_h, plain_s = measure(plain_step(case.factory, case.loss_fn), args)
        for label, p in plans(case, ns.budgets.split(",")):
            looped = sum(len(r.blocks) for r in scan_runs(p.model, p.schedule).values())
            step = jax.value_and_grad(p.lowered(), has_aux=True)
            n, h, s = measure(step, args)
            print(f"{name:>12} {label:>10} {p.model.length:>6} {looped:>6} {n:>7} {plain:>7} "
                  f"{n / plain:>6.2f} {h:>6} {plain_h:>6} {h / max(plain_h, 1):>6.2f} "
                  f"{s / plain_s:>7.2f}x {p.overhead:>+9.1%}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Planning time of the automatic planner on a 24-layer transformer (docs/auto.md).

Plans ``examples/auto_models.py``'s GPT (24 layers: a few thousand jaxpr equations) at
50% of its store-all peak with ``plan``'s default settings (``exact=True``: the kernels
the schedule runs are compiled for their temporary bytes) and prints the time of each
phase; target: under 30 s on a 2-core machine (``make bench`` runs ``--quick``). Without
``--quick`` it also plans without compiling kernels (``exact=False``: what
``value_and_grad`` does); ``--scan`` also plans the scanned transformer of the same
depth and reports the compile time of its compiled step.

    PYTHONPATH=. python benchmarks/auto_plan_time.py [--quick] [--depth 24] [--scan]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from auto_models import gpt, scanned  # noqa: E402

from jax_exec import auto  # noqa: E402

TARGET_SECONDS = 30.0


def report(name: str, make, depth: int, exact: bool, compile_step: bool) -> float:
    factory, loss_fn, args = make(quick=True, depth=depth)
    model = factory()
    start = time.perf_counter()
    p = auto.plan(loss_fn, model, *args, budget="50%", exact=exact)
    total = time.perf_counter() - start
    bm = p.model
    phases = dict(bm.timings)
    phases["solve"] = total - sum(phases.values())
    distinct = len({b.key for b in bm.blocks.blocks})
    print(f"{name}: {len(bm.program.eqns)} equations, {p.problem.length} blocks "
          f"({distinct} distinct), exact={exact}: planned in {total:.1f} s "
          f"(predicted overhead {p.overhead:+.1%})")  # fmt: skip
    rounds = p.schedule.meta["compile_rounds"]
    counts = f"; {len(bm._temps)} kernels compiled, {rounds} rounds"
    print("   " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()) + counts)
    if exact:
        verdict = "within" if total < TARGET_SECONDS else "OVER"
        print(f"   {verdict} the target of {TARGET_SECONDS:.0f} s")
    if compile_step:
        _, params, rest = nnx.split(model, nnx.Param, ...)
        start = time.perf_counter()
        step = jax.jit(jax.value_and_grad(p.lowered(), has_aux=True))
        step.lower(params, rest, args).compile()
        print(f"   compiled step: compiled in {time.perf_counter() - start:.1f} s")
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=24)
    parser.add_argument("--quick", action="store_true", help="only plan's default settings")
    parser.add_argument("--scan", action="store_true", help="also the scanned transformer")
    ns = parser.parse_args(argv)
    report("gpt", gpt, ns.depth, True, False)
    if not ns.quick:
        report("gpt", gpt, ns.depth, False, False)
    if ns.scan:
        report("scanned", scanned, ns.depth, False, True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Planning time of the automatic planner on a 24-layer transformer (docs/auto.md).

Plans ``examples/auto_models.py``'s GPT (24 layers: a few thousand jaxpr equations) at
50% of its store-all peak with ``plan``'s default settings (``exact=True``: the kernels
the schedule runs are compiled for their temporary bytes) and prints the time of each
phase; target: under 30 s on a 2-core machine (``make bench`` runs ``--quick``). Without
``--quick`` it also plans without compiling kernels (``exact=False``: what
``value_and_grad`` does); ``--scan`` also plans the scanned transformer of the same
depth and reports the XLA compile time of its compiled step with the scan runs kept as
loops (``lower(..., loops=True)``, the default), unrolled (``loops=False``), and of
plain ``jax.jit(nnx.value_and_grad(loss_fn))`` of the same model (which keeps the scan
as one loop), in the same run, with their ratios.

    PYTHONPATH=. python benchmarks/auto_plan_time.py [--quick] [--depth 24] [--scan | --only-scan]
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
from jax_exec.auto.lowering import lower, scan_runs  # noqa: E402

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
    counts = f"; {phases.pop('compiled', 0)} kernels compiled, {rounds} rounds"
    print("   " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()) + counts)
    if exact:
        verdict = "within" if total < TARGET_SECONDS else "OVER"
        print(f"   {verdict} the target of {TARGET_SECONDS:.0f} s")
    if compile_step:
        print("   the plan at 50%:")
        compile_times(p, factory, loss_fn, args)
        print("   the plan at the store-all peak:")
        compile_times(p.replan(p.store_all_peak), factory, loss_fn, args)
    return total


def compile_times(p, factory, loss_fn, args) -> dict[str, tuple[float, float]]:
    """``(trace and lower, XLA compile)`` seconds of the training step: plan ``p``'s
    compiled step with its scan runs as loops and unrolled, and plain
    ``jax.jit(nnx.value_and_grad)``."""
    graphdef, params, rest = nnx.split(factory(), nnx.Param, ...)

    def plain(params, rest, args):
        return nnx.value_and_grad(loss_fn)(nnx.merge(graphdef, params, rest), *args)

    steps = {
        "loops": jax.value_and_grad(lower(p.model, p.schedule, loops=True), has_aux=True),
        "unrolled": jax.value_and_grad(lower(p.model, p.schedule, loops=False), has_aux=True),
        "plain": plain,
    }
    runs = scan_runs(p.model, p.schedule)
    looped = sum(len(r.blocks) for r in runs.values())
    print(f"   compiled step: {len(runs)} scan runs hold {looped} of {p.model.length} blocks")
    times = {}
    for name, step in steps.items():
        start = time.perf_counter()
        lowered = jax.jit(step).lower(params, rest, args)
        traced = time.perf_counter() - start
        lowered.compile()
        times[name] = (traced, time.perf_counter() - start - traced)
    line = ", ".join(f"{name} {t:.1f} + {c:.1f} s" for name, (t, c) in times.items())
    (lt, lc), (ut, uc), (pt, pc) = times["loops"], times["unrolled"], times["plain"]
    print(f"   trace + XLA compile: {line}; XLA compile unrolled / loops {uc / lc:.1f}x, "
          f"loops / plain {lc / pc:.1f}x; in all unrolled / loops {(ut + uc) / (lt + lc):.1f}x, "
          f"loops / plain {(lt + lc) / (pt + pc):.1f}x")  # fmt: skip
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=24)
    parser.add_argument("--quick", action="store_true", help="only plan's default settings")
    parser.add_argument("--scan", action="store_true", help="also the scanned transformer")
    parser.add_argument("--only-scan", action="store_true", help="only the scanned transformer")
    ns = parser.parse_args(argv)
    if not ns.only_scan:
        report("gpt", gpt, ns.depth, True, False)
    if not ns.quick and not ns.only_scan:
        report("gpt", gpt, ns.depth, False, False)
    if ns.scan or ns.only_scan:
        report("scanned", scanned, ns.depth, False, True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

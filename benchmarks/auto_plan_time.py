"""Planning time of the automatic planner, and the compile time of the step it plans
(docs/auto.md, "Scripts and measured figures").

1. The model zoo (tests/zoo: tiny models written as the public Flax NNX implementations of
   well-known architectures are), each planned with ``plan``'s defaults (``exact=True``)
   at store-all and at 65% of it (the least budget where that is below; ``--least``:
   at the least budget too): planning
   seconds from cold caches (``jax_exec.program.compiled.clear_caches``; JAX's own tracing
   caches stay warm after the first family), the kernels compiled, and the XLA compile
   seconds of the planned step (``jax.jit`` of ``jax.value_and_grad(plan.lowered())``)
   over plain ``jax.jit(nnx.value_and_grad)``'s (medians of ``REPEAT`` compiles of each,
   in turns). Targets: planned in under 5 s, the
   planned step's compile at most 1.5x the plain one's. With each plan, the CPU
   seconds the process spent on it (every thread: tracing and lowering hold Python's
   lock, XLA compiles in other threads), and its floor on this machine: CPU seconds
   over the cores, below which no overlap of the same work can plan it.
2. ``examples/auto_models.py``'s 24-layer GPT planned at 50% (target: under 10 s), with
   the time of each phase; ``--scan`` also plans the scanned transformer of the same depth
   and compiles its step with the scan runs as loops and unrolled.

With ``--compilation-cache DIR`` JAX's persistent compilation cache holds every
executable, the planner's kernels included (``jax_compilation_cache_dir`` with no
minimum compile time or size): run twice with the same DIR, the second run plans with
the kernels read from disk (a process planning a model it planned before, as a
restarted script does; the plans are the same). The compiled step's ratio is not
measured then (its compile would be a cache read too).

Every figure is one run on this machine, with its load average printed: a shared 2-core
machine's times are upper bounds of an idle one's. The machine's speed at the start and
the end is printed too (``machine_speed``: one fixed step's tracing and XLA compile), to
compare runs made at other times.

    python benchmarks/auto_plan_time.py [--quick] [--families a,b] [--least] [--depth 24] [--scan]
                                        [--compilation-cache DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import jax
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
sys.path.append(str(ROOT / "tests"))  # the zoo (appended: tests/ holds package-named folders)

import zoo  # noqa: E402
from auto_models import gpt, scanned  # noqa: E402

import solvers  # noqa: E402
from jax_exec import auto  # noqa: E402
from jax_exec.execute.lowering import lower, scan_runs  # noqa: E402
from jax_exec.program.compiled import _KERNELS, clear_caches  # noqa: E402

PLAN_TARGET, GPT_TARGET, COMPILE_TARGET = 5.0, 10.0, 1.5
CORES = os.cpu_count() or 1
QUICK_FAMILIES = ("decoder_lm", "resnet", "t5", "vit")


def load() -> str:
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def machine_speed(repeat: int = 5) -> str:
    """This machine's speed now, for comparing runs made at other times (it moved by up
    to 2x within an hour on 2026-12-06): medians of ``repeat`` tracings and XLA compiles (at the
    planner's ``KERNEL_OPTIONS``) of one fixed gradient step, the two halves of a plan's
    work (with ``--compilation-cache`` the compiles are reads from it after the first
    run)."""
    import jax.numpy as jnp

    from jax_exec.program.compiled import KERNEL_OPTIONS

    def step(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w) + x
        return jnp.sum(x * x)

    shapes = (
        [jax.ShapeDtypeStruct((64, 64), jnp.float32)] * 8,
        jax.ShapeDtypeStruct((16, 64), jnp.float32),
    )
    traces, compiles = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        lowered = jax.jit(jax.grad(lambda *a: step(*a))).lower(*shapes)  # a fresh function
        traces.append(time.perf_counter() - start)
        start = time.perf_counter()
        lowered.compile(compiler_options=KERNEL_OPTIONS)
        compiles.append(time.perf_counter() - start)
    traced, compiled = statistics.median(traces) * 1e3, statistics.median(compiles) * 1e3
    return (f"reference step: tracing and lowering {traced:.0f} ms, XLA compile "
            f"{compiled:.0f} ms (medians of {repeat})")  # fmt: skip


REPEAT = 3  # XLA compiles of each step timed (the median: one compile moves by 10-20%)


def compile_seconds(step, *args) -> float:
    """XLA compile seconds of ``step`` (a fresh wrapper: JAX caches the executable of a
    traced function, so each call compiles)."""
    lowered = jax.jit(lambda *a: step(*a)).lower(*args)
    start = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - start


def compile_ratio(step, plain, *args) -> float:
    """Median XLA compile seconds of ``step`` over ``plain``'s, compiled in turns
    (``REPEAT`` pairs: this machine's speed moves from minute to minute)."""
    pairs = [(compile_seconds(step, *args), compile_seconds(plain, *args)) for _ in range(REPEAT)]
    return statistics.median(a for a, _ in pairs) / statistics.median(b for _, b in pairs)


def plain_step(factory, loss_fn):
    graphdef = nnx.split(factory(), nnx.Param, ...)[0]

    def step(params, rest, args):
        return nnx.value_and_grad(loss_fn)(nnx.merge(graphdef, params, rest), *args)

    return step


def timed_plan(loss_fn, model, args, budget):
    """The plan at ``budget`` (at the least budget where that is below it, or for
    ``"least"``: both calls together), its seconds and the process's CPU seconds."""
    if budget == "least":
        budget = 1  # byte: below every model's least budget
    start, cpu = time.perf_counter(), time.process_time()
    try:
        p = auto.plan(loss_fn, model, *args, budget=budget)
    except solvers.Infeasible as err:
        p = auto.plan(loss_fn, model, *args, budget=err.min_budget)
    return p, time.perf_counter() - start, time.process_time() - cpu


def zoo_rows(families, budgets, measure_compile: bool = True) -> list[tuple]:
    rows = []
    for name in families:
        case = zoo.case(name)
        _, params, rest = nnx.split(case.factory(), nnx.Param, ...)
        plain = plain_step(case.factory, case.loss_fn)
        for budget in budgets:
            clear_caches()
            p, seconds, cpu = timed_plan(case.loss_fn, case.factory(), case.args, budget)
            compiled = len(_KERNELS)  # executables compiled since clear_caches()
            ratio = None
            if measure_compile:
                step = jax.value_and_grad(p.lowered(), has_aux=True)
                ratio = compile_ratio(step, plain, params, rest, case.args)
            rows.append((name, p.budget / p.store_all_peak, p.model.length, seconds,
                         compiled, ratio, p.overhead, cpu))  # fmt: skip
            shown = f"{'-':>9}" if ratio is None else f"{ratio:>8.2f}x"
            print(f"{name:>12} {rows[-1][1]:>6.0%} {p.model.length:>6} {seconds:>8.1f} "
                  f"{cpu:>6.1f} {cpu / CORES:>6.1f} {rows[-1][4]:>8} {shown} "
                  f"{p.overhead:>+9.1%}", flush=True)  # fmt: skip
    return rows


def gpt_report(name, make, depth: int, compile_step: bool) -> float:
    factory, loss_fn, args = make(quick=True, depth=depth)
    model = factory()
    clear_caches()
    start, cpu = time.perf_counter(), time.process_time()
    p = auto.plan(loss_fn, model, *args, budget="50%")
    total, cpu = time.perf_counter() - start, time.process_time() - cpu
    bm = p.model
    phases = {k: v for k, v in bm.timings.items() if k != "compiled"}
    phases["solve"] = total - sum(phases.values())
    distinct = len({b.key for b in bm.blocks.blocks})
    print(f"{name}: {len(bm.program.eqns)} equations, {p.problem.length} blocks ({distinct} "
          f"distinct): planned at 50% in {total:.1f} s, predicted overhead {p.overhead:+.1%} "
          f"({load()})")  # fmt: skip
    print("   " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
          + f"; {bm.timings.get('compiled', 0)} kernels compiled, "
          f"{p.schedule.meta['compile_rounds']} solves; {cpu:.1f} CPU s")  # fmt: skip
    if compile_step:
        graphdef, params, rest = nnx.split(factory(), nnx.Param, ...)
        runs = scan_runs(p.model, p.schedule)
        looped = sum(len(r.blocks) for r in runs.values())
        times = {
            "loops": compile_seconds(jax.value_and_grad(lower(p.model, p.schedule), has_aux=True),
                                     params, rest, args),
            "unrolled": compile_seconds(
                jax.value_and_grad(lower(p.model, p.schedule, loops=False), has_aux=True),
                params, rest, args),
            "plain": compile_seconds(plain_step(factory, loss_fn), params, rest, args),
        }  # fmt: skip
        print(f"   compiled step ({len(runs)} scan runs hold {looped} of {p.model.length} "
              f"blocks): XLA compile " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
              + f"; loops / plain {times['loops'] / times['plain']:.1f}x")  # fmt: skip
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"zoo: {', '.join(QUICK_FAMILIES)}")
    parser.add_argument("--families", default="", help="comma-separated zoo families")
    parser.add_argument("--depth", type=int, default=24)
    parser.add_argument("--scan", action="store_true", help="also the scanned transformer")
    parser.add_argument("--no-zoo", action="store_true")
    parser.add_argument("--least", action="store_true",
                        help="also plan each family at its least budget")  # fmt: skip
    parser.add_argument("--compilation-cache", metavar="DIR", default="",
                        help="JAX's persistent compilation cache in DIR, for every "
                        "executable (module docstring)")  # fmt: skip
    ns = parser.parse_args(argv)
    if ns.compilation_cache:
        jax.config.update("jax_compilation_cache_dir", ns.compilation_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    families = ns.families.split(",") if ns.families else (
        QUICK_FAMILIES if ns.quick else sorted(zoo.FAMILIES))  # fmt: skip
    print(f"jax {jax.__version__}, {os.cpu_count()} cores, {load()}; {machine_speed()}")
    if not ns.no_zoo:
        print(
            f"{'family':>12} {'budget':>6} {'blocks':>6} {'plan s':>8} {'cpu s':>6} "
            f"{'floor':>6} {'kernels':>8} {'compile':>9} {'overhead':>9}   (cpu: the "
            f"process's CPU seconds, every thread; floor: cpu / {CORES} cores; compile: "
            f"planned step / plain step)"
        )
        budgets = ("100%", "65%", "least") if ns.least else ("100%", "65%")
        rows = zoo_rows(families, budgets, measure_compile=not ns.compilation_cache)
        slow = [r for r in rows if r[3] > PLAN_TARGET]
        bound = [r for r in slow if r[7] / CORES > PLAN_TARGET]
        heavy = [r for r in rows if r[5] is not None and r[5] > COMPILE_TARGET]
        compiled = (
            "not measured (--compilation-cache)" if ns.compilation_cache else
            f"{len(rows) - len(heavy)} of {len(rows)}"
        )  # fmt: skip
        print(
            f"planned in under {PLAN_TARGET:.0f} s: {len(rows) - len(slow)} of {len(rows)} "
            f"({len(bound)} of the others with a floor over it: their work, however "
            f"overlapped on {CORES} cores); compiled step within {COMPILE_TARGET}x of plain: "
            f"{compiled} ({load()})"
        )
    total = gpt_report("gpt", gpt, ns.depth, False)
    print(f"   {'within' if total < GPT_TARGET else 'OVER'} the target of {GPT_TARGET:.0f} s")
    if ns.scan:
        gpt_report("scanned", scanned, ns.depth, True)
    print(f"at the end: {load()}; {machine_speed()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

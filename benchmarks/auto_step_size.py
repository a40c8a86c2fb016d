"""The size of the planned step against the plain step's, over the model zoo (tests/zoo):
the number of StableHLO operations of ``jax.jit(jax.value_and_grad(plan.lowered()))``
lowered, over plain ``jax.jit(nnx.value_and_grad)``'s, at store-all, 65% and the least
budget, and the optimized HLO instructions XLA compiles; also the XLA compile seconds'
ratio (one run each: noisy on a loaded machine, where the counts are not: they are
deterministic). Where the size comes from, from the schedule alone: ``fwd`` block
forwards run (its ``F_*`` ops), ``rep`` those of blocks of unrolled scans (repeated
blocks: what loops can share; the rest is distinct blocks recomputed), and the forward
copies the lowered step holds: ``ckpt`` with each Segment's first forward as its
subtree unrolled (``jax.checkpoint``), ``copies`` as lowered (a loop counts its
period once; :func:`forward_copies`).

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
from jax_exec.execute.loops import forward_runs, scan_of, scan_runs  # noqa: E402
from jax_exec.execute.tree import Record, Segment, parse_tree, split_copies  # noqa: E402

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


def forward_copies(model, schedule) -> tuple[int, int, int, int]:
    """``(fwd, rep, ckpt, copies)`` of the module docstring. Records (``F_all``) count
    one copy each, a scan run's its period once; a Segment's first forward counts its
    subtree's forward copies under ``jax.checkpoint`` and its blocks, a loop's period
    once (:func:`~jax_exec.execute.loops.forward_runs`), as lowered."""
    chain_ops, _ = split_copies(schedule.ops)
    tree = parse_tree(chain_ops, model.length)
    runs = scan_runs(model, schedule)
    run_of = {k: r for r in runs.values() for k in r.blocks}
    repeated = {k for k in range(model.length) if scan_of(model, k) is not None}
    fwd = rep = ckpt = copies = 0

    def records(node) -> int:  # forward copies of a Record chain's and Segments' primal
        n = 0
        while isinstance(node, Record | Segment):
            if isinstance(node, Segment):
                n += records(node.inside)
                node = node.after
            elif node.index in runs:
                r = runs[node.index]
                n += r.period
                for _ in r.blocks:
                    node = node.rest
            else:
                n += 1
                node = node.rest
        return n

    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, Record):
            fwd, rep = fwd + 1, rep + (node.index in repeated)
            r = run_of.get(node.index)
            if r is None or r.start == node.index:  # a run: its period's copies once
                n = 1 if r is None else r.period
                ckpt, copies = ckpt + n, copies + n
            todo.append(node.rest)
        elif isinstance(node, Segment):
            blocks = range(node.start, node.stop)
            fwd, rep = fwd + len(blocks), rep + len(repeated.intersection(blocks))
            ckpt += records(node.inside)
            loops = forward_runs(model, node.start, node.stop)
            looped = sum(len(r.blocks) for r in loops.values())
            copies += len(blocks) - looped + sum(r.period for r in loops.values())
            todo += [node.inside, node.after]
    return fwd, rep, ckpt, copies


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
          f"{'overhead':>9} {'fwd':>4} {'rep':>4} {'ckpt':>4} {'copies':>6}")  # fmt: skip
    for name in families:
        case = zoo.case(name)
        _, params, rest = nnx.split(case.factory(), nnx.Param, ...)
        args = (params, rest, case.args)
        plain, plain_h, plain_s = measure(plain_step(case.factory, case.loss_fn), args)
        for label, p in plans(case, ns.budgets.split(",")):
            looped = sum(len(r.blocks) for r in scan_runs(p.model, p.schedule).values())
            step = jax.value_and_grad(p.lowered(), has_aux=True)
            fwd, rep, ckpt, copies = forward_copies(p.model, p.schedule)
            n, h, s = measure(step, args)
            print(f"{name:>12} {label:>10} {p.model.length:>6} {looped:>6} {n:>7} {plain:>7} "
                  f"{n / plain:>6.2f} {h:>6} {plain_h:>6} {h / max(plain_h, 1):>6.2f} "
                  f"{s / plain_s:>7.2f}x {p.overhead:>+9.1%} {fwd:>4} {rep:>4} {ckpt:>4} "
                  f"{copies:>6}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

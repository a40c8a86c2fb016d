"""Least budgets with and without late-residual variants (docs/auto.md, "Host offload").

A late-residual variant of a block option keeps the saved residuals that the first
phase of the block's phased backward does not read (``PhasedBackward.late``) in host
memory from the recording until the phase that first reads them. This measures, per
zoo family, the least budget of the block DP (exact: the least-memory schedule's
kernels compiled, as ``Plan.least_budget()`` of an exact plan) with the options alone
and with their variants added (memory only; no platform needed).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/late_residuals.py [--phases N] [family ...]

``--phases N``: a what-if with backwards cut into at most N phases (the library's
``MAX_PHASES`` is 2). About 3 minutes for the 16 families on the 2-core machine. The
figures (exact bytes, deterministic) are in docs/auto.md, "Host offload".
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
sys.path.append(str(ROOT / "tests"))  # the zoo (appended: tests/ holds package-named folders)

import zoo  # noqa: E402

import jax_exec.program.model as model_module  # noqa: E402
from jax_exec.auto.exact import exact_least  # noqa: E402
from jax_exec.program.model import BlockModel, block_model, build_problem  # noqa: E402
from jax_exec.program.phases import MAX_PHASES, phased_backward  # noqa: E402
from schedir.blocks.problem import BlockChain, simulate_blocks  # noqa: E402
from schedir.blocks.schedule import BlockSchedule  # noqa: E402
from solvers.blocks.rotor import least_memory, least_memory_ops  # noqa: E402


def with_variants(bm: BlockModel, p: BlockChain) -> tuple[BlockChain, list[list[int]]]:
    """``p`` with each option's late-residual variant appended (lower bounds), and per
    stage the base option of every option index."""
    stages, base = [], []
    for k, stage in enumerate(p.stages):
        options, of = list(stage.options), list(range(len(stage.options)))
        for o, opt in enumerate(stage.options):
            host, _ = bm.phased(k, o).late()
            if host == 0:
                continue
            tmp, rel, _ = bm.backward_bytes(k, o, lower=True, late=True)
            # with more than 2 phases a late residual may be freed after its return,
            # beyond what BlockChain lets a backward free (its device bytes): the DP and
            # the simulator read bwd_tmp - bwd_release only, which this keeps
            cap = opt.saved - host + p.own_bytes(k)
            tmp, rel = tmp - max(rel - cap, 0), min(rel, cap)
            options.append(dataclasses.replace(opt, name=opt.name + "+late",
                                               saved=opt.saved - host, rec_tmp=opt.rec_tmp + host,
                                               bwd_tmp=tmp, bwd_release=rel))  # fmt: skip
            of.append(o)
        stages.append(dataclasses.replace(stage, options=tuple(options)))
        base.append(of)
    return dataclasses.replace(p, stages=tuple(stages)), base


def least_with_variants(bm: BlockModel) -> tuple[int, int, str]:
    """(least budget, stages whose least-memory option is a variant, what sets the
    peak), exact."""
    bm.trace_options()
    while True:
        bound, base = with_variants(bm, build_problem(bm, lower=True))
        least, _ = least_memory(bound)
        ops, options = least_memory_ops(bound, least)
        real = tuple(base[k][o] for k, o in enumerate(options))
        if bm.compile_used(BlockSchedule(ops, {}, real)) == 0:
            used = sum(o >= len(bm.options[k]) for k, o in enumerate(options))
            exact, _ = with_variants(bm, build_problem(bm))
            return least, used, peak_op(bm, exact, BlockSchedule(ops, {}, tuple(options)), real)


def peak_op(bm: BlockModel, p: BlockChain, schedule: BlockSchedule, real: tuple) -> str:
    """The op at the least schedule's peak: for a backward, its option, saved and late
    bytes and the phase whose need is the largest."""
    trace = simulate_blocks(p, schedule)
    i = max(range(len(trace.op_peak)), key=lambda i: trace.op_peak[i])
    op = schedule.ops[i]
    if type(op).__name__ != "B":
        return f"{op}"
    k = op.index
    option = p.stages[k].options[schedule.options[k]]
    pb, kernels = bm.backward_kernels(k, real[k])
    temps = [kern.temp_bytes for kern in kernels]
    host, first = pb.late()
    needs = [live + t - rel for live, t, rel in zip(pb.live, temps, pb.released, strict=True)]
    j = max(range(len(needs)), key=needs.__getitem__)
    return (
        f"{op} {option.name!r} saved {option.saved:,} late {host:,}; phase {j + 1}/"
        f"{len(needs)} sets it"
    )


def main(families: list[str]) -> None:
    print(f"{'family':<13}{'blocks':>7}{'remat-only least':>18}{'with late':>12}{'gain':>8}"
          f"{'variants used':>15}{'late options':>14}{'s':>6}  peak op")  # fmt: skip
    for name in families:
        start = time.perf_counter()
        case = zoo.case(name)
        bm = block_model(case.loss_fn, case.factory(), case.args)
        remat = exact_least(bm, "block_rotor")
        late, used, why = least_with_variants(bm)
        have = sum(bm.phased(k, o).late()[0] > 0 for k in range(bm.length)
                   for o in range(len(bm.options[k])))  # fmt: skip
        total = sum(len(o) for o in bm.options)
        print(f"{name:<13}{bm.length:>7}{remat:>18,}{late:>12,}{1 - late / remat:>8.1%}"
              f"{used:>15}{f'{have}/{total}':>14}{time.perf_counter() - start:>6.0f}  {why}",
              flush=True)  # fmt: skip


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help="zoo families (default: all 16)")
    parser.add_argument("--phases", type=int, default=MAX_PHASES,
                        help=f"what-if: cut backwards into at most this many phases "
                             f"(the library's MAX_PHASES is {MAX_PHASES})")  # fmt: skip
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = _args()
    if args.phases != MAX_PHASES:  # the what-if: every backward traced with more phases
        model_module.phased_backward = functools.partial(phased_backward, max_phases=args.phases)
    main(args.families or list(zoo.FAMILIES))

"""Least budgets with and without host-memory variants (docs/auto.md, "Host offload").

The host-memory variants of a block option (``SaveOption.host``, offered by
``jax_exec.plan`` with a host link: ``jax_exec.program.host_variants.with_host_variants``)
keep saved residuals in host memory from the recording until the backward brings them
back: the late-residual variant those the first phase of the block's backward (cut
into up to ``LATE_PHASES`` phases) does not read, until the phase that first reads
them; the all-on-host variant every one. This measures, per zoo family, the least
budget of the block DP (exact: the least-memory schedule's kernels compiled, as
``Plan.least_budget()`` of an exact plan) with the options alone and with their
variants added (memory only: the host link's bandwidth changes times, not bytes).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/late_residuals.py [family ...]

About 3 minutes for the 16 families on the 2-core machine. The figures (exact bytes,
deterministic) are in docs/auto.md, "Host offload".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
sys.path.append(str(ROOT / "tests"))  # the zoo (appended: tests/ holds package-named folders)

import zoo  # noqa: E402

from jax_exec.auto.least import exact_least  # noqa: E402
from jax_exec.program.build import block_model  # noqa: E402
from jax_exec.program.host_variants import with_host_variants  # noqa: E402
from jax_exec.program.model import BlockModel  # noqa: E402
from jax_exec.program.problem import build_problem  # noqa: E402
from schedir import Platform  # noqa: E402
from schedir.blocks.schedule import BlockSchedule  # noqa: E402
from schedir.blocks.simulate import simulate_blocks  # noqa: E402
from solvers.blocks.rotor import least_memory_ops  # noqa: E402

LINK = Platform.host_offload("nvlink-c2c")  # any host link: least budgets are bytes


def least_with_variants(bm: BlockModel) -> tuple[int, int, str]:
    """(least budget, stages whose least-memory option is a variant, what sets the
    peak), exact."""
    late = with_host_variants(bm, LINK)
    least = exact_least(late, "block_rotor")  # its least-memory schedule's kernels compiled
    ops, options = least_memory_ops(build_problem(late, lower=True), least)
    late.problem = build_problem(late)
    used = sum(bool(late.option(k, o).host) for k, o in enumerate(options))
    return least, used, peak_op(late, BlockSchedule(ops, {}, tuple(options)))


def peak_op(bm: BlockModel, schedule: BlockSchedule) -> str:
    """The op at the least schedule's peak: for a backward, its option, saved and host
    bytes and the phase whose need is the largest."""
    p = bm.problem
    trace = simulate_blocks(p, schedule)
    i = max(range(len(trace.op_peak)), key=lambda i: trace.op_peak[i])
    op = schedule.ops[i]
    if type(op).__name__ != "B":
        return f"{op}"
    k = op.index
    option = p.stages[k].options[schedule.options[k]]
    pb, kernels = bm.backward_kernels(k, schedule.options[k])
    temps = [kern.temp_bytes for kern in kernels]
    needs = [need - rel for need, rel in pb.rows(temps, bm.option(k, schedule.options[k]).host)]
    j = max(range(len(needs)), key=needs.__getitem__)
    return (
        f"{op} {option.name!r} saved {option.saved:,} host {option.host:,}; phase {j + 1}/"
        f"{len(needs)} sets it"
    )


def main(families: list[str]) -> None:
    print(f"{'family':<13}{'blocks':>7}{'remat-only least':>18}{'with host':>12}{'gain':>8}"
          f"{'variants used':>15}{'variants':>14}{'s':>6}  peak op")  # fmt: skip
    for name in families:
        start = time.perf_counter()
        case = zoo.case(name)
        bm = block_model(case.loss_fn, case.factory(), case.args)
        remat = exact_least(bm, "block_rotor")
        late, used, why = least_with_variants(bm)
        variants = with_host_variants(bm, LINK)
        have = sum(bool(o.host) for opts in variants.options for o in opts)
        total = sum(len(o) for o in bm.options)
        print(f"{name:<13}{bm.length:>7}{remat:>18,}{late:>12,}{1 - late / remat:>8.1%}"
              f"{used:>15}{f'{have}/{total}':>14}{time.perf_counter() - start:>6.0f}  {why}",
              flush=True)  # fmt: skip


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help="zoo families (default: all 16)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(_args().families or list(zoo.FAMILIES))

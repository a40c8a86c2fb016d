"""The least budget of a block method, exact for the kernels its least-memory schedule
runs (docs/auto.md, "Planning exactly", step 3), and an ``Infeasible`` that says it in
the user's units."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import solvers
from jax_exec.program.model import BlockModel
from jax_exec.program.problem import build_problem
from schedir import Platform, simulate
from schedir.blocks.schedule import BlockSchedule
from schedir.budget import in_units_of
from solvers.blocks.policies import policy_schedule
from solvers.blocks.rotor import least_memory, least_memory_ops


def exact_least(bm: BlockModel, solver: str) -> int:
    """The least budget of a block method, exact for the kernels its least-memory
    schedule runs, compiling only those (:func:`least_schedule`)."""
    return least_schedule(bm, solver)[0]


def least_schedule(bm: BlockModel, solver: str) -> tuple[int, BlockSchedule]:
    """The least budget of a block method and a schedule that needs no more, every
    kernel it runs compiled.

    A policy's schedule is fixed: its kernels compiled, its peak is its least budget.
    For the block DP, every option's recording and backward are traced (exact saved
    bytes and frees) and the kernels not compiled yet priced at 0 temporary bytes, a
    lower bound of every figure: no schedule needs less than that problem's least
    budget. Each round takes a schedule at that bound, from the options already
    compiled where they reach it (:func:`_least_compiled`), else from every option
    (compiled ones tried first), and compiles its kernels; it ends when the schedule's
    peak, every figure it reads now exact, is still the bound."""
    if solver != "block_rotor":
        schedule = policy_schedule(bm.problem, solver)
        bm.compile_used(schedule)
        bm.problem = build_problem(bm)
        return simulate(bm.problem, schedule).peak_memory, schedule
    bm.trace_options()
    while True:
        bound = build_problem(bm, lower=True)
        least, _ = least_memory(bound)
        schedule = _least_compiled(bm, bound, least)
        if schedule is None:
            prefer = [
                sorted(range(len(stage.options)), key=lambda o, k=k: (not bm.option_exact(k, o), o))
                for k, stage in enumerate(bound.stages)
            ]  # fmt: skip
            ops, options = least_memory_ops(bound, least, prefer)
            schedule = BlockSchedule(ops, {"exact": True, "least_memory": True}, options)
        if bm.compile_used(schedule) == 0:
            return least, schedule
        if simulate(build_problem(bm, lower=True), schedule).peak_memory <= least:
            return least, schedule  # its kernels just compiled: every figure it reads is exact


def _least_compiled(bm: BlockModel, bound: Any, least: int) -> BlockSchedule | None:
    """A least-memory schedule of ``bound`` (the lower-bound problem) using only options
    whose figures are exact, where those reach its least budget ``least``; else None.
    (Without it, each round's least-memory schedule may break a tie for options not
    compiled yet, and compile them for the same least budget.)"""
    keep = [[o for o in range(len(stage.options)) if bm.option_exact(k, o)]
            for k, stage in enumerate(bound.stages)]  # fmt: skip
    if not all(keep):
        return None
    stages = tuple(
        dataclasses.replace(stage, options=tuple(stage.options[o] for o in keep[k]))
        for k, stage in enumerate(bound.stages)
    )
    compiled = dataclasses.replace(bound, stages=stages)
    if least_memory(compiled)[0] > least:
        return None
    ops, chosen = least_memory_ops(compiled, least)
    options = tuple(keep[k][o] if o is not None else None for k, o in enumerate(chosen))
    return BlockSchedule(ops, {"exact": True, "least_memory": True}, options)


def refuse_below_least(bm: BlockModel, nbytes: int, budget: Any, solver: str, why: str) -> None:
    """``solvers.Infeasible`` where ``nbytes`` (``budget``, in bytes) is below the exact
    least budget, before the store-all reference's kernels are compiled: those are read
    by every answer's rounds (their exact figures guide the DP) and by a percentage, and
    a budget below the least one needs no answer. For a budget the estimated problem has
    no answer for (``why``; then the rounds would compute the exact least budget first
    too, :func:`_least_answer`)."""
    least, _ = least_schedule(bm, solver)
    if nbytes < least:
        err = solvers.Infeasible(solver, nbytes, least, why)
        raise in_user_units(err, budget, None, "store-all") from None
    bm.known.clear()  # feasible: the solve goes on as if this had not run (nothing was
    bm.problem = build_problem(bm)  # known before it; its kernels stay compiled)


def least_options(bm: BlockModel) -> tuple[int, ...]:
    """The options of the block chain's least-memory schedule (its figures as known)."""
    return tuple(least_memory_ops(bm.problem, least_memory(bm.problem)[0])[1])


def least_options_of_model(bm: BlockModel, solver: str) -> tuple[int, ...]:
    """The options of the exact least-memory schedule that a solve knowing nothing yet
    finds (:func:`least_schedule`): a function of the model alone. The figures as known
    (:func:`least_options`) depend on what the budget's rounds compiled, so that a least
    budget of remat and offload found on them at one budget was not found again at that
    least budget (a CRF tagger: 88% of store-all, then refused there with 93.5%). The
    solve's knowledge is put back after."""
    known = set(bm.known)
    bm.known.clear()
    try:
        return tuple(least_schedule(bm, solver)[1].options)
    finally:
        bm.known.clear()
        bm.known.update(known)
        bm.problem = build_problem(bm)


def in_user_units(err: solvers.Infeasible, given: Any, reference: int | None, what: str):
    """``err`` whose message also says its least budget as the user gave the budget
    (their unit, or a percentage of the ``reference``, the ``what`` peak, if known)."""
    if err.min_budget is None:
        return err
    least = in_units_of(err.min_budget, given, reference).replace(" of ", f" of {what} ", 1)
    detail = "; ".join(d for d in (err.detail, f"least budget {least}") if d)
    said = solvers.Infeasible(err.method, err.budget, err.min_budget, detail)
    said.units = (err.detail, given, reference, what)  # for with_least
    return said


def with_least(err: solvers.Infeasible, least: int) -> solvers.Infeasible:
    """``err`` with another least budget, said in the same units."""
    detail, *units = getattr(err, "units", (err.detail, None, None, ""))
    return in_user_units(solvers.Infeasible(err.method, err.budget, least, detail), *units)


def least_under_cap(
    err: solvers.Infeasible, remat: solvers.Infeasible, platform: Platform,
    solve_at: Callable[[int], Any],
) -> solvers.Infeasible:  # fmt: skip
    """What to raise where neither remat alone (``remat``) nor remat with host-memory
    variants (``err``) plans. The variants' least budget leaves out the variants that
    hold more than ``platform.host_memory`` alone, not those that do together: under a
    cap it is taken where it plans (``solve_at``), else the least budget planning there
    says (a random model with a 2,189 B cap: 7,680 B said, 7,808 B planned). Without
    a least budget of the variants (every plan with them over the cap), remat's."""
    if err.min_budget is None:
        return remat if remat.min_budget is not None else err
    if platform.host_memory is None:
        return err
    try:
        solve_at(err.min_budget)
    except solvers.Infeasible as again:
        least = again.min_budget if again.min_budget is not None else remat.min_budget
        return err if least is None else with_least(err, least)
    return err

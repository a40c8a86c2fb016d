"""Planning exactly: solve, compile the kernels the answer runs, solve again
(docs/auto.md, "Planning exactly"); the least budget is :mod:`jax_exec.auto.least`'s."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import solvers
from jax_exec.auto.least import (
    in_user_units,
    least_options,
    least_options_of_model,
    least_schedule,
    least_under_cap,
    refuse_below_least,
)
from jax_exec.auto.methods import fixed_options, solve_fixed
from jax_exec.auto.offload import has_host_link, joint_plans, within_host_memory
from jax_exec.auto.reference import StoreAll, reference_schedule
from jax_exec.auto.whole import fallback, small_enough, whole_plan
from jax_exec.program.host_variants import host_variants_below, with_host_variants
from jax_exec.program.model import BlockModel
from jax_exec.program.problem import build_problem
from schedir import Platform, Schedule, simulate
from schedir.blocks.schedule import BlockSchedule
from schedir.budget import is_percentage, parse_budget
from solvers.blocks.policies import POLICIES, policy_schedule


@dataclass(frozen=True)
class Solved:
    """What a solve found: the ``schedule`` of ``model`` (the solved copy: the whole-graph
    MILP may add save sets), the ``budget`` in bytes, the store-all ``reference``, the
    number of solves (``rounds``) and, for a graph method, the options of its block
    graph (``graph_options``)."""

    schedule: Schedule
    budget: int
    reference: StoreAll
    rounds: int
    model: BlockModel
    graph_options: tuple[int, ...] = ()


def solve(
    bm: BlockModel, budget: Any, solver: tuple, options: dict, exact: bool, whole: int = 0,
    platform: Platform | None = None,
) -> Solved:  # fmt: skip
    """:func:`_solve_lazily`; with low-bit storage, until the schedule's measured
    gradient error is within the tolerance (:func:`jax_exec.auto.lowbit.within_tolerance`),
    and where the answer stores residuals in low bits, the full-precision options alone
    (:func:`jax_exec.auto.lowbit.full_precision`) are solved too and the faster answer is
    kept (``meta["lowbit"]["low_bit_makespan"]`` where full precision won): never slower
    than without low bits.
    With a host link, the block DP also solves a copy of ``bm`` whose options have
    their host-memory variants (:func:`jax_exec.program.host_variants.with_host_variants`; the
    whole-graph MILP competes with those variants too) and the faster answer is kept:
    never slower than without them. ``platform.host_memory`` bounds the answer
    (:func:`_within_host_memory`): never a plan over it. The DP charges the variants'
    copies whole; it also solves with them hidden, and the simulator, which overlaps
    them with compute, picks the faster (:func:`_hidden_copies`)."""

    def solve_on(model: BlockModel, whole: int) -> Solved:
        return _solve_lazily(model, budget, solver, options, exact, whole, platform)

    def once(whole: int) -> Solved:
        if solver == ("blocks", "whole_milp") and has_host_link(platform):
            variants = with_host_variants(bm, platform)  # it may leave them all out
            found = solve_on(variants, whole)  # its host row bounds the host bytes
            if within_host_memory(_host_resident(found), platform):
                return _report_copies(found)
            return solve_on(bm, whole)  # pragma: no cover - the MILP's row is exact
        if solver != ("blocks", "block_rotor") or not has_host_link(platform):
            return solve_on(bm, whole)
        try:  # the plan without a host link, the MILP's fallback included (with
            # whole=0 here, the MILP on the variants could end slower than it)
            without, infeasible = solve_on(bm, whole), None
        except solvers.Infeasible as err:
            without, infeasible = None, err
        try:
            found = _within_host_memory(with_host_variants(bm, platform), platform,
                                        solve_on, whole)  # fmt: skip
        except solvers.Infeasible as err:
            if without is None:  # its least budget is the lower, where it plans
                at = lambda least: solve(bm, least, solver, options, exact, whole, platform)  # noqa: E731
                raise least_under_cap(err, infeasible, platform, at) from None
            return without
        if found is not None:
            found = _hidden_copies(found, platform, exact, options)
        if found is None:  # no variant fits host memory: the plan without them
            if without is None:
                raise infeasible
            return without
        if without is not None and (
            without.schedule.meta["makespan"] <= found.schedule.meta["makespan"]
        ):
            return without
        return _report_copies(found)

    if getattr(bm, "tolerance", 0.0) > 0:
        from jax_exec.auto.lowbit import full_precision, within_tolerance

        found = within_tolerance(bm, lambda: once(0))
        if not any(found.schedule.meta["lowbit"]["storage"]):
            return found
        try:  # never slower than without low bits (the rounds compile what answers run:
            # with more options, estimates can lead them to a slower exact answer)
            full = solve(full_precision(bm), budget, solver, options, exact, 0, platform)
        except solvers.Infeasible:
            return found
        if full.schedule.meta["makespan"] <= found.schedule.meta["makespan"]:
            full.schedule.meta["lowbit"]["low_bit_makespan"] = found.schedule.meta["makespan"]
            return full
        return found
    return once(whole)


# Exact planning compiles the kernels each answer runs and solves again; after this many
# solves, the fastest answer priced exactly so far that fits is kept (every one of them
# is exact: its kernels were compiled). Deterministic: a count, not a clock.
MAX_ROUNDS = 3
# rounds where no answer fits after MAX_ROUNDS: then the least-memory schedule
LAST_ROUND = 2 * MAX_ROUNDS + 1


@dataclass(frozen=True)
class Priced:
    """A schedule and its figures on the block model's problem (exact where its kernels
    are compiled): ``peak`` bytes, ``makespan`` seconds, ``host_resident`` bytes in host
    memory after every op."""

    schedule: BlockSchedule
    peak: int
    makespan: float
    host_resident: tuple[int, ...] = ()


def _priced(bm: BlockModel, schedule: BlockSchedule) -> Priced:
    """``schedule`` priced by ``bm.problem`` (its ``meta`` reports the figures too)."""
    trace = simulate(bm.problem, schedule)
    schedule.meta.update(peak_memory=trace.peak_memory, makespan=trace.makespan)
    return Priced(schedule, trace.peak_memory, trace.makespan, trace.host_resident)


def _faster(best: Priced | None, other: Priced | None) -> Priced | None:
    if other is None or (best is not None and best.makespan <= other.makespan):
        return best
    return other


def _solve_lazily(
    bm: BlockModel, budget: Any, solver: tuple, options: dict, exact: bool, whole: int = 0,
    platform: Platform | None = None,
) -> Solved:  # fmt: skip
    """Solve; with ``exact``, compile the kernels the answer runs and solve again, so
    that the predicted figures are those the op-by-op runtime measures (kernels not
    compiled yet are priced with estimated temporaries): until the answer runs only
    compiled kernels, or after :data:`MAX_ROUNDS` solves, the fastest exactly priced
    answer that fits (the store-all reference among them). The reference's kernels are
    compiled first, together with those of the answer at the estimated budget (one
    round fewer). For ``min_budget``, every option's kernels are compiled (the least
    budget is then exact). Chain and graph methods compile every kernel of the
    store-all options first and solve once. ``whole`` > 0: the block DP's answer
    competes with the whole-graph MILP's when that has at most ``whole`` variables
    (:func:`jax_exec.auto.whole.fallback`). With a ``platform`` that has a host link,
    the block DP's answer competes with remat + offload plans
    (:func:`jax_exec.auto.offload.joint_plans`)."""
    family, solver = solver
    if bm.known:  # a solve of its own: what earlier solves compiled is not known to it
        bm.known.clear()
        bm.problem = build_problem(bm)
    ref = reference_schedule(bm)
    if exact:  # the reference's kernels, and a first answer's at the budget's bytes
        guess = []
        if family == "blocks" and solver == "block_rotor":
            guess = _first_guess(bm, ref, budget, solver, platform)
        if bm.compile(bm.used_kernels(ref) + guess):
            bm.problem = build_problem(bm)
    reference = simulate(bm.problem, ref)
    plain = simulate(bm.problem, policy_schedule(bm.problem, "everything_saveable"))
    reference = StoreAll(reference.peak_memory, plain.makespan)
    nbytes = parse_budget(budget, reference.peak_memory)
    if family != "blocks":
        chosen = fixed_options(bm, options.get("graph_option", "store_all"))
        if exact and bm.compile(bm.every_kernel(chosen)):
            bm.problem = build_problem(bm)
        schedule = solve_fixed(bm, nbytes, family, solver, options)
        return Solved(schedule, nbytes, reference, 1, bm, chosen if family == "graph" else ())
    if solver == "whole_milp":
        found = whole_plan(bm, nbytes, list(ref.options), exact=exact, **options)
        return Solved(found.schedule, nbytes, reference, found.rounds, found.model)
    joint = solver == "block_rotor" and has_host_link(platform)
    try:
        best, rounds = _solve_rounds(bm, nbytes, solver, options, exact, ref)
    except solvers.Infeasible as err:  # the least budget in the user's units too
        if joint:
            choices = [ref.options, least_options_of_model(bm, solver)]
            found = joint_plans(bm, nbytes, platform, choices, exact)
            if found.found:
                schedule, _, _ = min(found.found, key=lambda f: f[2])
                return Solved(schedule, nbytes, reference, 1, bm)
            if err.min_budget is not None and found.least is not None:
                least = err.min_budget
                if found.least < least:  # rotor_offload's least on a choice's chain: taken
                    # where the same choices plan at it (checked on the block chain)
                    if joint_plans(bm, found.least, platform, choices, exact).found:
                        least = found.least
                err = solvers.Infeasible(err.method, nbytes, least, "remat and offload")
        raise in_user_units(err, budget, reference.peak_memory, "store-all") from None
    schedule, model, makespan = best.schedule, bm, best.makespan
    if whole and best.makespan > reference.makespan and small_enough(bm, whole):
        found = fallback(bm, best.schedule, best.makespan, nbytes, list(ref.options), exact)
        schedule, model, makespan = found.schedule, found.model, found.makespan
        if model is not bm:  # the DP may do better still with the new save sets
            mixed = _solve_rounds(model, nbytes, solver, {}, exact, ref)[0]
            if mixed.makespan < found.makespan:
                mixed.schedule.meta.update(
                    whole_milp=dict(found.report, chosen=False, mixed=True),
                    dp_makespan=best.makespan,
                )
                schedule, makespan = mixed.schedule, mixed.makespan
    if joint and makespan > reference.makespan:  # remat only, or remat and offload
        choices = [schedule.options, ref.options, least_options(model)]
        found = joint_plans(model, nbytes, platform, choices, exact)
        for candidate, _, seconds in found.found:
            if seconds < makespan:
                candidate.meta["remat_only_makespan"] = makespan
                schedule, makespan = candidate, seconds
    return Solved(schedule, nbytes, reference, rounds, model)


def _first_guess(
    bm: BlockModel, ref: Schedule, budget: Any, solver: str, platform: Platform | None
) -> list[tuple[str, int, int]]:
    """The kernels of the estimated problem's answer at the budget's bytes, to compile
    with the reference's (none where store-all fits on estimates: it is the fastest
    answer). Guessed on the problem as it is before anything is compiled, so that a
    percentage, whose bytes need the reference's exact peak (its kernels compiled
    first), and the bytes it means give the same plan. A budget in bytes that the
    estimated problem has no answer for is refused first if it is below the exact
    least budget (:func:`refuse_below_least`)."""
    estimated = bm.problem
    nbytes = parse_budget(budget, lambda: _reference_peak(bm, ref))
    try:
        answer = solvers.solve(estimated, nbytes, method=solver)
    except solvers.Infeasible as err:
        if not (has_host_link(platform) or is_percentage(budget)):
            refuse_below_least(bm, nbytes, budget, solver, err.detail)
        return []
    return bm.used_kernels(answer) if nbytes < simulate(estimated, ref).peak_memory else []


def _reference_peak(bm: BlockModel, ref: Schedule) -> int:
    """The store-all reference's exact peak (what a percentage budget is of): its
    kernels compiled and known to the solve."""
    if bm.compile(bm.used_kernels(ref)):
        bm.problem = build_problem(bm)
    return simulate(bm.problem, ref).peak_memory


def _solve_rounds(
    bm: BlockModel, nbytes: int, solver: str, options: dict, exact: bool, ref: Schedule
) -> tuple[Priced, int]:
    """The block method's answer for ``nbytes`` and the number of solves
    (:func:`_solve_lazily`): the store-all reference ``ref`` competes when it fits.
    Where the estimates mislead (no answer that fits after :data:`MAX_ROUNDS` solves,
    none among the compiled options either), rounds go on until one fits, at most
    :data:`LAST_ROUND`, and then the exact least-memory schedule
    (:func:`least_schedule`) competes: an answer whenever the budget is at least the
    least one."""
    best = None
    if solver == "block_rotor":  # the DP discretizes sizes: store-all may beat it
        fits = _priced(bm, replace(ref, meta=dict(ref.meta, method=solver, exact=True)))
        if fits.peak <= nbytes:  # the fastest schedule fits
            return fits, 1
    rounds, bounded = 0, False
    while True:
        rounds += 1
        if bm.progress is not None:
            bm.progress(math.nan, f"solving with {solver}, round {rounds}")
        try:
            schedule = solvers.solve(bm.problem, nbytes, method=solver, **options)
        except solvers.Infeasible as err:
            if not exact or err.min_budget is None or bounded:
                raise
            bounded = True
            best = _faster(best, _least_answer(bm, nbytes, solver, err.detail))
            continue  # the problem's figures are exact where the least needs them
        compiled = bm.compile_used(schedule) if exact else 0
        if compiled:
            bm.problem = build_problem(bm)
            priced = _priced(bm, replace(schedule, meta=dict(schedule.meta)))
            best = _faster(best, priced if priced.peak <= nbytes else None)
        else:  # every figure of this answer is exact (or estimates are asked for)
            best = _faster(best, _priced(bm, schedule))
        done = not compiled or rounds >= LAST_ROUND or (rounds >= MAX_ROUNDS and best is not None)
        misled = rounds > MAX_ROUNDS and not bounded  # no answer fitted in MAX_ROUNDS solves
        if rounds >= MAX_ROUNDS and best is None:  # what is compiled only
            best = _compiled_only(bm, nbytes, solver, options)
            if best is not None:  # one more solve, and an answer
                done, rounds = True, rounds + 1
        if done:
            if misled:
                best = _faster(best, _least_answer(bm, nbytes, solver, "exact least budget"))
            return _policies(bm, nbytes, best, exact, solver), rounds


def _least_answer(bm: BlockModel, nbytes: int, solver: str, why: str) -> Priced:
    """The exact least-memory schedule (:func:`least_schedule`) as an answer for
    ``nbytes``; :class:`solvers.Infeasible` with the exact least budget below it."""
    least, schedule = least_schedule(bm, solver)
    if nbytes < least:
        raise solvers.Infeasible(solver, nbytes, least, why) from None
    bm.problem = build_problem(bm)
    return _priced(bm, replace(schedule, meta=dict(schedule.meta, method=solver)))


def _policies(bm: BlockModel, nbytes: int, best: Priced, exact: bool, solver: str) -> Priced:
    """``best``, or the schedule of a JAX policy on every block where it fits and is
    faster: the block DP rounds sizes up to its slots, so a policy's exact peak may fit
    where the DP found no such schedule. A policy's time needs no kernel: only one that
    would be faster and whose peak, as known, fits has its kernels compiled (its peak is
    then exact)."""
    if solver != "block_rotor":
        return best
    for policy in POLICIES:
        try:
            schedule = policy_schedule(bm.problem, policy)
        except solvers.Infeasible:  # a block without that option
            continue
        guess = simulate(bm.problem, schedule)  # its time is exact, its peak estimated
        if guess.makespan >= best.makespan or guess.peak_memory > nbytes:
            continue
        if exact and bm.compile_used(schedule):
            bm.problem = build_problem(bm)
        meta = dict(schedule.meta, method=solver, exact=exact)
        priced = _priced(bm, replace(schedule, meta=meta))
        if priced.peak <= nbytes:
            best = _faster(best, priced)
    return best


def _within_host_memory(
    variants: BlockModel, platform: Platform, solve: Callable[[BlockModel, int], Solved],
    whole: int,
) -> Solved | None:  # fmt: skip
    """``solve(model, whole)`` of ``variants`` (a model with host-memory variants) whose
    answer fits ``platform.host_memory``: the variants keeping more than it alone are
    left out first; while the answer holds more in host memory, the variants keeping as
    many bytes as the largest it uses, or more, are left out and it is solved again
    (deterministic, at most one solve per distinct size; a rule, not an optimum under
    both limits: ``meta["host_memory"]`` reports the solves and the cap). Where that
    leaves out nothing (the answer's variants are the whole-graph MILP's save sets,
    which its fallback adds to the model it returns), the model is solved again by the
    block DP alone (``whole`` = 0), whose answers use the model's own options: every
    later solve then leaves out at least one variant. None when every variant keeps
    more than the host memory alone; ``solvers.Infeasible`` when no answer that uses a
    variant fits it."""
    limit = platform.host_memory
    if limit is None:
        return solve(variants, whole)
    model, found = host_variants_below(variants, limit + 1), None
    solves = 0
    while any(option.host for stage in model.problem.stages for option in stage.options):
        found, solves = solve(model, whole), solves + 1
        if within_host_memory(_host_resident(found), platform):
            found.schedule.meta["host_memory"] = {
                "limit": limit,
                "solves": solves,
                "variants_below": _variant_cap(model),
            }
            return found
        p = found.model.problem
        used = [p.stages[k].options[o].host for k, o in enumerate(found.schedule.options)]
        if not any(used):  # pragma: no cover - only variants hold host bytes here
            break
        fewer = host_variants_below(model, max(used))
        if fewer is model:  # the whole-graph MILP's variants: the DP alone from here
            if not whole:  # pragma: no cover - the DP's answers use the model's options
                break
            whole = 0
        model = fewer
    if found is None:
        return None
    raise solvers.Infeasible(
        found.schedule.meta.get("method", "block_rotor"),
        found.budget,
        None,
        f"host memory: every plan with variants holds more than {limit:,} B",
    )


def _hidden_copies(solved: Solved, platform: Platform, exact: bool, options: dict) -> Solved:
    """``solved`` (the block DP's answer with host-memory variants, their copies
    charged whole), or the DP's answer with the copies' time left out
    (:meth:`schedir.blocks.BlockChain.compute_only`, its kernels compiled with
    ``exact``) where that one, priced with its copies overlapping compute, fits the
    budget and host memory and is faster: the DP cannot price the overlap, so it
    solves both bounds and the simulator judges (``meta["dp_objective"]``)."""
    model = solved.model
    try:
        schedule = solvers.solve(model.problem.compute_only(), solved.budget,
                                 method="block_rotor", **options)  # fmt: skip
    except solvers.Infeasible:
        return solved
    if exact and model.compile_used(schedule):
        model.problem = build_problem(model)
    priced = _priced(model, BlockSchedule(schedule.ops, dict(schedule.meta), schedule.options))
    if (
        priced.peak <= solved.budget
        and within_host_memory(priced.host_resident, platform)
        and priced.makespan < solved.schedule.meta["makespan"]
    ):
        meta = priced.schedule.meta
        meta["dp_objective"] = "copies hidden"
        if "host_memory" in solved.schedule.meta:
            meta["host_memory"] = solved.schedule.meta["host_memory"]
        return replace(solved, schedule=priced.schedule)
    return solved


def _variant_cap(model: BlockModel) -> int:
    """The most bytes a variant of ``model`` keeps in host memory."""
    return max(option.host for stage in model.problem.stages for option in stage.options)


def _report_copies(solved: Solved) -> Solved:
    """``solved`` whose ``meta["serial_makespan"]`` says the time with its host copies
    charged whole (an upper bound; ``makespan`` overlaps them) and
    ``meta["dp_objective"]`` what the block DP minimized (``"copies charged whole"``,
    or ``"copies hidden"``: :func:`_hidden_copies`), where it keeps residuals in host
    memory (a joint plan's time is the offload simulator's: left as it is)."""
    if solved.schedule.meta.get("offloaded"):
        return solved
    trace = simulate(solved.model.problem, solved.schedule)
    if trace.serial_makespan is not None and trace.serial_makespan > trace.makespan:
        solved.schedule.meta["serial_makespan"] = trace.serial_makespan
        solved.schedule.meta.setdefault("dp_objective", "copies charged whole")
    return solved


def _host_resident(solved: Solved) -> tuple[int, ...]:
    """A solve's bytes in host memory after every op (its host-memory variants'
    residuals, offloaded buffers)."""
    return simulate(solved.model.problem, solved.schedule).host_resident


def _compiled_only(bm: BlockModel, nbytes: int, solver: str, options: dict) -> Priced | None:
    """The method's answer among the options whose kernels are compiled (every forward
    kernel compiled first): exact by construction; None when none fits."""
    if bm.compile([("forward", k, 0) for k in range(bm.length)]):
        bm.problem = build_problem(bm)
    p = bm.problem
    keep = [[o for o in range(len(stage.options)) if bm.option_exact(k, o)]
            for k, stage in enumerate(p.stages)]  # fmt: skip
    stages = tuple(
        dataclasses.replace(stage, options=tuple(stage.options[o] for o in keep[k]))
        for k, stage in enumerate(p.stages)
    )
    try:
        schedule = solvers.solve(dataclasses.replace(p, stages=stages), nbytes, method=solver,
                                 **options)  # fmt: skip
    except solvers.Infeasible:
        return None
    chosen = tuple(keep[k][o] for k, o in enumerate(schedule.options))
    return _priced(bm, BlockSchedule(schedule.ops, dict(schedule.meta), chosen))

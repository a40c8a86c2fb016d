"""The whole-graph MILP on a traced model, and ``auto``'s fallback to it on small graphs
(docs/auto.md, "The whole-graph MILP").

:func:`whole_plan` builds the :class:`~solvers.blocks.whole_milp.SaveSetChain` of a
:class:`~jax_exec.program.model.BlockModel`: per block, its save-set graph
(:func:`jax_exec.program.options.option_graph`) and the bytes its backward holds per
recomputed equation (its materialized outputs the block does not return); the bases
are calibrated on a reference choice of options priced exactly by the block chain's
simulator (each step's need less the reference's saved residuals and recomputed bytes).
It solves the MILP, adds the save sets found as options of their blocks, compiles
their kernels (``exact``) and prices the schedule "every block recorded, then the
backward" exactly. The MILP's model is linear, an estimate: when the exact peak misses
the budget by more than 1% (above or below), it solves again with the model's budget
moved by the difference and the answer as the new reference, at most ``rounds``
times, and keeps the fastest answer that fits.

Blocks of one scanned loop that are the same block share their save set, so that
the loop lowering (:mod:`jax_exec.execute.loops`) still runs them as one loop.

With a host link (a model with host-memory variants,
:func:`jax_exec.program.host_variants.with_host_variants`) each block may also keep all its
saved residuals in host memory (its save set's all-on-host variant, ``"+host"``),
their copies priced per byte at the link's bandwidths, under ``host_memory``; the
answer is priced exactly like any other, copies and host bytes included.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from jax_exec.auto.offload import within_host_memory
from jax_exec.program.kernels import SaveOption
from jax_exec.program.model import BlockModel
from jax_exec.program.options import option_graph, saved_candidates
from jax_exec.program.problem import build_problem
from schedir import Schedule, simulate
from solvers.blocks.options import NODE_LIMIT, recompute_set
from solvers.blocks.policies import recorded
from solvers.blocks.whole_milp import SaveSetChain, WholeAnswer, variables, whole_save_sets
from solvers.registry import Infeasible

# auto solves the whole-graph MILP too when it has at most this many binary variables
WHOLE_GRAPH_VARIABLES = 4_000


@dataclass(frozen=True)
class WholeResult:
    """A whole-graph plan: ``model`` (``model.options`` extended by the save sets found),
    ``schedule`` (every block recorded, then the backward; its ``meta`` reports the
    figures and ``whole_milp``, :attr:`report`), the last MILP answer, the exact
    ``makespan`` of the schedule and the MILP ``rounds`` solved."""

    model: BlockModel
    schedule: Schedule
    answer: WholeAnswer
    makespan: float
    rounds: int
    report: dict


@dataclass(frozen=True)
class Fallback:
    """``auto``'s choice on a small graph: the ``schedule`` kept (the whole-graph plan's
    or the block DP's) and its ``makespan``, the ``model`` (extended by the MILP's save
    sets, or the block model when it found none), and what the MILP found (``report``,
    also in ``schedule.meta["whole_milp"]``)."""

    model: BlockModel
    schedule: Schedule
    makespan: float
    report: dict


def groups(bm: BlockModel) -> tuple[int, ...]:
    """Per block, the id of its save set: blocks of one scan that are the same block
    share one, every other block has its own."""
    ids, out = {}, []
    for k in range(bm.length):
        block = bm.blocks.blocks[k]
        scan = next(
            (s for s, info in enumerate(bm.program.scans)
             if info.starts[0] <= block.start < info.starts[-1]),
            None,
        )  # fmt: skip
        key = ("scan", scan, bm.identity(k)) if scan is not None else ("block", k)
        out.append(ids.setdefault(key, len(ids)))
    return tuple(out)


def node_bytes(bm: BlockModel, k: int) -> tuple[int, ...]:
    """Per equation of block k, bytes its backward holds when it recomputes it."""
    program, block, lay = bm.program, bm.blocks.blocks[k], bm.layouts[k]
    returned = (set(lay.outs) - lay.tied) | set(lay.results)  # a tied output is recomputed
    materialized = bm.analysis.materialized
    return tuple(
        sum(program.nbytes(v) for v in program.eqns[i].outs
            if v in materialized and v not in returned)
        for i in range(block.start, block.stop)
    )  # fmt: skip


def save_set_chain(bm: BlockModel, reference: list[int]) -> SaveSetChain:
    """The MILP's data, bases calibrated on ``reference`` (an option per block)."""
    L, p = bm.length, bm.problem
    trace = simulate(p, recorded(reference))
    graphs = [option_graph(bm, k)[0] for k in range(L)]
    nodes = [node_bytes(bm, k) for k in range(L)]
    fwd, bwd, prefix = [], [], 0
    for k in range(L):
        chosen = p.stages[k].options[reference[k]]
        prefix += chosen.saved  # the device part; its own host part counts at its steps
        option = bm.options[k][reference[k]]
        # plain autodiff and xla_fused recompute no value (fused: cheap work in consumers)
        fixed = option.kind in ("everything", "fused")
        rec = set() if fixed else recompute_set(graphs[k], saved_candidates(bm, k, option))
        fwd.append(trace.op_peak[k] - prefix - chosen.host)
        bwd.append(trace.op_peak[2 * L - k] - prefix - chosen.host
                   - sum(nodes[k][i] for i in rec))  # fmt: skip
    link = bm.host_link  # copies out and back, per byte (latencies left out: an estimate)
    cost = None if link is None else 1 / link.offload.bandwidth + 1 / link.prefetch.bandwidth
    return SaveSetChain(
        graphs=tuple(graphs),
        groups=groups(bm),
        node_bytes=tuple(nodes),
        fwd_base=tuple(fwd),
        bwd_base=tuple(bwd),
        loss_base=trace.op_peak[L] - prefix,
        host_cost=cost,
        host_memory=None if link is None else link.host_memory,
    )


def with_save_sets(
    bm: BlockModel, sets: tuple[frozenset[int], ...], on_host: tuple[bool, ...] = ()
) -> tuple[BlockModel, list[int]]:
    """A copy of ``bm`` whose blocks also offer these save sets (one per block; kernels
    and caches shared), and the option index of each: for a block of ``on_host``, its
    save set's all-on-host variant (:attr:`SaveOption.host`)."""
    by_key: dict = {}
    for k in range(bm.length):
        key = bm.identity(k)
        by_key.setdefault(key, list(bm.options[k]))
    chosen = []
    for k, saved in enumerate(sets):
        key = bm.identity(k)
        _, keys = option_graph(bm, k)
        names = frozenset(keys[c] for c in saved)
        options = by_key[key]
        o = next((o for o, opt in enumerate(options)
                  if opt == SaveOption("names", names, opt.label)), None)  # fmt: skip
        if o is None:
            options.append(SaveOption("names", names, f"whole {len(names)}/{len(keys)}"))
            o = len(options) - 1
        if on_host and on_host[k]:
            variant = dataclasses.replace(options[o], host="all")
            if variant not in options:
                options.append(variant)
            o = options.index(variant)
        chosen.append(o)
    new = tuple(tuple(by_key[bm.identity(k)]) for k in range(bm.length))
    if new == bm.options:
        return bm, chosen
    model = dataclasses.replace(bm, options=new, problem=None)
    model.problem = build_problem(model)
    return model, chosen


def whole_plan(
    bm: BlockModel,
    budget: int,
    reference: list[int],
    *,
    exact: bool = True,
    node_limit: int = NODE_LIMIT,
    time_limit: float | None = None,
    rounds: int = 3,
    to_beat: float | None = None,
) -> WholeResult:
    """Solve the whole-graph MILP for ``budget`` bytes (module docstring). ``to_beat``:
    a makespan (the block DP's); an answer no faster is not compiled and ends the search.

    Raises:
        solvers.Infeasible: no answer fits the exact simulator within ``rounds`` (no
            least budget is claimed).
    """
    start = time.perf_counter()
    target, model, ref = budget, bm, list(reference)
    solve_time, tries, best = 0.0, [], None
    for _ in range(rounds):
        try:
            answer = whole_save_sets(
                save_set_chain(model, ref), target, node_limit=node_limit, time_limit=time_limit
            )
        except Infeasible as err:
            if best is not None:
                break
            raise Infeasible("whole_milp", budget, None, err.detail) from None
        solve_time += answer.solve_time
        model, chosen = with_save_sets(model, answer.save_sets, answer.on_host)
        schedule = recorded(chosen)
        if to_beat is not None and simulate(model.problem, schedule).makespan >= to_beat:
            break  # times need no kernel: an answer no faster is not compiled
        if exact and model.compile_used(schedule):
            model.problem = build_problem(model)
        trace = simulate(model.problem, schedule)
        tries.append(trace.peak_memory)
        host_fits = within_host_memory(trace.host_resident, model.host_link)
        if trace.peak_memory <= budget and host_fits:
            if best is None or trace.makespan < best[1].makespan:
                best = (model, trace, schedule, answer, target)
            if budget - trace.peak_memory <= budget // 100:
                break
        # the linear model was off by this much: aim again, calibrated on this answer
        target += budget - trace.peak_memory
        ref = chosen
    if best is None and not tries:
        raise Infeasible("whole_milp", budget, None, "its answer is no faster than the block DP's")
    if best is None:
        raise Infeasible(
            "whole_milp", budget, None,
            f"its answers' exact peaks were {', '.join(f'{t:,}' for t in tries)} B "
            f"after {len(tries)} rounds of the linear model",
        )  # fmt: skip
    model, trace, schedule, answer, target = best
    report = {
        "optimal": answer.optimal,
        "variables": answer.variables,
        "solve_time": solve_time,
        "time": time.perf_counter() - start,
        "rounds": len(tries),
        "model_budget": target,
        "on_host": sum(answer.on_host),  # blocks keeping their residuals in host memory
    }
    schedule.meta.update(
        peak_memory=trace.peak_memory,
        makespan=trace.makespan,
        exact=False,  # optimal at most for the MILP's linear model, not the block chain
        whole_milp=report,
    )
    return WholeResult(model, schedule, answer, trace.makespan, len(tries), report)


def small_enough(bm: BlockModel, limit: int = WHOLE_GRAPH_VARIABLES) -> bool:
    """Whether the whole-graph MILP of ``bm`` has at most ``limit`` binary variables."""
    if limit <= 0:
        return False
    graphs = tuple(option_graph(bm, k)[0] for k in range(bm.length))
    return variables(graphs, groups(bm), bm.host_link is not None) <= limit


def fallback(
    bm: BlockModel, schedule: Schedule, makespan: float, budget: int, reference: list[int],
    exact: bool, **kw: Any,
) -> Fallback:  # fmt: skip
    """``auto`` on a small graph: the whole-graph plan (calibrated on ``reference``, the
    store-all options, as ``method="whole_milp"`` is) against the block DP's
    ``schedule`` of ``makespan`` seconds; the faster is kept (:class:`Fallback`)."""
    try:
        found = whole_plan(bm, budget, reference, exact=exact, to_beat=makespan, **kw)
    except Infeasible as err:
        report = {"found": False, "why": err.detail}
        schedule.meta["whole_milp"] = report
        return Fallback(bm, schedule, makespan, report)
    info = dict(found.report, found=True, makespan=found.makespan)
    if found.makespan < makespan:
        report = dict(info, chosen=True)
        found.schedule.meta.update(whole_milp=report, dp_makespan=makespan)
        return Fallback(found.model, found.schedule, found.makespan, report)
    report = dict(info, chosen=False)
    schedule.meta["whole_milp"] = report
    return Fallback(found.model, schedule, makespan, report)

"""``plan`` and ``value_and_grad``: the automatic planner's entry points (docs/auto.md).

Both follow Flax NNX's calling convention: ``loss_fn(model, *args)`` returns a scalar
(or ``(scalar, aux)`` with ``has_aux``), gradients are for the model's ``nnx.Param``s.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import jax
from flax import nnx

import solvers
from jax_exec.auto.whole import WHOLE_GRAPH_VARIABLES, fallback, small_enough, whole_plan
from jax_exec.execute.graph import run_graph_schedule
from jax_exec.execute.interpreter import run_schedule
from jax_exec.execute.lowering import lower
from jax_exec.execute.result import RunResult
from jax_exec.program.analysis import CostModel
from jax_exec.program.model import BlockModel, block_model, build_problem
from jax_exec.program.trace import graph_difference, same, split_model
from schedir import Chain, Graph, GraphSchedule, Schedule, simulate
from schedir.blocks.graph import block_graph
from schedir.blocks.problem import BlockChain
from schedir.blocks.schedule import BlockSchedule
from schedir.budget import parse_budget
from solvers.blocks.policies import POLICIES, policy_schedule
from solvers.blocks.rotor import least_memory, least_memory_ops

BLOCK_METHODS = ("auto", "block_rotor", "whole_milp", *POLICIES)
CHAIN_METHODS = tuple(m.name for m in solvers.available(Chain))
GRAPH_METHODS = tuple(m.name for m in solvers.available(Graph))


@dataclass
class Plan:
    """A schedule for one model, loss and input shapes.

    Attributes:
        problem: the problem it solved, exact bytes of the op-by-op runtime: the block
            chain (block, chain and JAX-policy methods), or its graph (graph methods,
            :func:`schedir.blocks.graph.block_graph`).
        schedule: the chosen schedule; ``meta`` holds the predicted ``peak_memory``
            (bytes) and ``makespan`` (roofline seconds); a ``BlockSchedule`` (its
            ``options``: one per block).
            A graph method's is a ``GraphSchedule`` (``Compute``/``Free`` ops).
        method: the method asked for.
        budget: bytes.
        store_all_peak: bytes of the store-all reference (every block recorded keeping
            what XLA keeps for a plain step, :class:`StoreAll`), the reference of
            percentage budgets.
        store_all_time: seconds without any recomputation (the reference of overheads).
        plan_time: seconds spent planning (tracing, options, kernels, solving).
        exact: whether the figures of the schedule are those of compiled kernels (the
            op-by-op runtime measures exactly them); else temporaries are estimated.
        whole_graph: the ``whole_graph`` limit its replans use (:func:`plan`).
        base: the traced model with its blocks' own options, which replans start from
            (``model`` is it, or a copy whose blocks also offer the save sets of the
            whole-graph MILP, :mod:`jax_exec.auto.whole`).
    """

    model: BlockModel = field(repr=False)
    problem: BlockChain | Graph = field(repr=False)
    schedule: Schedule
    method: str
    budget: int
    store_all_peak: int
    store_all_time: float
    plan_time: float
    exact: bool = True
    whole_graph: int = WHOLE_GRAPH_VARIABLES
    base: BlockModel | None = field(default=None, repr=False)
    graph_options: tuple[int, ...] = ()  # a graph method's: the options of its block graph

    @property
    def overhead(self) -> float:
        """Predicted time overhead over store-all (``makespan / store_all_time - 1``)."""
        return self.schedule.meta["makespan"] / self.store_all_time - 1.0

    @property
    def options(self) -> tuple[int, ...]:
        if isinstance(self.schedule, BlockSchedule):
            return self.schedule.options
        return self.graph_options

    def replan(
        self, budget: int | str, method: str | None = None, exact: bool | None = None,
        whole_graph: int | None = None, **options: Any,
    ) -> Plan:  # fmt: skip
        """A plan of the same model for another budget or method (no new tracing;
        kernels compiled so far are reused)."""
        method = method or self.method
        exact = self.exact if exact is None else exact
        whole_graph = self.whole_graph if whole_graph is None else whole_graph
        start = time.perf_counter()
        solver = _solver(method)
        whole = _whole_limit(method, whole_graph)
        base = self.base or self.model
        done = _solve(base, budget, solver, options, exact, whole)
        return _plan(done, method, start, exact, whole_graph, base)

    def least_budget(self) -> int:
        """The least budget (bytes) at which the method finds a schedule (exact for the
        kernels it would run when the plan is exact)."""
        try:
            self.replan(0)
        except solvers.Infeasible as err:
            if err.min_budget is None:  # pragma: no cover - every block method knows it
                raise
            return err.min_budget
        return 0

    def lowered(self, *, loops: bool = True) -> Callable:
        """``fn(params, rest, args) -> (loss, (aux, new_rest))`` following the schedule
        (the compiled path, :func:`jax_exec.execute.lowering.lower`; ``loops=False``
        unrolls the scan runs it keeps as loops). Graph schedules have no compiled
        path (they run op by op, :meth:`run`)."""
        if isinstance(self.schedule, GraphSchedule):
            raise ValueError(
                f"method {self.method!r} makes a graph schedule, which runs op by op only "
                f"(Plan.run); the compiled path follows block-chain schedules (method "
                f"'auto', a JAX policy or a chain method)"
            )
        return lower(self.model, self.schedule, loops=loops)

    def run(self, model: Any, *args: Any) -> RunResult:
        """Run the schedule op by op (measured memory) on ``model`` and ``args`` (same
        shapes as planned). The model is not modified: the state after the step is
        ``result.new_state`` (``nnx.update(model, result.new_state)`` applies it). An
        inexact plan is made exact first (its schedule may change)."""
        if not self.exact:
            exact = self.replan(self.budget, exact=True)
            self.schedule, self.exact, self.problem = exact.schedule, True, exact.problem
            self.model = exact.model
        graphdef, params, rest = split_model(model)
        difference = graph_difference(self.model.traced.graphdef, graphdef)
        if difference is not None:
            raise ValueError(
                f"model: {difference}; the plan follows the planned model's computation, "
                f"plan this model (e.g. after eval() or train()) on its own"
            )
        params, rest, args = _on_one_device((params, rest, tuple(args)))
        if isinstance(self.schedule, GraphSchedule):
            return run_graph_schedule(self.model, self.schedule, self.graph_options, params,
                                      rest, args)  # fmt: skip
        return run_schedule(self.model, self.schedule, params, rest, args)

    def summary(self) -> str:
        """A readable table: per block, what it saves and recomputes, and the totals."""
        p = self.problem if isinstance(self.problem, BlockChain) else self.model.problem
        meta = self.schedule.meta
        lines = [
            f"plan: method {self.method}, budget {self.budget:,} B "
            f"({self.budget / self.store_all_peak:.0%} of store-all {self.store_all_peak:,} B)",
            f"predicted peak {meta['peak_memory']:,} B, makespan {meta['makespan']:.3e} s "
            f"(overhead {self.overhead:+.1%}), {p.length} blocks + loss, "
            f"planned in {self.plan_time:.1f} s",
        ]
        recorded = _record_counts(self.model, self.schedule, self.options)
        lines.append(f"{'block':>5}  {'equations':>11}  {'input B':>12}  {'option':<22}"
                     f"{'saved B':>12}  {'forwards':>8}  {'bwd tmp B':>11}")  # fmt: skip
        for k, stage in enumerate(p.stages):
            b = self.model.blocks.blocks[k]
            o = stage.options[self.options[k]]
            size = sum(p.value_sizes[v] for v in p.cuts[k])
            lines.append(
                f"{k:>5}  {b.start:>5}..{b.stop - 1:<5}  {size:>12,}  {o.name:<22}"
                f"{o.saved:>12,}  {recorded[k]:>8}  {o.bwd_tmp - o.bwd_release:>11,}"
            )
        lines.append(
            "forwards: how many times the block's forward runs (1: never recomputed); "
            "'saved B' is what its recording keeps beyond its outputs, the rest of its "
            "residuals is recomputed in its backward; 'bwd tmp B': its backward's "
            "temporaries less what it frees of its own buffers before its peak."
        )
        return "\n".join(lines)


def _on_one_device(tree: Any) -> Any:
    """``tree`` with arrays sharded over several devices gathered on the first of them,
    with a warning: the op-by-op runtime measures one device's program (the compiled
    path, ``Plan.lowered`` under ``jax.jit``, keeps the shardings)."""
    leaves = jax.tree.leaves(tree)
    spread = [x for x in leaves if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1]
    if not spread:
        return tree
    device = sorted(spread[0].sharding.device_set, key=lambda d: d.id)[0]
    warnings.warn(
        f"Plan.run: {len(spread)} arrays are sharded over several devices; the op-by-op "
        f"runtime runs on one device ({device}) and measures its memory",
        stacklevel=3,
    )
    return jax.tree.map(
        lambda x: jax.device_put(x, device) if isinstance(x, jax.Array) else x, tree
    )


def _record_counts(model: BlockModel, schedule: Schedule, options: tuple) -> list[int]:
    """How many times each block's forward runs (graph: computes of F{k} and R{k})."""
    counts = [0] * model.length
    if isinstance(schedule, GraphSchedule):
        _, where = block_graph(model.problem, options)
        for op in schedule.ops:
            role, k = where.role(op.node)
            if type(op).__name__ == "Compute" and role in ("fwd", "res"):
                counts[k] += 1
        return counts
    for op in schedule.ops:
        if hasattr(op, "index") and type(op).__name__ in ("F_ck", "F_n", "F_all"):
            counts[op.index] += 1
    return counts


def plan(
    loss_fn: Callable,
    model: Any,
    *args: Any,
    budget: int | str,
    method: str = "auto",
    has_aux: bool = False,
    cost_model: CostModel | None = None,
    exact: bool = True,
    max_anchors: int = 4,
    activation_tolerance: float = 0.0,
    activation_storages: tuple[str, ...] | None = None,
    whole_graph: int = WHOLE_GRAPH_VARIABLES,
    **options: Any,
) -> Plan:
    """Plan a training step of ``loss_fn(model, *args)`` under ``budget``.

    ``budget``: bytes of activations (int), or a percentage of the store-all peak
    (``"50%"``). ``method``: ``"auto"`` (the block DP, :mod:`solvers.block_rotor`),
    one of JAX's policies applied to every block (``"checkpoint_dots"``,
    ``"nothing_saveable"``, ``"everything_saveable"``), a chain method (``"rotor"``,
    ``"revolve"``, ``"chen_sqrt"``...: on ``problem.to_chain`` of the store-all options,
    an upper bound of the block chain, which then prices the schedule) or a graph method
    (``"checkmate_milp"``, ``"dtr"``, ``"checkmate_lp"``, or ``"graph:<name>"`` for a
    name chains have too: on the block graph of the store-all options), all priced by
    the same simulators of the op-by-op runtime.
    ``exact``: compile the kernels the schedule runs so that its predicted peak is the
    op-by-op runtime's to the byte (else temporaries are estimated: faster, enough for
    the compiled path, whose memory XLA decides). ``max_anchors``: at most this many
    matmuls or convolutions pass without a cut (1: a block per matmul/convolution, the
    finest blocks). ``activation_tolerance`` > 0 also offers low-bit storage of saved
    residuals whose measured gradient error on ``args`` stays within it
    (:mod:`jax_exec.auto.lowbit`, ``schedule.meta["lowbit"]``; the storages tried:
    ``activation_storages``, default all); with 0, never. Other ``options`` go to the
    solver (e.g. ``time_limit`` of ``checkmate_milp``); graph methods also read
    ``graph_option``, the option every block's graph nodes use (default
    ``"store_all"``: what XLA keeps; or a JAX policy's name such as
    ``"nothing_saveable"``: no residual nodes, each backward recomputes its block).
    ``whole_graph``: ``"auto"`` also solves the whole-graph MILP
    (:mod:`jax_exec.auto.whole`, ``method="whole_milp"`` alone) when it has at most
    this many binary variables, and keeps it when it is faster
    (``schedule.meta["whole_milp"]`` says what it found); 0: never.

    Raises:
        solvers.Infeasible: the budget is below the least feasible one (``min_budget``).
        TypeError / ValueError: a malformed model, loss, budget or method.
        jax_exec.auto.UnsupportedModel: an operation the planner cannot handle.
    """
    solver = _solver(method)
    start = time.perf_counter()
    if isinstance(max_anchors, bool) or not isinstance(max_anchors, int) or max_anchors < 1:
        raise ValueError(f"max_anchors = {max_anchors!r}: expected an int >= 1")
    bm = block_model(
        loss_fn, model, args, has_aux=has_aux, cost_model=cost_model, max_anchors=max_anchors
    )
    if activation_storages is not None and not activation_tolerance:
        raise ValueError("activation_storages: low-bit storage needs activation_tolerance > 0")
    if activation_tolerance and solver[0] == "graph":
        raise ValueError(
            f"method = {method!r}: low-bit storage measures the compiled step's gradient, "
            f"and a graph schedule has no compiled path"
        )
    if activation_tolerance:  # low-bit residuals (jax_exec/auto/lowbit.py)
        from jax_exec.auto.lowbit import with_lowbit

        bm = with_lowbit(bm, args, activation_tolerance, activation_storages)
    whole = _whole_limit(method, whole_graph)  # low-bit storage plans by the DP alone
    done = _solve(bm, budget, solver, options, exact, whole)
    return _plan(done, method, start, exact, whole_graph, bm)


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


def _plan(done: Solved, method: str, start: float, exact: bool, whole_graph: int,
          base: BlockModel) -> Plan:  # fmt: skip
    done.schedule.meta["compile_rounds"] = done.rounds
    problem = done.model.problem
    if isinstance(done.schedule, GraphSchedule):
        problem = block_graph(done.model.problem, done.graph_options)[0]
    return Plan(
        model=done.model,
        problem=problem,
        schedule=done.schedule,
        method=method,
        budget=done.budget,
        store_all_peak=done.reference.peak_memory,
        store_all_time=done.reference.makespan,
        plan_time=time.perf_counter() - start,
        exact=exact,
        whole_graph=whole_graph,
        base=base,
        graph_options=done.graph_options,
    )


@dataclass(frozen=True)
class StoreAll:
    """The store-all reference: ``peak_memory`` (bytes) of every block recorded keeping
    what XLA keeps for a plain step (``xla_fused``; ``everything_saveable`` in scanned
    stacks, whose iterations XLA cannot fuse across), ``makespan`` (seconds) without any
    recomputation (plain autodiff)."""

    peak_memory: int
    makespan: float


def reference_schedule(bm: BlockModel) -> Schedule:
    """Store-all with, per block, what XLA keeps for a plain step (:class:`StoreAll`)."""
    in_scan = set()
    for scan in bm.program.scans:
        lo, hi = scan.starts[0], scan.starts[-1]
        in_scan |= {b.index for b in bm.blocks.blocks[:-1] if lo <= b.start < hi}
    schedule = policy_schedule(bm.problem, "everything_saveable")
    options = [
        next(o for o, opt in enumerate(stage.options)
             if opt.name == ("everything_saveable" if k in in_scan else "xla_fused"))
        for k, stage in enumerate(bm.problem.stages)
    ]  # fmt: skip
    return BlockSchedule(schedule.ops, {}, tuple(options))


def _solver(method: str) -> tuple[str, str]:
    """``(family, registered name)`` of ``method``: family ``"blocks"``, ``"chain"`` or
    ``"graph"`` (names both kinds have are chain methods unless ``"graph:<name>"``)."""
    if isinstance(method, str) and method.startswith("graph:") and method[6:] in GRAPH_METHODS:
        return "graph", method[6:]
    if method in BLOCK_METHODS:
        return "blocks", "block_rotor" if method == "auto" else method
    if method in CHAIN_METHODS:
        return "chain", method
    if method in GRAPH_METHODS:
        return "graph", method
    names = (*BLOCK_METHODS, *CHAIN_METHODS, *(m for m in GRAPH_METHODS if m not in CHAIN_METHODS),
             *(f"graph:{m}" for m in GRAPH_METHODS if m in CHAIN_METHODS))  # fmt: skip
    raise ValueError(f"method = {method!r}: expected one of {', '.join(names)}")


def _whole_limit(method: str, whole_graph: int) -> int:
    """The ``whole_graph`` limit ``method`` plans with: ``"auto"``'s, 0 for the rest."""
    if isinstance(whole_graph, bool) or not isinstance(whole_graph, int) or whole_graph < 0:
        raise ValueError(f"whole_graph = {whole_graph!r}: expected an int >= 0 (variables)")
    return whole_graph if method == "auto" else 0


def fixed_options(bm: BlockModel, name: str = "store_all") -> tuple[int, ...]:
    """One option per block: the store-all reference's, or the option called ``name``."""
    if name == "store_all":
        return reference_schedule(bm).options
    found = []
    for k, stage in enumerate(bm.problem.stages):
        names = [o.name for o in stage.options]
        if name not in names:
            raise ValueError(f"graph_option = {name!r}: block {k} has options {names}")
        found.append(names.index(name))
    return tuple(found)


def _solve_fixed(bm: BlockModel, nbytes: int, family: str, name: str, options: dict):
    """A chain or graph method on fixed options (the store-all reference's, or
    ``options["graph_option"]``): on ``to_chain`` (an upper bound of the block chain,
    which prices the schedule) or on the block graph (exact)."""
    options = dict(options)
    chosen = fixed_options(bm, options.pop("graph_option", "store_all"))
    if family == "graph":
        graph, _ = block_graph(bm.problem, chosen)
        schedule = solvers.solve(graph, nbytes, method=name, **options)
        return schedule
    chain_schedule = solvers.solve(bm.problem.to_chain(chosen), nbytes, method=name, **options)
    meta = {**chain_schedule.meta, "solved_on": "to_chain"}
    meta["chain_peak_memory"] = meta.pop("peak_memory")
    schedule = BlockSchedule(chain_schedule.ops, meta, chosen)
    trace = simulate(bm.problem, schedule)
    schedule.meta.update(peak_memory=trace.peak_memory, makespan=trace.makespan)
    return schedule


def _solve(bm: BlockModel, budget: Any, solver: tuple, options: dict, exact: bool, whole: int = 0):
    """:func:`_solve_lazily`; with low-bit storage, until the schedule's measured
    gradient error is within the tolerance (:func:`jax_exec.auto.lowbit.within_tolerance`)."""
    if getattr(bm, "tolerance", 0.0) > 0:
        from jax_exec.auto.lowbit import within_tolerance

        return within_tolerance(bm, lambda: _solve_lazily(bm, budget, solver, options, exact))
    return _solve_lazily(bm, budget, solver, options, exact, whole)


# Exact planning compiles the kernels each answer runs and solves again; after this many
# solves, the fastest answer priced exactly so far that fits is kept (every one of them
# is exact: its kernels were compiled). Deterministic: a count, not a clock.
MAX_ROUNDS = 3


def _priced(bm: BlockModel, schedule: Schedule) -> Schedule:
    """``schedule`` with its ``peak_memory`` and ``makespan`` from ``bm.problem``."""
    trace = simulate(bm.problem, schedule)
    schedule.meta.update(peak_memory=trace.peak_memory, makespan=trace.makespan)
    return schedule


def _faster(best: Schedule | None, other: Schedule | None) -> Schedule | None:
    if other is None or (best is not None and best.meta["makespan"] <= other.meta["makespan"]):
        return best
    return other


def _solve_lazily(
    bm: BlockModel, budget: Any, solver: tuple, options: dict, exact: bool, whole: int = 0
):
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
    (:func:`jax_exec.auto.whole.fallback`)."""
    family, solver = solver
    if bm.known:  # a solve of its own: what earlier solves compiled is not known to it
        bm.known.clear()
        bm.problem = build_problem(bm)
    ref = reference_schedule(bm)
    if exact:  # the reference's kernels, and a first answer's at the estimated budget
        guess = []
        if family == "blocks" and solver == "block_rotor":
            try:  # (none where store-all fits: it is the fastest answer)
                estimated_peak = simulate(bm.problem, ref).peak_memory
                estimated = parse_budget(budget, estimated_peak)
                if estimated < estimated_peak:
                    guess = bm.used_kernels(solvers.solve(bm.problem, estimated, method=solver))
            except solvers.Infeasible:
                pass
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
        schedule = _solve_fixed(bm, nbytes, family, solver, options)
        return Solved(schedule, nbytes, reference, 1, bm, chosen if family == "graph" else ())
    if solver == "whole_milp":
        found = whole_plan(bm, nbytes, list(ref.options), exact=exact, **options)
        rounds = found.schedule.meta["whole_milp"]["rounds"]
        return Solved(found.schedule, nbytes, reference, rounds, found.model)
    schedule, rounds = _solve_rounds(bm, nbytes, solver, options, exact, ref)
    faster_exists = schedule.meta["makespan"] > reference.makespan
    if whole and faster_exists and small_enough(bm, whole):
        model, schedule = fallback(bm, schedule, nbytes, list(ref.options), exact)
        if model is not bm:  # the DP may do better still with the new save sets
            mixed = _solve_rounds(model, nbytes, solver, {}, exact, ref)[0]
            if mixed.meta["makespan"] < schedule.meta["makespan"]:
                info = schedule.meta["whole_milp"]
                mixed.meta["whole_milp"] = dict(info, chosen=False, mixed=True)
                mixed.meta["dp_makespan"] = schedule.meta.get(
                    "dp_makespan", schedule.meta["makespan"]
                )
                schedule = mixed
        return Solved(schedule, nbytes, reference, rounds, model)
    return Solved(schedule, nbytes, reference, rounds, bm)


def _solve_rounds(
    bm: BlockModel, nbytes: int, solver: str, options: dict, exact: bool, ref: Schedule
) -> tuple[Schedule, int]:
    """The block method's answer for ``nbytes`` and the number of solves
    (:func:`_solve_lazily`): the store-all reference ``ref`` competes when it fits."""
    best = None
    if solver == "block_rotor":  # the DP discretizes sizes: store-all may beat it
        fits = _priced(bm, replace(ref, meta=dict(ref.meta, method=solver, exact=True)))
        if fits.meta["peak_memory"] <= nbytes:  # the fastest schedule fits
            return fits, 1
    rounds, bounded = 0, False
    while True:
        rounds += 1
        try:
            schedule = solvers.solve(bm.problem, nbytes, method=solver, **options)
        except solvers.Infeasible as err:
            if not exact or err.min_budget is None or bounded:
                raise
            least = exact_least(bm, solver)
            bounded = True
            if nbytes < least:
                raise solvers.Infeasible(solver, nbytes, least, err.detail) from None
            bm.problem = build_problem(bm)  # feasible once its figures are exact
            continue
        compiled = bm.compile_used(schedule) if exact else 0
        if compiled:
            bm.problem = build_problem(bm)
            priced = _priced(bm, replace(schedule, meta=dict(schedule.meta)))
            best = _faster(best, priced if priced.meta["peak_memory"] <= nbytes else None)
        else:  # every figure of this answer is exact (or estimates are asked for)
            best = _faster(best, schedule)
        if not compiled or (rounds >= MAX_ROUNDS and best is not None):
            return best, rounds
        if rounds >= MAX_ROUNDS:  # estimates keep misleading: what is compiled only
            found = _compiled_only(bm, nbytes, solver, options)
            if found is not None:
                return _faster(found, best), rounds + 1


def exact_least(bm: BlockModel, solver: str) -> int:
    """The least budget of a block method, exact for the kernels its least-memory
    schedule runs, compiling only those.

    A policy's schedule is fixed: its kernels compiled, its peak is its least budget.
    For the block DP, every option's recording and backward are traced (exact saved
    bytes and frees) and the kernels not compiled yet priced at 0 temporary bytes, a
    lower bound of every figure; the least-memory schedule of that problem (options
    already compiled tried first) has its kernels compiled, until it runs only compiled
    kernels. Its peak is then exact and no schedule needs less: every other one's
    figures are bounded from below by the same problem."""
    if solver != "block_rotor":
        schedule = policy_schedule(bm.problem, solver)
        bm.compile_used(schedule)
        bm.problem = build_problem(bm)
        return simulate(bm.problem, schedule).peak_memory
    bm.trace_options()
    while True:
        bound = build_problem(bm, lower=True)
        least, _ = least_memory(bound)
        prefer = [
            sorted(range(len(stage.options)), key=lambda o, k=k: (not bm.option_exact(k, o), o))
            for k, stage in enumerate(bound.stages)
        ]
        ops, options = least_memory_ops(bound, least, prefer)
        if bm.compile_used(BlockSchedule(ops, {}, options)) == 0:
            return least


def _compiled_only(bm: BlockModel, nbytes: int, solver: str, options: dict) -> Schedule | None:
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


def _shape_key(tree: Any) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    shapes = tuple(
        (tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x)))) for x in leaves
    )
    return (treedef, shapes)


class PlanCache:
    """Plans by what determines them: the model's graph definition (its classes,
    structure and static attributes, compared by equality: configurations held as
    unhashable dataclasses or lists are fine) and the shapes and dtypes of its state and
    of the arguments (hashed)."""

    def __init__(self) -> None:
        self.entries: dict[tuple, list[tuple[Any, Any]]] = {}

    def get(self, graphdef: Any, key: tuple) -> Any:
        for planned, value in self.entries.get(key, ()):
            if same(planned, graphdef):
                return value
        return None

    def put(self, graphdef: Any, key: tuple, value: Any) -> None:
        self.entries.setdefault(key, []).append((graphdef, value))

    def values(self) -> list:
        return [value for entries in self.entries.values() for _, value in entries]

    def __len__(self) -> int:
        return sum(len(e) for e in self.entries.values())


def value_and_grad(
    loss_fn: Callable,
    *,
    budget: int | str,
    method: str = "auto",
    has_aux: bool = False,
    **plan_options: Any,
) -> Callable:
    """``f(model, *args) -> (loss, grads)`` (``((loss, aux), grads)`` with ``has_aux``),
    like ``nnx.value_and_grad(loss_fn, has_aux=has_aux)``, following a plan made on the
    first call for each model (its graph definition: classes, structure, static
    attributes) and shapes and dtypes of its state and the arguments (like
    ``jax.jit``'s cache). ``f.plans`` holds them, ``f.plan`` is the last one used. The
    model's state (BatchNorm statistics, RNG counters) is updated in place as the plain
    call would. Called eagerly, the step runs compiled (one ``jax.jit`` per plan); it
    composes with ``nnx.jit`` / ``jax.jit`` and optax. Plans are made as :func:`plan`
    makes them (``exact=True`` unless ``plan_options`` say otherwise), so a budget means
    the same bytes here and there.
    """
    if _solver(method)[0] == "graph":
        raise ValueError(
            f"method = {method!r}: value_and_grad runs the compiled step, which follows "
            f"block-chain schedules; a graph method's schedule runs op by op (plan(...).run)"
        )
    plans = PlanCache()

    def f(model: Any, *args: Any):
        graphdef, params, rest = split_model(model)
        key = (_shape_key(params), _shape_key(rest), _shape_key(args))
        found = plans.get(graphdef, key)
        if found is None:
            p = plan(loss_fn, model, *args, budget=budget, method=method, has_aux=has_aux,
                     **plan_options)  # fmt: skip
            found = (p, jax.jit(jax.value_and_grad(p.lowered(), has_aux=True)))
            plans.put(graphdef, key, found)
        f.plan, step = found
        (loss, (aux, new_rest)), grads = step(params, rest, args)
        nnx.update(model, new_rest)
        return ((loss, aux), grads) if has_aux else (loss, grads)

    f.plans = plans  # type: ignore[attr-defined]
    f.plan = None  # type: ignore[attr-defined]
    return f

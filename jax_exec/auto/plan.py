"""``plan`` and its :class:`Plan`: the automatic planner's entry point (docs/auto.md).

It follows Flax NNX's calling convention: ``loss_fn(model, *args)`` returns a scalar
(or ``(scalar, aux)`` with ``has_aux``), gradients are for the model's ``nnx.Param``s.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
from flax import nnx

import solvers
from jax_exec.auto.arguments import bind_arguments, traced_arguments
from jax_exec.auto.exact import Solved, solve
from jax_exec.auto.methods import check_plan_options, solver_of, whole_limit
from jax_exec.auto.offload import as_platform, has_host_link
from jax_exec.auto.pause_gc import without_gc
from jax_exec.auto.whole import WHOLE_GRAPH_VARIABLES
from jax_exec.execute.graph import run_graph_schedule
from jax_exec.execute.interpreter import run_schedule
from jax_exec.execute.lowering import lower
from jax_exec.execute.result import RunResult, tree_bytes
from jax_exec.program.analysis import CostModel
from jax_exec.program.build import block_model
from jax_exec.program.model import BlockModel
from jax_exec.program.placement import device_bytes, spread, spread_devices
from jax_exec.program.trace import graph_difference, split_model
from schedir import Graph, GraphSchedule, Platform, Schedule
from schedir.blocks.graph import block_graph
from schedir.blocks.problem import BlockChain
from schedir.blocks.schedule import BlockSchedule
from schedir.budget import BudgetError, format_bytes, is_percentage
from solvers.registry import stderr_progress

LOG = logging.getLogger("jax_exec")


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
    model_name: str = ""  # the model's class (reports)
    platform: Platform | None = None  # with a host link: remat and offload planned together
    # the most devices a parameter or argument was sharded over when planned (>1: every
    # figure is the bytes on one device, the fullest: jax_exec.program.placement)
    sharded_devices: int = 1
    # the Python flags and names among plan's arguments, constants of the plan
    # (jax_exec.auto.arguments.bind_arguments): Plan.run takes them again, the same
    arguments: Any = field(default=None, repr=False)
    # value_and_grad's plans: Flax graph nodes among the arguments are traced as their
    # state, which the planned loss returns through aux (Plan.run drops it: it is pure)
    binds_nodes: bool = False

    @property
    def overhead(self) -> float:
        """Predicted time overhead over store-all (``makespan / store_all_time - 1``)."""
        return self.schedule.meta["makespan"] / self.store_all_time - 1.0

    @property
    def options(self) -> tuple[int, ...]:
        if isinstance(self.schedule, BlockSchedule):
            return self.schedule.options
        return self.graph_options

    @without_gc
    def replan(
        self, budget: int | str, method: str | None = None, exact: bool | None = None,
        whole_graph: int | None = None, platform: Platform | str | None | bool = False,
        **options: Any,
    ) -> Plan:  # fmt: skip
        """A plan of the same model for another budget, method or platform (False: this
        plan's; no new tracing; kernels compiled so far are reused)."""
        platform = self.platform if platform is False else as_platform(platform)
        method = method or self.method
        exact = self.exact if exact is None else exact
        whole_graph = self.whole_graph if whole_graph is None else whole_graph
        start = time.perf_counter()
        solver = solver_of(method)
        check_plan_options(solver, options)
        if self.model.sharded:
            _sharded_unsupported(method, solver, 0.0, platform)
        whole = whole_limit(method, whole_graph)
        base = self.base or self.model
        done = solve(base, budget, solver, options, exact, whole, platform)
        p = make_plan(done, method, start, exact, whole_graph, base, self.model_name,
                      platform, self.sharded_devices)  # fmt: skip
        p.arguments, p.binds_nodes = self.arguments, self.binds_nodes
        return p

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
        """``fn(params, rest, args) -> (loss, (aux, new_state))`` following the schedule
        (``params, rest``: ``nnx.split(model, nnx.Param, ...)``, or the plan's ``wrt``
        filter for ``nnx.Param``; ``new_state``: the state after the call, with the
        parameters ``loss_fn`` wrote,
        :meth:`~jax_exec.program.flat.Program.outputs`; the compiled path,
        :func:`jax_exec.execute.lowering.lower`; ``loops=False`` unrolls the scan runs
        it keeps as loops). Graph schedules have no compiled path (they run op by op,
        :meth:`run`)."""
        if isinstance(self.schedule, GraphSchedule):
            raise ValueError(
                f"method {self.method!r} makes a graph schedule, which runs op by op only "
                f"(Plan.run); the compiled path follows block-chain schedules (method "
                f"'auto', a JAX policy or a chain method)"
            )
        return lower(self.model, self.schedule, loops=loops)

    def run(self, model: Any, *args: Any, **kwargs: Any) -> RunResult:
        """Run the schedule op by op (measured memory) on ``model`` and the arguments
        (as planned: the same shapes, Python flags and keywords; ``value_and_grad``'s
        plans, ``f.plan``, take the call's). The model is not modified (nor graph nodes
        among the arguments): the state after the step is
        ``result.new_state`` (``nnx.update(model, result.new_state)`` applies it), the
        graph nodes' ``result.node_states``. An
        inexact plan is made exact first (its schedule may change). A plan of sharded
        arrays runs its kernels on the devices they are sharded over, each value where
        it was planned (arrays placed otherwise are copied there first); its figures
        are per device (the fullest device's; ``result.device_peaks`` each one's)."""
        if not self.exact:
            exact = self.replan(self.budget, exact=True)
            self.schedule, self.exact, self.problem = exact.schedule, True, exact.problem
            self.model = exact.model
        args, bound_nodes = traced_arguments(self.arguments, self.binds_nodes, args, kwargs)
        graphdef, params, rest = split_model(model, self.model.traced.wrt)
        difference = graph_difference(self.model.traced.graphdef, graphdef)
        if difference is not None:
            raise ValueError(
                f"model: {difference}; the plan follows the planned model's computation, "
                f"plan this model (e.g. after eval() or train()) on its own"
            )
        if not self.model.sharded and spread((params, rest, tuple(args))):
            n = spread_devices((params, rest, tuple(args)))
            raise ValueError(
                f"Plan.run: the arrays are sharded over {n} devices and the plan was made "
                f"for one (planned under jax.jit, where arrays have no concrete sharding, "
                f"or on unsharded arrays): plan these arrays with jax_exec.plan outside "
                f"jit to run them op by op"
            )
        if isinstance(self.schedule, GraphSchedule):
            result = run_graph_schedule(self.model, self.schedule, self.graph_options,
                                        params, rest, args)  # fmt: skip
        else:
            result = run_schedule(self.model, self.schedule, params, rest, args)
        if bound_nodes:  # (aux, the nodes' new state): the run is pure
            aux, states = result.aux
            result = dataclasses.replace(result, aux=aux, node_states=tuple(states))
        return result

    def figure(self, *, title: str | None = None):
        """A matplotlib ``Figure`` of the plan: its ops on a timeline (forwards,
        recordings, recomputations, backwards, host copies; roofline times, estimates),
        and the memory after every op under it with the budget, the simulator's bytes
        that the op-by-op runtime measures (:func:`schedir.render.figure`);
        ``fig.savefig(path)``."""
        from schedir.render import figure

        if title is None:
            peak = self.schedule.meta["peak_memory"]
            title = (f"{self.model_name or 'model'}: {self.method} at "
                     f"{format_bytes(self.budget)} ({self.budget / self.store_all_peak:.0%} "
                     f"of store-all): predicted peak {format_bytes(peak)}, "
                     f"step {self.overhead:+.1%} (roofline)")  # fmt: skip
        return figure(self.problem, self.schedule, budget=self.budget, title=title)

    def summary(self) -> str:
        """A readable table: per block, what it saves and recomputes, and the totals."""
        p = self.problem if isinstance(self.problem, BlockChain) else self.model.problem
        meta = self.schedule.meta
        mib = float(2**20)
        lines = [
            f"plan: method {self.method}, budget {self.budget / mib:.3f} MiB "
            f"({self.budget / self.store_all_peak:.0%} of store-all "
            f"{self.store_all_peak / mib:.3f} MiB)",
            f"predicted peak {meta['peak_memory'] / mib:.3f} MiB, step "
            f"{meta['makespan'] * 1e3:.3g} ms (overhead {self.overhead:+.1%}; roofline "
            f"estimate), {p.length} blocks + loss, planned in {self.plan_time:.1f} s",
        ]
        if self.sharded_devices > 1:
            lines.append(f"sharded over {self.sharded_devices} devices: every byte figure "
                         f"is per device (the fullest device's)")  # fmt: skip
        recorded = _record_counts(self.model, self.schedule, self.options)
        lines.append(f"{'block':>5}  {'equations':>11}  {'input MiB':>10}  {'option':<22}"
                     f"{'saved MiB':>10}  {'forwards':>8}  {'bwd tmp MiB':>11}")  # fmt: skip
        for k, stage in enumerate(p.stages):
            b = self.model.blocks.blocks[k]
            o = stage.options[self.options[k]]
            size = sum(p.value_sizes[v] for v in p.cuts[k])
            lines.append(
                f"{k:>5}  {b.start:>5}..{b.stop - 1:<5}  {size / mib:>10.4f}  {o.name:<22}"
                f"{o.saved / mib:>10.4f}  {recorded[k]:>8}  "
                f"{(o.bwd_tmp - o.bwd_release) / mib:>11.4f}"
            )
        lines += _host_lines(self.model, p, self.options)
        if "serial_makespan" in meta:
            lines.append(
                f"host copies overlap compute on their own engines: step "
                f"{meta['makespan'] * 1e3:.3g} ms; with the copies charged whole (an upper "
                f"bound) {meta['serial_makespan'] * 1e3:.3g} ms; the block DP minimized the "
                f"time with the {meta.get('dp_objective', 'copies charged whole')}"
            )
        if "host_memory" in meta:
            bound = meta["host_memory"]
            lines.append(
                f"host memory {bound['limit']:,} B: variants keeping at most "
                f"{bound['variants_below']:,} B each, {bound['solves']} solve(s) (a rule, not "
                f"an optimum under both limits)"
            )
        if meta.get("offloaded"):
            lines.append(
                f"offloaded to host memory: {', '.join(meta['offloaded'])} (abar[k]: block "
                f"k-1's recorded outputs and saved residuals; a[k]: a recomputed segment's "
                f"input); host peak {meta['host_peak'] / mib:.3f} MiB; remat alone: step "
                f"{meta.get('remat_only_makespan', float('nan')) * 1e3:.3g} ms"
            )
        lines += [
            "options: 'save all' keeps every materialized value, 'save i/n' i of its n "
            "materialized values (the block's save-set MILP), 'whole i/n' the save set the "
            "whole-graph MILP chose; 'nothing_saveable', 'checkpoint_dots', "
            "'everything_saveable' are JAX's policies, 'xla_fused' what XLA keeps for a "
            "plain step; a suffix '+bfloat16' (+float8, +int8) stores the saved values in "
            "low bits, '+late' keeps those its backward's first phase does not read in host "
            "memory until the phase that reads them, '+host' keeps all of them there, "
            "those its first phase reads back at its start ('saved MiB': the device "
            "part).",
            "forwards: how many times the block's forward runs (1: never recomputed); "
            "'saved MiB' is what its recording keeps beyond its outputs, the rest of its "
            "residuals is recomputed in its backward; 'bwd tmp MiB': its backward's "
            "temporaries less what it frees of its own buffers before its peak.",
        ]
        return "\n".join(lines)


def _host_lines(model: BlockModel, p: BlockChain, options: tuple) -> list[str]:
    """Per block whose option keeps residuals in host memory: each one's shape, dtype
    and bytes, and the backward phase before which it is back on the device."""
    lines = []
    for k, o in enumerate(options):
        if k >= model.length or not p.stages[k].options[o].host:
            continue
        new = model.functions(k, o).recipe.new
        back, sizes = model.host_returns(k, o), model.host_residuals(k, o)
        phases = len(model.phased(k, o).phases)
        held = "; ".join(
            f"{new[i].dtype}{list(new[i].shape)} {sizes[i]:,} B back before phase {j}"
            for i, j in sorted(back.items(), key=lambda item: (item[1], item[0]))
        )
        lines.append(f"block {k} residuals in host memory from its recording to its "
                     f"backward ({phases} phases): {held}")  # fmt: skip
    return lines


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


@without_gc
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
    platform: Platform | str | None = None,
    progress: bool | Callable[[float, str], None] = False,
    wrt: Any = nnx.Param,
    **options: Any,
) -> Plan:
    """Plan a training step of ``loss_fn(model, *args)`` under ``budget``.

    ``budget``: bytes of activations: an int, ``"12GiB"`` / ``"1.5 GB"``, a percentage
    of the store-all peak (``"50%"``, :func:`schedir.budget.parse_budget`), or
    ``"device"``: the device's memory as JAX reports it (``memory_stats()``) less what
    the step holds besides activations (parameters, their gradients, the model state
    and the arguments); on a backend that reports none (CPU) a ``BudgetError`` says to
    give bytes. ``method``: ``"auto"`` (the block DP, :mod:`solvers.block_rotor`),
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
    ``platform``: a :class:`schedir.Platform` with a host link (or a preset name:
    ``"pcie3"``, ``"pcie4"``, ``"pcie5"``, ``"nvlink-c2c"``; ``jax_exec.measure_platform()``
    measures the machine at hand): ``"auto"`` also plans remat and host offload together
    (:mod:`jax_exec.auto.offload`), under ``platform.host_memory`` too; None (the
    default) plans remat and low-bit storage only.
    ``progress``: ``True`` shows what planning does (kernels compiled, solver rounds) on
    stderr once it has run about 2 s: a bar on a terminal, else a line a second; a
    callable ``progress(fraction, message)`` receives the reports instead (fraction NaN
    where none is known).
    ``wrt``: the parameters differentiated, a Flax filter of ``nnx.Param`` variables
    (``nnx.DiffState(0, wrt)`` in ``nnx.value_and_grad``; e.g. ``nnx.LoRAParam``: the
    other parameters are state, read and not differentiated); ``Plan.lowered()`` then
    takes ``nnx.split(model, wrt, ...)``'s parts.

    Raises:
        solvers.Infeasible: the budget is below the least feasible one (``min_budget``).
        TypeError / ValueError: a malformed model, loss, budget or method.
        jax_exec.auto.UnsupportedModel: an operation the planner cannot handle.
    """
    solver = solver_of(method)
    check_plan_options(solver, options)
    start = time.perf_counter()
    if not (isinstance(progress, bool) or callable(progress)):
        raise TypeError(f"progress = {progress!r}: expected True, False or a callable")
    report = stderr_progress("jax_exec.plan") if progress is True else progress or None
    if isinstance(max_anchors, bool) or not isinstance(max_anchors, int) or max_anchors < 1:
        raise ValueError(f"max_anchors = {max_anchors!r}: expected an int >= 1")
    platform = as_platform(platform)
    if activation_storages is not None and not activation_tolerance:
        raise ValueError("activation_storages: low-bit storage needs activation_tolerance > 0")
    if activation_tolerance and solver[0] == "graph":
        raise ValueError(
            f"method = {method!r}: low-bit storage measures the compiled step's gradient, "
            f"and a graph schedule has no compiled path"
        )
    loss_fn, args, arguments, _ = bind_arguments(loss_fn, args, {}, has_aux, nodes=False)
    # (the reference's kernels compile ahead for a percentage, which reads its peak first;
    # a budget in bytes may be below the least one, refused before they are compiled)
    bm = block_model(loss_fn, model, args, has_aux=has_aux, cost_model=cost_model,
                     max_anchors=max_anchors, ahead=exact and is_percentage(budget),
                     wrt=wrt)  # fmt: skip
    if bm.sharded:
        _sharded_unsupported(method, solver, activation_tolerance, platform)
    if activation_tolerance:  # low-bit residuals (jax_exec/auto/lowbit.py)
        from jax_exec.auto.lowbit import with_lowbit

        bm = with_lowbit(bm, args, activation_tolerance, activation_storages)
    whole = whole_limit(method, whole_graph)  # low-bit storage plans by the DP alone
    devices = spread_devices((bm.traced.params, bm.traced.rest, tuple(args)))
    if isinstance(budget, str) and budget.strip() == "device":
        budget = device_room(model, args, wrt)
    bm.progress = report
    try:
        done = solve(bm, budget, solver, options, exact, whole, platform)
    finally:
        bm.progress = None
        if hasattr(report, "done"):
            report.done()
    p = make_plan(done, method, start, exact, whole_graph, bm, type(model).__name__, platform,
                  devices)  # fmt: skip
    p.arguments = arguments
    return p


def _sharded_unsupported(method: str, solver: tuple, tolerance: float, platform: Any) -> None:
    """Refuse what a sharded model cannot be planned with yet (a typed error naming the
    argument): graph methods, low-bit storage, host offload."""
    if solver[0] == "graph":
        raise ValueError(f"method = {method!r}: a model sharded over several devices is "
                         f"planned by block-chain methods ('auto', a JAX policy, a chain "
                         f"method); graph schedules run on one device")  # fmt: skip
    if tolerance:
        raise ValueError("activation_tolerance: low-bit storage is not planned for a model "
                         "sharded over several devices")  # fmt: skip
    if has_host_link(platform):
        raise ValueError("platform: host offload is not planned for a model sharded over "
                         "several devices (give platform=None)")  # fmt: skip


def device_memory(field: str = "budget") -> int:
    """The first device's memory in bytes as JAX reports it (``memory_stats()
    ["bytes_limit"]``); ``BudgetError`` naming ``field`` where the backend reports none."""
    device = jax.devices()[0]
    stats = device.memory_stats()
    if not stats or "bytes_limit" not in stats:
        raise BudgetError(
            f"{field} = 'device': the {device.platform} backend reports no memory limit "
            f"(memory_stats() is {stats!r}); give bytes, e.g. {field}='12GiB'"
        )
    return int(stats["bytes_limit"])


def device_room(model: Any, args: tuple, wrt: Any = nnx.Param) -> int:
    """Bytes the device leaves for activations: its memory less the parameters
    differentiated (``wrt``), their gradients (as many bytes), the model's other state
    and the arguments (arrays sharded over several devices: their shards on the fullest
    device)."""
    _, params, rest = split_model(model, wrt)
    held = 2 * tree_bytes(params) + tree_bytes(rest) + tree_bytes(tuple(args))
    if spread((params, rest, tuple(args))):
        arrays = [x for x in jax.tree.leaves((params, params, rest, tuple(args)))
                  if isinstance(x, jax.Array)]  # fmt: skip
        held = max(device_bytes(arrays).values())
    room = device_memory() - held
    if room <= 0:
        raise BudgetError(
            f"budget = 'device': the parameters, gradients, state and arguments "
            f"({held:,} B) fill the device's {device_memory():,} B"
        )
    return room


def make_plan(done: Solved, method: str, start: float, exact: bool, whole_graph: int,
              base: BlockModel, name: str = "", platform: Platform | None = None,
              sharded: int = 1) -> Plan:  # fmt: skip
    """The :class:`Plan` of a solve, logged in one line (``logging.getLogger("jax_exec")``,
    INFO)."""
    done.schedule.meta["compile_rounds"] = done.rounds
    problem = done.model.problem
    if isinstance(done.schedule, GraphSchedule):
        problem = block_graph(done.model.problem, done.graph_options)[0]
    plan = Plan(
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
        model_name=name,
        platform=platform,
        sharded_devices=sharded,
    )
    _log(plan)
    return plan


def _log(p: Plan) -> None:
    if not LOG.isEnabledFor(logging.INFO):
        return
    meta = p.schedule.meta
    LOG.info(
        "planned %s (%s, %d blocks): predicted peak %s of store-all %s (%.0f%%), "
        "overhead %+.1f%%, budget %s%s, %.1f s",
        p.model_name or "model", p.method, p.model.length, format_bytes(meta["peak_memory"]),
        format_bytes(p.store_all_peak), 100 * meta["peak_memory"] / max(p.store_all_peak, 1),
        100 * p.overhead, format_bytes(p.budget),
        f" (per device, sharded over {p.sharded_devices})" if p.sharded_devices > 1 else "",
        p.plan_time,
    )  # fmt: skip

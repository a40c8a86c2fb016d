"""The whole device's budget: ``jax_exec.plan_device`` (docs/device_memory.md).

A device holds the parameters, their gradients, the optimizer state, communication
buffers and the activations of its share of the batch. :func:`plan_device` chooses,
for a budget B in bytes per device, where the training state lives (a
:class:`schedir.device_step.Strategy`: replicated, sharded over the ``data`` axis as
ZeRO stages 1-3 do, or the optimizer state and its update on the host as ZeRO-Offload
does; and whether stage 3's gathers and the gradients' reduce-scatters overlap
compute) together with the rematerialization schedule of the activations:

1. the batch is split over the N devices; the automatic planner
   (:func:`jax_exec.auto.plan`) traces one device's share, cuts it into blocks and
   gives each its save options (and low-bit ones with ``activation_tolerance``);
2. the training state's tensors come from the model and ``jax.eval_shape`` of the
   optimizer's ``init`` (:func:`jax_exec.zero.state_bytes`), exactly; each block's
   parameters are those its equations read;
3. for every strategy (:func:`schedir.device_step.strategies`), the bytes it holds
   besides activations (:func:`schedir.device_step.fixed_bytes`) leave B - fixed to
   the activations; the block planner solves that budget and the simulator's trace of
   its schedule, with the strategy's communication, gives the step time
   (:func:`schedir.device_step.device_step`);
4. the fastest strategy that fits is chosen (ties: the least memory). Below the least
   budget any strategy fits, :class:`solvers.Infeasible` carries that ``min_budget``.

The result, a :class:`DevicePlan`, lists every strategy considered (``table()``) and
runs the chosen one on a mesh (:meth:`DevicePlan.zero_step`: the ZeRO step of
:mod:`jax_exec.zero` whose per-device gradient follows the activation schedule,
``shard_map`` over ``data``; :meth:`DevicePlan.run`: one step with measured bytes).

A model sharded by its authors (``nnx.with_partitioning`` under ``jax.set_mesh``, or
whenever ``spmd="gspmd"``) is planned and run through GSPMD instead: the activation plan
is of the global batch (the one program GSPMD partitions), the state keeps the model's
own shardings with ZeRO's ``data`` axis added as the stage says
(:mod:`jax_exec.zero_layout`; its bytes per device exact from those shardings), and the
step is one ``jax.jit`` on the model's mesh (docs/device_memory.md, "Models sharded by
their authors (GSPMD)").
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import jax
from jax.sharding import Mesh

import solvers
from jax_exec import auto
from jax_exec.auto.least import in_user_units
from jax_exec.auto.plan import Plan, device_memory
from jax_exec.device_run import DeviceRun, default_mesh, per_device
from jax_exec.program.analysis import CostModel
from jax_exec.zero import AXIS, HOST, ZeroStep, measured_bytes, split_params, state_bytes
from jax_exec.zero_blocks import gspmd_value_and_grad, planned_value_and_grad
from jax_exec.zero_layout import model_mesh
from schedir import simulate
from schedir.budget import parse_budget
from schedir.device_step import (
    DeviceStep,
    FixedBytes,
    StepCosts,
    Strategy,
    data_parallel_platform,
    device_step,
    fixed_bytes,
    strategies,
)
from schedir.platform import Platform
from schedir.training_state import Placement, Tensor, shard_axis
from solvers.blocks.policies import policy_schedule


@dataclass(frozen=True)
class Alternative:
    """One strategy considered.

    Attributes:
        strategy: the strategy.
        fixed: what it holds besides activations (state, buffers, update bytes).
        min_budget: the least device budget at which it fits (bytes).
        step: its simulated step (None: it does not fit the budget).
        activation_plan: the activation schedule it runs (None: it does not fit).
        exact: whether its activation figures come from compiled kernels (else the
            temporaries are estimated).
    """

    strategy: Strategy
    fixed: FixedBytes
    min_budget: int
    step: DeviceStep | None = None
    activation_plan: Plan | None = field(default=None, repr=False)
    exact: bool = False

    @property
    def fits(self) -> bool:
        return self.step is not None


@dataclass
class DevicePlan:
    """The chosen strategy and activation schedule for one device (module docstring).

    Attributes:
        strategy: the chosen :class:`~schedir.device_step.Strategy`.
        step: its simulated step: ``peak_bytes`` (predicted per device), ``step_time``
            (seconds), the state, buffers and activation figures.
        activation_plan: the per-device activation plan (a :class:`jax_exec.auto.Plan`).
        alternatives: every strategy considered, in :func:`strategies` order.
        budget: bytes per device.
        min_budget: the least budget at which some strategy fits (bytes).
        reference_bytes: plain data parallelism with every activation stored (ZeRO-0,
            the store-all activation peak, estimated temporaries), for comparison.
        data_parallel: N.
        params, opt_state: the training state's tensors.
        block_params: per block (the loss stage last), the parameter indices it reads.
        costs: the optimizer update's throughputs.
        exact: whether the chosen figures and ``min_budget`` come from compiled kernels.
        plan_time: seconds spent planning.
        spmd: ``"shard_map"`` (each device's share planned and run under ``shard_map``)
            or ``"gspmd"`` (the global batch planned, run as one program that GSPMD
            partitions, the model's own shardings kept).
        traced_mesh: the axes of the mesh the model was traced under (``jax.set_mesh``)
            or its parameters are sharded on, if any.
    """

    strategy: Strategy
    step: DeviceStep
    activation_plan: Plan
    alternatives: tuple[Alternative, ...]
    budget: int
    min_budget: int
    reference_bytes: int
    data_parallel: int
    optimizer: Any = field(repr=False)
    platform: Platform = field(repr=False)
    params: tuple[Tensor, ...] = field(repr=False)
    opt_state: tuple[Tensor, ...] = field(repr=False)
    block_params: tuple[tuple[int, ...], ...] = field(repr=False)
    loss_fn: Callable = field(repr=False)
    costs: StepCosts = field(repr=False, default_factory=StepCosts)
    exact: bool = True
    plan_time: float = 0.0
    spmd: str = "shard_map"
    traced_mesh: dict = field(default_factory=dict)

    def table(self) -> str:
        """One row per strategy considered: whether it fits, its predicted device peak
        and its parts, step time and exposed communication, least budget."""
        head = (f"{'strategy':<34} {'fits':<4} {'peak B':>12} {'state B':>11} "
                f"{'buffers B':>10} {'activ. B':>11} {'step s':>10} {'exposed':>8} "
                f"{'remat':>7} {'least B':>12}")  # fmt: skip
        lines = [head]
        for alt in self.alternatives:
            mark = "*" if alt.strategy == self.strategy else " "
            name = f"{mark}{alt.strategy.name}"
            state = alt.fixed.state.resident
            if alt.step is None:
                lines.append(f"{name:<34} {'no':<4} {'':>12} {state:>11,} "
                             f"{alt.fixed.buffers:>10,} {'':>11} {'':>10} {'':>8} {'':>7} "
                             f"{alt.min_budget:>12,}")  # fmt: skip
                continue
            s, ap = alt.step, alt.activation_plan
            peak = f"{'' if alt.exact else '~'}{s.peak_bytes:,}"
            lines.append(f"{name:<34} {'yes':<4} {peak:>12} {state:>11,} "
                         f"{s.buffers:>10,} {s.activation_peak:>11,} {s.step_time:>10.3e} "
                         f"{s.exposed_time / s.step_time:>8.1%} {ap.overhead:>+7.1%} "
                         f"{alt.min_budget:>12,}")  # fmt: skip
        lines.append("*: chosen; ~: estimated temporaries; exposed: share of the step spent "
                     "waiting for communication; remat: the activation schedule's compute "
                     "overhead; least: the least budget at which the strategy fits")  # fmt: skip
        return "\n".join(lines)

    def summary(self) -> str:
        s = self.step
        return "\n".join([
            f"device plan: {self.data_parallel} data-parallel devices, budget "
            f"{self.budget:,} B per device ({self.budget / self.reference_bytes:.0%} of plain "
            f"data parallelism storing every activation, ~{self.reference_bytes:,} B); least "
            f"feasible {'' if self.exact else '~'}{self.min_budget:,} B",
            f"chosen {self.strategy.name}: predicted peak {s.peak_bytes:,} B (state "
            f"{s.state.resident:,}, buffers {s.buffers:,}, activations {s.activation_peak:,}), "
            f"step {s.step_time:.3e} s (compute {s.compute_time:.3e}, update "
            f"{s.update_time:.3e}, exposed communication {s.exposed_time:.3e}); planned in "
            f"{self.plan_time:.1f} s",
            *self._gspmd_lines(),
            *self._lowbit_line(),
            self.table(),
        ])  # fmt: skip

    def _gspmd_lines(self) -> list[str]:
        if self.spmd != "gspmd":
            return []
        n = self.data_parallel
        own = sum(t.data_axis is not None for t in self.params)
        added = sum(t.data_axis is None and shard_axis(t.shape, n) is not None
                    for t in self.params)  # fmt: skip
        mesh = self.traced_mesh or {AXIS: n}
        return [
            f"GSPMD on the mesh {mesh}: state bytes are per device, exact from the "
            f"shardings; activation bytes are per device as the planner placed the "
            f"traced step's values on the arrays it was given (a batch given unsharded "
            f"counts whole on every device: conservative for the step, which splits it "
            f"over {AXIS!r})",
            f"the model shards {own} of {len(self.params)} parameter tensors over {AXIS!r} "
            f"itself (kept sharded under every stage); ZeRO-3 splits {added} more",
        ]  # fmt: skip

    def _lowbit_line(self) -> list[str]:
        report = self.activation_plan.schedule.meta.get("lowbit")
        if not report:
            return []
        used = sorted({s for s in report["storage"] if s})
        return [f"low-bit activations: {', '.join(used) or 'none'} "
                f"({sum(1 for s in report['storage'] if s)} of {len(report['storage'])} "
                f"blocks), {report['saved_bytes']:,} residual bytes saved, gradient relative "
                f"error {report['gradient_error']:.2e} on the example batch (tolerance "
                f"{report['tolerance']:g})"]  # fmt: skip

    def zero_step(self, mesh: Mesh) -> ZeroStep:
        """The chosen strategy as a :class:`jax_exec.zero.ZeroStep` on ``mesh`` (its
        ``data`` axis of size N): each device runs the activation schedule on its share
        of the batch (``shard_map``; the plan's compiled path), its blocks gathering
        their sharded parameters just in time and reducing their gradients after their
        backward (:mod:`jax_exec.zero_blocks`); the update is placed as the strategy
        says. The batch is ``args`` as a tuple. GSPMD (``spmd="gspmd"``): the plan's
        compiled step of the global batch inside the same ``jax.jit``, on the mesh the
        model is sharded on, the model's shardings kept with ZeRO's ``data`` axis
        added (:mod:`jax_exec.zero_layout`)."""
        n = self.data_parallel
        if AXIS not in mesh.shape or mesh.shape[AXIS] != n:
            raise ValueError(f"mesh axes {dict(mesh.shape)}: expected a {AXIS!r} axis of {n}")
        if self.traced_mesh and dict(mesh.shape) != self.traced_mesh:
            raise ValueError(
                f"mesh axes {dict(mesh.shape)}: the model was planned on a mesh "
                f"{self.traced_mesh}; run it on that mesh"
            )
        placement = self.strategy.placement
        gspmd = self.spmd == "gspmd"
        if gspmd:
            value_and_grad = gspmd_value_and_grad(self.activation_plan)
        else:
            value_and_grad = planned_value_and_grad(self.activation_plan, mesh, placement)
        loss_fn = self.loss_fn
        return ZeroStep(lambda m, batch: loss_fn(m, *batch), self.optimizer, mesh,
                        self.strategy.stage, placement.opt_state == "host",
                        value_and_grad, keep_shardings=gspmd)  # fmt: skip

    def make_exact(self) -> None:
        """Re-plan the chosen activation budget with compiled kernels and re-price the
        chosen strategy (its schedule may change; the alternatives keep their figures)."""
        p = self.activation_plan.replan(self.activation_plan.budget, exact=True)
        trace = simulate(p.problem, p.schedule)
        self.step = device_step(trace, self.block_params, self.params, self.opt_state,
                                self.strategy, self.data_parallel, self.platform,
                                self.costs)  # fmt: skip
        self.activation_plan = p
        self.alternatives = tuple(
            replace(a, step=self.step, activation_plan=p, exact=True)
            if a.strategy == self.strategy else a
            for a in self.alternatives
        )  # fmt: skip

    def run(self, model: Any, *args: Any, mesh: Mesh | None = None) -> DeviceRun:
        """One training step of the chosen strategy on ``mesh`` (default: the mesh the
        model's parameters are sharded on, else the first N devices), and the op-by-op
        run of the activation schedule on the first device's share (GSPMD: on the
        global batch, on one device); measured bytes next to the prediction
        (:class:`DeviceRun`). An inexact plan is made exact first (:meth:`make_exact`)."""
        if mesh is None:
            mesh = model_mesh(split_params(model)[1]) or default_mesh(self.data_parallel)
        if not self.activation_plan.exact:
            self.make_exact()
        step = self.zero_step(mesh)
        state = step.init(model)
        state, loss, grads = step.with_grads(state, tuple(args))
        measured = {}
        trees = {"params": state.params, "grads": grads, "opt_state": state.opt_state}
        for name, tree in trees.items():
            measured[name] = measured_bytes(tree, memory_kind="device")
        measured["host"] = measured_bytes(state.opt_state, memory_kind=HOST)
        if self.spmd == "gspmd":  # op by op on the sharded arrays, bytes per device
            activations = self.activation_plan.run(model, *args)
        else:
            activations = self.activation_plan.run(
                model, *per_device(tuple(args), self.data_parallel)
            )
        return DeviceRun(loss, state, grads, measured, activations.peak_bytes, step, self)


def block_params(model: Any) -> tuple[tuple[int, ...], ...]:
    """Per block of a :class:`jax_exec.program.model.BlockModel` (the loss stage last), the
    indices of the parameters its equations read (a slice of a scanned stack counts as
    the whole stacked parameter)."""
    program = model.program
    pos = {v: i for i, v in enumerate(program.param_ids)}

    def index(v: int) -> int:
        return pos[v] if v in pos else pos[program.derived[v][0]]

    return tuple(tuple(sorted({index(v) for v in lay.params})) for lay in model.layouts)


def _least(act: Plan, exact: bool) -> int:
    """The activation planner's least budget (exact: of compiled kernels)."""
    try:
        act.replan(0, exact=exact)
    except solvers.Infeasible as err:
        return err.min_budget
    return 0


def plan_device(
    loss_fn: Callable,
    model: Any,
    *args: Any,
    budget: int | str,
    optimizer: Any,
    data_parallel: int | None = None,
    platform: Platform | None = None,
    step_costs: StepCosts | None = None,
    cost_model: CostModel | None = None,
    exact: bool = True,
    spmd: str | None = None,
    **options: Any,
) -> DevicePlan:
    """Plan one training step of ``loss_fn(model, *args)`` (``args``: the global batch)
    on ``data_parallel`` devices under ``budget`` bytes per device (module docstring).

    Args:
        budget: bytes per device: an int, ``"12GiB"``, or a percentage of the plain
            step's bytes per device (``"50%"``, :attr:`DevicePlan.reference_bytes`),
            :func:`schedir.budget.parse_budget`.
        optimizer: an optax ``GradientTransformation`` (its state is counted exactly).
        data_parallel: N, the devices of the ``data`` axis; None (the default): the
            size of the ``data`` axis of the mesh the model is traced under or its
            parameters are sharded on, else 1.
        platform: the ring and the host link (default
            :func:`schedir.device_step.data_parallel_platform`).
        step_costs: the optimizer update's throughputs (default: the cost model's
            memory bandwidth on the device, :class:`~schedir.device_step.StepCosts`'s
            host figure).
        exact: the chosen activation schedule and ``min_budget`` from compiled kernels
            (the op-by-op runtime measures exactly them). Every strategy is first priced
            with estimated temporaries; the best is made exact, and so is any other
            whose estimate beats it, until the best is exact. With ``exact=False``
            every figure is estimated (:meth:`DevicePlan.run` makes the chosen exact).
        spmd: ``"shard_map"`` (one device's share planned, run per device with ZeRO's
            collectives per block) or ``"gspmd"`` (the global batch planned and run as
            one program GSPMD partitions, the model's own shardings kept, its mesh's
            ``data`` axis of ``data_parallel``); default: ``"gspmd"`` for a model traced
            under a mesh or with parameters sharded over several devices.
        cost_model, options: passed to :func:`jax_exec.auto.plan` (``method``,
            ``activation_tolerance``...).

    Raises:
        solvers.Infeasible: no strategy fits (``min_budget``: the least that does).
        TypeError / ValueError: a malformed optimizer, data_parallel, batch, budget or
            spmd; model state that is not an ``nnx.Param`` (ZeRO steps train parameters
            only); a model sharded on a mesh whose ``data`` axis is not data_parallel.
    """
    start = time.perf_counter()
    context = jax.sharding.get_abstract_mesh()  # a mesh the model is traced under
    if isinstance(budget, str) and budget.strip() == "device":
        budget = device_memory()  # the whole device, as JAX reports it
    parse_budget(budget, 1)  # a malformed budget fails before any tracing
    if not (
        callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))
    ):
        raise TypeError(
            f"optimizer = {optimizer!r}: expected an optax GradientTransformation "
            "(plan_device counts its state)"
        )
    traced = dict(context.shape) if not context.empty else {}
    n = data_parallel if data_parallel is not None else _mesh_axes(model, traced).get(AXIS, 1)
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"data_parallel = {n!r}: expected a positive int")
    n = int(n)
    spmd, mesh_shape = _spmd(spmd, model, traced, n)
    gspmd = spmd == "gspmd"
    params_t, opt_t = state_bytes(model, optimizer, keep_shardings=gspmd)
    local = per_device(args, n)  # (GSPMD: checks the batch splits over the devices)
    if gspmd:
        local = tuple(args)
    platform = platform if platform is not None else data_parallel_platform(n)
    cost_model = cost_model or CostModel()
    costs = step_costs or StepCosts(update_bytes_per_second=cost_model.bytes_per_second)
    act = auto.plan(loss_fn, model, *local, budget="100%", cost_model=cost_model, exact=False,
                    **options)  # fmt: skip
    groups = block_params(act.model)
    act_min = _least(act, exact)
    problem = act.model.problem
    cap = simulate(problem, policy_schedule(problem, "everything_saveable")).peak_memory
    plain = fixed_bytes(groups, params_t, opt_t, Strategy(Placement.zero(0)), n)
    reference = plain.fixed + max(act.store_all_peak, plain.update_bytes)
    nbytes = parse_budget(budget, reference)  # a percentage of the plain step's device bytes
    plans: dict[tuple[int, bool], Plan] = {}

    def price(strategy: Strategy, held: FixedBytes, least: int, precise: bool) -> Alternative:
        room = nbytes - held.fixed
        key = (room if precise else min(room, cap), precise)
        if key not in plans:
            try:
                plans[key] = act.replan(key[0], exact=precise)
            except solvers.Infeasible:
                if precise:
                    raise
                # estimated temporaries may not fit where the exact least budget does
                key = (room, True)
                plans[key] = plans.get(key) or act.replan(room, exact=True)
                precise = True
        p = plans[key]
        s = device_step(simulate(p.problem, p.schedule), groups, params_t, opt_t, strategy, n,
                        platform, costs)  # fmt: skip
        return Alternative(strategy, held, least, s, p, precise)

    rows = []
    for strategy in strategies():
        held = fixed_bytes(groups, params_t, opt_t, strategy, n)
        least = held.fixed + max(act_min, held.update_bytes)
        fits = nbytes >= least
        rows.append(
            price(strategy, held, least, False) if fits else Alternative(strategy, held, least)
        )
    least = min(a.min_budget for a in rows)
    if not any(a.fits for a in rows):
        err = solvers.Infeasible(
            "device",
            nbytes,
            least,
            f"{n} data-parallel devices, every ZeRO strategy"
            + ("" if exact else "; estimated temporaries (exact=False)"),
        )
        raise in_user_units(err, budget, reference, "the plain step's")

    def rank(i: int) -> tuple:
        return (rows[i].step.step_time, rows[i].step.peak_bytes, i)

    while True:  # the best by its figures, exact ones where known
        fitting = [i for i, a in enumerate(rows) if a.fits]
        if not fitting:
            raise solvers.Infeasible("device", nbytes, least, f"{n} data-parallel devices, "
                                     "every ZeRO strategy (compiled kernels)")  # fmt: skip
        best = min(fitting, key=rank)
        if rows[best].exact or not exact:
            break
        a = rows[best]
        try:
            rows[best] = price(a.strategy, a.fixed, a.min_budget, True)
        except solvers.Infeasible as err:  # compiled kernels need more than estimated
            need = a.fixed.fixed + max(err.min_budget or 0, a.fixed.update_bytes)
            rows[best] = Alternative(a.strategy, a.fixed, max(need, a.min_budget), exact=True)
            least = min(r.min_budget for r in rows)
    chosen = rows[best]
    return DevicePlan(
        strategy=chosen.strategy,
        step=chosen.step,
        activation_plan=chosen.activation_plan,
        alternatives=tuple(rows),
        budget=nbytes,
        min_budget=least,
        reference_bytes=reference,
        data_parallel=n,
        optimizer=optimizer,
        platform=platform,
        params=params_t,
        opt_state=opt_t,
        block_params=groups,
        loss_fn=loss_fn,
        costs=costs,
        exact=exact,
        plan_time=time.perf_counter() - start,
        spmd=spmd,
        traced_mesh=mesh_shape,
    )


SPMD = ("shard_map", "gspmd")


def _mesh_axes(model: Any, traced: dict) -> dict:
    """The axes of the model's mesh: the one its parameters are sharded on, else the
    one it is traced under (``traced``), {} for none."""
    mesh = model_mesh(split_params(model)[1])
    return dict(mesh.shape) if mesh is not None else traced


def _spmd(spmd: str | None, model: Any, traced: dict, n: int) -> tuple[str, dict]:
    """(the way to run: :func:`plan_device`'s ``spmd``, the axes of the model's mesh:
    the one it is traced under or its parameters are sharded on, {} for none);
    ValueError naming what cannot hold."""
    if spmd is not None and spmd not in SPMD:
        raise ValueError(f"spmd = {spmd!r}: expected one of {SPMD} or None")
    axes = _mesh_axes(model, traced)
    if spmd is None:
        spmd = "gspmd" if axes else "shard_map"
    if spmd == "shard_map" and axes:
        raise ValueError(
            f"spmd = 'shard_map': the model is traced under or sharded on a mesh {axes} "
            f"(jax.set_mesh, nnx.with_partitioning); the shard_map step runs each "
            f"device's share over its own {AXIS!r} mesh, which cannot run such a "
            f"program: plan it with spmd='gspmd' (its default)"
        )
    if axes and axes.get(AXIS) != n:
        raise ValueError(
            f"data_parallel = {n}: the model's mesh {axes} has "
            + (f"a {AXIS!r} axis of {axes[AXIS]}" if AXIS in axes else f"no {AXIS!r} axis")
            + f" (ZeRO places the state over a {AXIS!r} axis of data_parallel devices)"
        )
    return spmd, axes

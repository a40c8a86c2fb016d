"""A planned pipeline of a traced model and how it runs (:class:`PipelinePlan`, made by
:func:`jax_exec.pipeline.traced.plan_pipeline`; docs/pipelines.md, "Any Flax model").

Between stages a tuple travels (:func:`first_input` makes the first stage's); the last
stage ends with the loss, which the runtime's own loss function only takes
(:func:`take_loss`). A parameter read by several stages (tied embeddings) is in every
such stage's ``params``; :meth:`PipelinePlan.run` adds the stages' gradients of it on
the device of the first stage that reads it (across processes through
:func:`jax_exec.distributed.transfer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_exec.distributed import is_local, transfer_tree
from jax_exec.execute.result import RunResult
from jax_exec.pipeline.dynamic_training import run_dynamic_training
from jax_exec.pipeline.mpmd import run_pipeline
from jax_exec.pipeline.program_stages import (
    StageSlice,
    encode,
    model_leaves,
    program_stage,
)
from jax_exec.pipeline.schedules import (
    CHUNKS_PER_DEVICE,
    Predicted,
    planned,
    predicted_figures,
)
from jax_exec.pipeline.stage_storage import LowBitReport, StorageCheck
from jax_exec.program.flat import Program
from jax_exec.program.model import BlockModel
from jax_exec.program.trace import graph_difference
from jax_exec.stages.split import Stage
from schedir.pipeline.baselines import BASELINES
from schedir.pipeline.ops import Fwd
from schedir.pipeline.problem import PipelineProblem
from schedir.pipeline.schedule import PipelineSchedule


def take_loss(out: jax.Array, target: Any) -> jax.Array:
    """The runtime's loss function: the last stage already computed the loss."""
    del target
    return out


@dataclass(frozen=True)
class PipelineStep:
    """One executed step: the ``loss`` (None in a process that did not run the last
    stage), the ``grads`` in the model's ``nnx.State`` structure (a leaf is None in a
    process that did not run the first stage reading it) and the runtime's
    :class:`~jax_exec.execute.result.RunResult` (op log, bytes per op, peaks)."""

    loss: Any
    grads: Any
    result: RunResult


@dataclass(frozen=True)
class PipelinePlan:
    """A traced model cut into pipeline stages and scheduled (module docstring).

    Attributes:
        cuts: block indices ``0 = c_0 < ... < c_S = L`` of the stage boundaries (the
            loss block, index L, belongs to the last stage).
        slices: per block stage, what it runs (:class:`StageSlice`; the last one
            with the loss block).
        schedule_name: the schedule generator (a key of
            :data:`schedir.pipeline.baselines.BASELINES`).
        schedule: the per-device op lists over the block stages; with device memories
            its ``plans`` give each chunk's activation plan (kind, footprint, held
            bytes, rotor's chain ops).
        problem: the block stages as a :class:`~schedir.PipelineProblem`: sizes of
            their traced kernels (exact bytes), roofline times.
        predicted: :class:`Predicted`.
        devices: the JAX devices, in the order of the schedule's devices (``d0, d1...``,
            or the platform's).
        microbatches: micro-batches per step; ``batch``: the batch size planned for.
        loss_scale: 1 when the batch's loss is the mean of the micro-batches' losses,
            ``microbatches`` when it is their sum.
        model: the :class:`~jax_exec.program.model.BlockModel` of one micro-batch.
        alternatives: with ``schedule="auto"``, ``(schedule, simulated step seconds)``
            of every schedule tried.
        lowbit: with ``activation_tolerance``, the chunks' storages and the measured
            gradient error (:class:`~jax_exec.pipeline.stage_storage.LowBitReport`);
            else None.
        storage_check: what plans the storages and measures the error again
            (``with_schedule``); None without a tolerance.
    """

    cuts: tuple[int, ...]
    slices: tuple[StageSlice, ...]
    schedule_name: str
    schedule: PipelineSchedule
    problem: PipelineProblem
    predicted: Predicted
    devices: tuple
    microbatches: int
    batch: int
    loss_scale: float
    model: BlockModel
    alternatives: tuple[tuple[str, float], ...] = ()
    lowbit: LowBitReport | None = None
    storage_check: StorageCheck | None = field(default=None, compare=False, repr=False)

    @property
    def program(self) -> Program:
        return self.model.program

    def stages(self, model: nnx.Module) -> list[Stage]:
        """The block stages (one per block; a pipeline stage runs an interval of them)
        holding ``model``'s current parameters and state."""
        params, rest = _model_leaves(self, model)
        last = len(self.slices) - 1
        return [
            program_stage(self.program, b, s, params, rest, self.loss_scale if b == last else None)
            for b, s in enumerate(self.slices)
        ]

    def run(self, model: nnx.Module, *args: Any, block: bool = False) -> PipelineStep:
        """One training step of ``loss_fn(model, *args)`` through the pipeline: the loss
        and the gradients of ``nnx.value_and_grad`` (:class:`PipelineStep`). ``block``:
        wait for every op (exact per-op times, no overlap)."""
        stages = self.stages(model)
        x = self.inputs(args)
        result = run_pipeline(
            stages,
            self.schedule,
            x,
            (),
            take_loss,
            devices=self.devices,
            block=block,
            problem=self.problem,
        )
        device_of = _block_devices(self.schedule, result.placement)
        return PipelineStep(result.loss, self._grads(model, result.grads, device_of), result)

    def run_dynamic(
        self, model: nnx.Module, *args: Any, policy: str = "dmda", **options: Any
    ) -> PipelineStep:
        """One training step of ``loss_fn(model, *args)`` on the block stages with the
        dynamic runtime (:func:`~jax_exec.pipeline.dynamic_training.
        run_dynamic_training`: tasks placed and started by ``policy`` at run time on
        the plan's devices, the loss computed by the last block stage as in
        :meth:`run`): the loss and the gradients of ``nnx.value_and_grad``.
        ``options`` go to ``run_dynamic_training`` (``memory=`` caps per device,
        ``host_bandwidth=``, ``speeds=``, ``noise=``...); ``cuts`` (block indices, the
        task groups) defaults to the plan's stage cuts."""
        stages = self.stages(model)
        options.setdefault("cuts", self.cuts)
        options.setdefault("devices", list(self.devices))
        result = run_dynamic_training(stages, self.inputs(args), (), take_loss, policy=policy,
                                      microbatches=self.microbatches, **options)  # fmt: skip
        # each group's gradients are on the device of its update task
        device_of = {b: next(iter(leaf.devices()))
                     for b, g in enumerate(result.grads)
                     for leaf in jax.tree.leaves(g)[:1]}  # fmt: skip
        return PipelineStep(result.loss, self._grads(model, result.grads, device_of), result)

    def with_schedule(self, schedule: str) -> PipelinePlan:
        """The same stages and cut under another schedule with as many chunks per device
        (e.g. "1f1b", "gpipe", "zb_h1", "zb_h2"): no tracing, the kernels shared; with
        device memories, the chunks' activation plans made again for its micro-batches
        in flight."""
        if schedule not in BASELINES:
            raise ValueError(f"schedule = {schedule!r}: expected one of {sorted(BASELINES)} "
                             f"(the joint planner chooses its own cut: plan again)")  # fmt: skip
        per_device = (len(self.cuts) - 1) // len(self.schedule.ops)
        if CHUNKS_PER_DEVICE.get(schedule, 1) != per_device:
            raise ValueError(
                f"schedule = {schedule!r} runs another number of chunks per device than "
                f"{self.schedule_name!r}: plan again"
            )
        names = [dev for dev, _ in self.schedule.ops]
        sched, lowbit = planned(self.problem, schedule, names, self.cuts, self.storage_check)
        return replace(self, schedule_name=schedule, schedule=sched, lowbit=lowbit,
                       predicted=predicted_figures(self.problem, sched))  # fmt: skip

    def figure(self, *, title: str | None = None):
        """A matplotlib ``Figure`` of the schedule: each device's ops and the links'
        transfers on a timeline, the fullest device's memory at every instant under them
        (:func:`schedir.render.figure`; the simulator's figures: roofline times, exact
        bytes)."""
        from schedir.render import figure

        if title is None:
            title = (f"{self.schedule_name}: {len(self.cuts) - 1} stages on "
                     f"{len(self.schedule.ops)} devices, {self.microbatches} micro-batches, "
                     f"bubble {self.predicted.bubble:.0%} (roofline)")  # fmt: skip
        return figure(self.problem, self.schedule, title=title)

    def inputs(self, args: Sequence[Any]) -> tuple:
        """The first stage's input: the argument leaves it carries, encoded."""
        leaves = jax.tree_util.tree_leaves(tuple(args))
        program = self.program
        if len(leaves) != len(program.arg_ids):
            raise ValueError(
                f"the call has {len(leaves)} argument arrays, the plan "
                f"{len(program.arg_ids)}: call with the planned arguments"
            )
        by_id = {}
        for k, (vid, leaf) in enumerate(zip(program.arg_ids, leaves, strict=True)):
            planned = program.avals[vid]
            want = (self.batch, *planned.shape[1:])
            if tuple(np.shape(leaf)) != want or jnp.result_type(leaf) != planned.dtype:
                raise ValueError(
                    f"argument leaf {k} is {jnp.result_type(leaf)}"
                    f"{list(np.shape(leaf))}, the plan was made for "
                    f"{planned.dtype}{list(want)}: plan again"
                )
            by_id[vid] = leaf
        return first_input(program, self.slices[0], by_id)

    def _grads(self, model: nnx.Module, grads: Sequence, device_of: dict) -> Any:
        """Per parameter leaf, the sum of its block stages' gradients (``grads``, one
        tuple per block stage, None where another process ran it) on the device of the
        first stage reading it (``device_of``: block stage -> JAX device; None where
        that stage ran in another process)."""
        params = nnx.split(model, nnx.Param, ...)[1]
        leaves, treedef = jax.tree_util.tree_flatten(params)
        per_stage = [
            dict(zip(s.params, g, strict=True)) if g is not None else None
            for s, g in zip(self.slices, grads, strict=True)
        ]
        out = []
        for j, leaf in enumerate(leaves):
            readers = [q for q, s in enumerate(self.slices) if j in s.params]
            if not readers:  # a parameter the loss does not read: a zero gradient
                first = device_of.get(0, self.devices[0])
                out.append(jnp.zeros_like(leaf, device=first) if is_local(first) else None)
                continue
            owner = device_of[readers[0]]
            total = per_stage[readers[0]][j] if per_stage[readers[0]] is not None else None
            aval = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
            for q in readers[1:]:
                src = device_of[q]
                if not (is_local(src) or is_local(owner)):
                    continue
                part = per_stage[q][j] if per_stage[q] is not None else None
                # a 1-tuple: transfer_tree moves scalars too
                moved = transfer_tree(None if part is None else (part,), src, owner, (aval,))
                if is_local(owner):
                    total = total + moved[0]
            out.append(total if is_local(owner) else None)
        return jax.tree_util.tree_unflatten(treedef, out)


def first_input(program: Program, first: StageSlice, by_id: dict) -> tuple:
    """The first stage's input: the argument leaves it carries (value id -> leaf),
    encoded."""
    return tuple(encode(jnp.asarray(by_id[v])) for v in first.ins)


def _model_leaves(plan: PipelinePlan, model: nnx.Module) -> tuple[list, dict]:
    graphdef = nnx.split(model, nnx.Param, ...)[0]
    why = graph_difference(plan.model.traced.graphdef, graphdef)
    if why is not None:
        raise ValueError(f"the model is not the planned one: {why}; plan again")
    return model_leaves(plan.program, model)


def _block_devices(schedule: PipelineSchedule, placement: dict) -> dict[int, Any]:
    """Block stage -> the JAX device that runs it."""
    return {
        b: placement[dev]
        for dev, ops in schedule.ops
        for op in ops
        if isinstance(op, Fwd)
        for b in range(op.first, op.last)
    }

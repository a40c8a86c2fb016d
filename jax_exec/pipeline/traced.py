"""Pipelines of any Flax NNX model, cut automatically (docs/pipelines.md, "Any Flax model").

:func:`plan_pipeline` traces ``loss_fn(model, *args)`` for one micro-batch into the
block chain of the automatic planner (:mod:`jax_exec.program`: one block per layer-like
piece, cut where few bytes cross) and makes every block a
:class:`~jax_exec.stages.split.Stage` of kind ``"program"`` whose ``apply`` runs its
slice of the traced program (:mod:`jax_exec.pipeline.program_stages`; the last block
stage ends with the loss block). A pipeline stage is a contiguous interval of block
stages, a chunk of the schedule, cut by :func:`schedir.pipeline.placement.balanced_cuts`
(the exact DP over contiguous blocks that minimizes the slowest stage's forward +
backward seconds, divided by its device's speed; the block model's roofline times).
With device memories (``platform=``), every chunk runs its fastest activation plan,
store-all or rotor's rematerialization of its own chain of blocks (with a host link,
rotor_offload's offload to host memory too; with ``activation_tolerance``, low-bit
residuals: :mod:`jax_exec.pipeline.stage_storage`), within the bytes its device
gives each of its micro-batches in flight, and the cut minimizes the slowest planned
stage (:func:`solvers.pipeline.joint.plan_pattern`). The MPMD runtime
(:func:`~jax_exec.pipeline.mpmd.run_pipeline`) executes the schedule on the block
stages, each chunk as the chain schedule of its plan, with a problem profiled from
the blocks' own kernels, so that the bytes it measures after every op equal the
model's (a planned chunk holds :attr:`~schedir.pipeline.schedule.ChunkPlan.held`
between its forward and its backward, and an offload plan
:attr:`~schedir.pipeline.schedule.ChunkPlan.host` bytes in host memory).

Between stages a tuple travels: the values crossing the cut (the residual stream, RoPE
tables, masks...), then the call arguments later stages read (token ids, labels).
Only the arguments are split into micro-batches (every leaf along axis 0, the same batch
size); whatever the model computes, batch-dependent or not, is computed per micro-batch
by the stage that makes it, so a value that does not depend on the batch (a RoPE table,
a causal mask) is never split, only recomputed per micro-batch and carried. Integer and
boolean values travel bit-cast to a float of their width (``bool``, 8- and 16-bit
integers widened to 32 bits first), so that every carried array is a float array
whose cotangent the chain model counts (zeros): the runtime's measured bytes and the
model's agree. The last stage ends with the loss; the runtime's own loss function only
takes it (:func:`~jax_exec.pipeline.pipeline_plan.take_loss`), and the target is empty.

Micro-batching is exact when the loss of the batch is the mean (or the sum) of the
micro-batches' losses and nothing else mixes items of the batch: the plan checks the
loss value on the given batch (refusing a loss that is neither), and refuses a model
whose state changes during the call (dropout drawing from ``nnx.Rngs``, BatchNorm
statistics in training mode), naming the variable.

The plan it returns, and how it runs: :mod:`jax_exec.pipeline.pipeline_plan`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_exec.auto.lowbit import offered_storages
from jax_exec.kernels import loss_kernel, node_functions, node_kernels
from jax_exec.pipeline.arguments import (
    batch_size,
    checked_cuts,
    loss_scale,
    pipeline_devices,
    refuse_state_changes,
)
from jax_exec.pipeline.pipeline_plan import PipelinePlan, first_input, take_loss
from jax_exec.pipeline.program_stages import (
    StageSlice,
    carried_spec,
    model_leaves,
    program_stage,
    stage_slices,
)
from jax_exec.pipeline.schedules import (
    AUTO_SCHEDULES,
    CHUNKS_PER_DEVICE,
    JOINT,
    chunk_cuts,
    has_memories,
    planned,
    platform_devices,
    predicted_figures,
)
from jax_exec.pipeline.stage_storage import StorageCheck
from jax_exec.program.analysis import CostModel
from jax_exec.program.build import program_model
from jax_exec.program.model import BlockModel
from jax_exec.program.problem import stage_times
from jax_exec.program.trace import trace
from jax_exec.stages.program import plain_options
from jax_exec.stages.split import Stage, spec_bytes
from schedir import Chain, InvalidSchedule
from schedir.pipeline.baselines import BASELINES
from schedir.pipeline.problem import PipelineProblem
from schedir.platform import Device, Platform


def plan_pipeline(
    loss_fn: Callable[..., jax.Array],
    model: nnx.Module,
    *args: Any,
    devices: int | Sequence = 4,
    microbatches: int = 4,
    schedule: str = "1f1b",
    cost_model: CostModel | None = None,
    bandwidth: float = 100e9,
    working_sets: bool = False,
    platform: Platform | None = None,
    cuts: Sequence[int] | None = None,
    activation_tolerance: float = 0.0,
    activation_storages: Sequence[str] | None = None,
) -> PipelinePlan:
    """Plan a pipeline of ``loss_fn(model, *args)`` (module docstring).

    Args:
        loss_fn: ``loss_fn(model, *args) -> scalar``, the mean (or sum) of per-item
            losses over the batch.
        model: an ``nnx.Module``.
        args: the batch: every array leaf has the same leading size, split into
            ``microbatches`` along axis 0 (``args[0]`` first).
        devices: a device count (the first ones of ``jax.devices()``) or the devices.
        microbatches: micro-batches per step.
        schedule: a key of :data:`schedir.pipeline.baselines.BASELINES` ("1f1b",
            "gpipe", "zb_h1", "zb_h2", "interleaved_1f1b", "v_shape"), ``"joint"``:
            the joint planner's search (:func:`solvers.pipeline.joint.pipeline_joint`:
            the cut, the pattern among
            :data:`~jax_exec.pipeline.schedules.JOINT_PATTERNS`, list scheduling under
            the memories included, and every chunk's plan, for the shortest step
            alone), or ``"auto"``: each of them
            (:data:`~jax_exec.pipeline.schedules.AUTO_SCHEDULES`; the two-chunk ones
            on a cut of their own where the model has the blocks; with
            a ``platform``, each one-chunk schedule on its own cut within the
            memories), keeping the shortest simulated step whose predicted peaks fit
            the platform's memories (ties: the earlier in that order);
            :attr:`PipelinePlan.alternatives` lists every step found.
        cost_model: the roofline model of the block times.
        bandwidth: bytes/s of the links in the simulated figures (nominal).
        platform: the devices' speeds and memories (its first ``len(devices)``
            devices, in order, one per pipeline device; one-chunk schedules and
            ``"joint"`` only): the
            cut divides each stage's time by its device's speed; with memories, each
            chunk runs the fastest plan (store-all, rotor, with a host link
            rotor_offload's, low-bit with a tolerance) within the bytes per
            micro-batch its device leaves (its parameters, messages and micro-batches
            in flight under the schedule), the cut minimizes the slowest planned
            stage and the simulator checks the peaks (module docstring); the links
            time the simulated figures. Default: identical devices of unlimited
            memory over links of ``bandwidth``.
        working_sets: compile the stages' kernels ahead of time for their temporary
            bytes, counted in the problem and the predicted peaks (else not counted:
            the peaks are then lower bounds; the runtime compiles its own kernels).
        cuts: the stage boundaries by hand (block indices ``0 = c_0 < ... < c_S = L``,
            ``S`` = devices x chunks per device of the schedule; with ``"auto"``,
            one-chunk schedules only; not with ``"joint"``, which chooses its own),
            instead of the balanced cut.
        activation_tolerance: the gradient's relative error allowed to low-bit
            storage (as ``jax_exec.plan``'s, docs/auto.md "Low-bit storage"): with
            device memories, a chunk's plan may keep its residuals in bfloat16,
            float8 or int8 with a scale where that is faster (store-all instead of
            rotor, or a cheaper rotor plan) and the measured error of the plan's
            storages, on the given batch, stays within it
            (:mod:`jax_exec.pipeline.stage_storage`; :attr:`PipelinePlan.lowbit`).
            0: full precision.
        activation_storages: the storages offered (default all of
            :data:`schedir.pipeline.schedule.STORAGES`); needs a tolerance.

    Raises:
        ValueError: an argument without the batch axis, a batch not divisible into
            ``microbatches``, too few devices or blocks, an unknown schedule, a loss
            that micro-batching changes.
        TypeError: a model whose state changes during the call (dropout, BatchNorm
            statistics), not an NNX model, a non-scalar loss.
    """
    storages = offered_storages(activation_tolerance, activation_storages)
    if schedule == "auto":
        kw = dict(devices=devices, microbatches=microbatches, cost_model=cost_model,
                  bandwidth=bandwidth, working_sets=working_sets, platform=platform,
                  cuts=cuts, activation_tolerance=activation_tolerance,
                  activation_storages=activation_storages)  # fmt: skip
        return _best_schedule(loss_fn, model, args, kw)
    if schedule not in BASELINES and schedule != JOINT:
        known = ", ".join(["auto", JOINT, *sorted(BASELINES)])
        raise ValueError(f"schedule = {schedule!r}: expected one of {known}")
    if schedule == JOINT and cuts is not None:
        raise ValueError(f"cuts = {cuts!r} with schedule = {JOINT!r}: the joint planner "
                         "chooses the cut (cut by hand with a schedule of BASELINES)")  # fmt: skip
    devs = pipeline_devices(devices)
    parts = len(devs) * CHUNKS_PER_DEVICE.get(schedule, 1)
    batch = batch_size(args, microbatches)
    small = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(
            (batch // microbatches, *np.shape(a)[1:]), jnp.result_type(a)
        ),
        tuple(args),
    )
    traced = trace(loss_fn, model, small)
    refuse_state_changes(model, traced.program)
    bm = program_model(traced, cost_model=cost_model, options=plain_options)
    L = bm.length
    if parts > L:
        raise ValueError(
            f"the traced model has {L} blocks (the planner's cuts between its layers): "
            f"at most {L} pipeline stages, asked for {parts} ({len(devs)} devices x "
            f"{parts // len(devs)} chunks of {schedule})"
        )
    scale = loss_scale(traced, args, microbatches)
    # one stage per block (the last with the loss block): a pipeline stage is a
    # contiguous interval of them, a chunk of the schedule
    slices = tuple(stage_slices(bm, range(L + 1)))
    params, rest = model_leaves(traced.program, model)
    stages = [
        program_stage(traced.program, b, s, params, rest, scale if b == L - 1 else None)
        for b, s in enumerate(slices)
    ]
    if platform is None:
        names = [f"d{k}" for k in range(len(devs))]
        platform = Platform.fully_connected([Device(n) for n in names], bandwidth)
    else:
        names = platform_devices(platform, len(devs), schedule)
    problem = _stage_problem(bm, slices, stages, platform, microbatches, working_sets)
    if cuts is not None:
        cuts = checked_cuts(cuts, parts, L)
    check = None
    if storages and has_memories(platform):  # without memories store-all fits
        leaves = jax.tree_util.tree_leaves(tuple(args))
        x = first_input(traced.program, slices[0], dict(zip(traced.program.arg_ids, leaves,
                                                            strict=True)))  # fmt: skip
        specs = [carried_spec(traced.program, s) for s in slices]
        check = StorageCheck(stages, specs, [s.params for s in slices], x, microbatches,
                             take_loss, float(activation_tolerance), storages, problem.chain,
                             bm.cost_model.bytes_per_second)  # fmt: skip
    sched, lowbit = planned(problem, schedule, names, cuts, check)
    by_name = dict(zip(names, devs, strict=True))
    return PipelinePlan(
        chunk_cuts(sched),
        slices,
        schedule,
        sched,
        problem,
        predicted_figures(problem, sched),
        tuple(by_name[dev] for dev, _ in sched.ops),  # the joint planner may reorder
        microbatches,
        batch,
        scale,
        bm,
        lowbit=lowbit,
        storage_check=check,
    )


def _best_schedule(loss_fn: Callable, model: nnx.Module, args: tuple, kw: dict) -> PipelinePlan:
    """``schedule="auto"``: every schedule of :data:`AUTO_SCHEDULES` that applies, the
    shortest predicted step that fits (:func:`plan_pipeline`)."""
    one_chunk = AUTO_SCHEDULES[:4]
    if kw["platform"] is None or kw["cuts"] is not None:  # one cut for every schedule
        first = plan_pipeline(loss_fn, model, *args, schedule=one_chunk[0], **kw)
        found = [first, *(first.with_schedule(s) for s in one_chunk[1:])]
    else:  # within the devices' memories: each schedule's in-flight stashes, its own cut
        found, refused = [], None
        for s in one_chunk:
            try:
                found.append(plan_pipeline(loss_fn, model, *args, schedule=s, **kw))
            except InvalidSchedule as err:  # no cut of this schedule fits the memories
                refused = err
        if not found:
            raise refused
    two_chunks = kw["platform"] is None and kw["cuts"] is None
    if two_chunks and 2 * len(found[0].devices) <= found[0].model.length:
        twice = plan_pipeline(loss_fn, model, *args, schedule=AUTO_SCHEDULES[4], **kw)
        found += [twice, twice.with_schedule(AUTO_SCHEDULES[5])]
    if kw["cuts"] is None:
        try:
            found.append(plan_pipeline(loss_fn, model, *args, schedule=JOINT, **kw))
        except InvalidSchedule:  # nothing of the joint planner's fits the memories
            pass
    memory = {d.name: d.memory for d in found[0].problem.platform.devices}

    def fits(p: PipelinePlan) -> bool:
        return all(memory.get(d) is None or peak <= memory[d]
                   for d, peak in p.predicted.device_peak.items())  # fmt: skip

    best = min(found, key=lambda p: (not fits(p), p.predicted.makespan))
    steps = tuple((p.schedule_name, p.predicted.makespan) for p in found)
    return replace(best, alternatives=steps)


def _stage_problem(
    bm: BlockModel,
    slices: Sequence[StageSlice],
    stages: Sequence[Stage],
    platform: Platform,
    m: int,
    working_sets: bool,
) -> PipelineProblem:
    """The stages as a problem: exact bytes of what their kernels keep (as
    :func:`jax_exec.pipeline.profile.profile` measures a stage list: traced, the
    runtime's own functions), roofline times; with ``working_sets`` the kernels are
    compiled for their temporary bytes (else 0: not counted)."""
    program, blocks = bm.program, bm.blocks.blocks
    fwd, bwd, in_size, saved, fwd_tmp, bwd_tmp, weights = [], [], [], [], [], [], []
    for s, stage in zip(slices, stages, strict=True):
        times = [stage_times(bm, blocks[b]) for b in range(*s.blocks)]
        fwd.append(sum(t[0] for t in times))
        bwd.append(sum(t[1] for t in times))
        spec = carried_spec(program, s)
        fns = node_functions(stage, (spec,))
        in_size.append(spec_bytes(spec))
        saved.append(fns.saved_bytes)
        if working_sets:
            kern = node_kernels(stage, (spec,))
            fwd_tmp.append(max(kern.fwd.temp_bytes, kern.rec.temp_bytes))
            bwd_tmp.append(kern.bwd.temp_bytes)
        else:
            fwd_tmp.append(0)
            bwd_tmp.append(0)
        weights.append(spec_bytes(stage.params))
    out = fns.out  # the loss
    loss_tmp = loss_kernel(take_loss, out, ()).temp_bytes if working_sets else 0
    chain = Chain(
        tuple([*fwd, 0.0]),
        tuple([*bwd, 0.0]),
        tuple([*in_size, spec_bytes(out)]),
        tuple([*saved, 0]),
        tuple([*fwd_tmp, 0]),
        tuple([*bwd_tmp, loss_tmp]),
        tuple(st.name for st in stages) + ("loss",),
    )
    return PipelineProblem(chain, weights, platform, m, True)

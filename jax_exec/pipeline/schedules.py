"""Which schedule and cut a traced model's pipeline runs (:mod:`jax_exec.pipeline.traced`):
a named pattern on the balanced cut or on hand cuts, every chunk's activation plan
within its device's memory, the joint planner's search, and the plan's predicted
figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jax_exec.auto.lowbit import tolerated
from jax_exec.pipeline.stage_storage import StorageCheck, stage_storages
from schedir import InvalidSchedule
from schedir.pipeline.baselines import BASELINES
from schedir.pipeline.ops import Bwd, Fwd
from schedir.pipeline.placement import balanced_cuts
from schedir.pipeline.problem import PipelineProblem
from schedir.pipeline.schedule import PipelineSchedule
from schedir.pipeline.simulate import simulate_pipeline
from schedir.platform import Platform
from solvers.pipeline.joint import pipeline_joint, plan_pattern
from solvers.pipeline.stage_plans import has_host_link
from solvers.registry import Infeasible

# chunks (virtual stages) per device of each schedule
CHUNKS_PER_DEVICE = {"interleaved_1f1b": 2, "v_shape": 2}


@dataclass(frozen=True)
class Predicted:
    """The plan's figures (roofline seconds, nominal links: estimates; bytes exact).

    Attributes:
        stage_seconds: per pipeline stage, forward + backward seconds of one
            micro-batch on its device (the loss in the last), with its plan's
            recomputation.
        makespan: the schedule's simulated step, seconds.
        bubble: the idle share of the devices over the step.
        device_peak: per device, the simulated peak bytes (parameters, activations,
            working sets).
    """

    stage_seconds: tuple[float, ...]
    makespan: float
    bubble: float
    device_peak: dict


def planned(problem: PipelineProblem, name: str, devices: list[str],
             cuts: Sequence[int] | None, check: StorageCheck | None):  # fmt: skip
    """(:func:`pattern_schedule`, its
    :class:`~jax_exec.pipeline.stage_storage.LowBitReport`): with a storage ``check``,
    the chunks' plans may store low-bit, replanned without the least precise storage used
    while the measured gradient error exceeds the tolerance
    (:func:`jax_exec.auto.lowbit.tolerated`)."""
    if check is None:
        return pattern_schedule(problem, name, devices, cuts), None
    kept = list(check.kept)

    def solve() -> PipelineSchedule:
        return pattern_schedule(problem, name, devices, cuts, check.storage_chains(kept))

    def used(s: PipelineSchedule) -> set:
        return {p.storage for p in s.plans} - {None}

    def error(s: PipelineSchedule) -> float:
        return check.error(stage_storages(s, problem.length))

    sched, err = tolerated(solve, used, error, check.tolerance, kept.remove)
    return sched, check.report(sched, err)


def pattern_schedule(
    problem: PipelineProblem,
    name: str,
    devices: list[str],
    cuts: Sequence[int] | None,
    storages: Sequence = (),
) -> PipelineSchedule:
    """``name`` on the block problem: without device memories on ``cuts`` or the
    balanced cut (each stage's time divided by its device's speed), every chunk storing
    its activations; with memories, every chunk's fastest plan (store-all or rotor, in
    full precision or one of the low-bit ``storages``: ``(name, chain)``) within what
    its device gives each of its micro-batches in flight, on ``cuts`` or on the cut of
    least slowest planned stage (:func:`solvers.pipeline.joint.plan_pattern`)."""
    if name == JOINT:
        return joint_schedule(problem, storages)
    parts = len(devices) * CHUNKS_PER_DEVICE.get(name, 1)
    if not has_memories(problem.platform):
        if cuts is None:
            speeds = devices if parts == len(devices) else None
            cuts = balanced_cuts(problem, parts, speeds)
        return BASELINES[name](problem, devices, cuts=list(cuts))
    try:
        # run() runs one step
        return plan_pattern(problem, name, devices, cuts, steps=1, storages=storages,
                            offload=True)  # fmt: skip
    except Infeasible:
        if cuts is not None:
            why = (f"the cut {tuple(cuts)}: no plan of its {parts} stages (store-all, "
                   f"rotor's rematerialization{_more(problem, storages)}) under {name} "
                   f"fits the devices' memory")  # fmt: skip
        else:
            why = (f"no cut of the traced model's {problem.length} blocks into {parts} "
                   f"stages, each storing or rematerializing its activations (rotor"
                   f"{_more(problem, storages)}) under {name}, fits the devices' "
                   "memory")  # fmt: skip
        raise InvalidSchedule(why) from None


# the joint planner's patterns for traced stages (the V-shape's turn, two adjacent
# chunks on one device, counts the activation between them once:
# solvers.pipeline.stage_plans.StagePlans.chunk_plans)
JOINT_PATTERNS = ("1f1b", "zb_h1", "zb_h2", "v_shape", "list")


# simulated candidates of its search: 400 (its default) left the 8-device U-Net of the
# experiment (paper_experiments/traced_pipelines.py) 8% slower; it used about 800
JOINT_EVALS = 1000


def joint_schedule(problem: PipelineProblem, storages: Sequence = ()) -> PipelineSchedule:
    """The joint planner's schedule of the block problem (offload plans where the
    platform has a host link, low-bit ones of ``storages``), judged on one step alone
    (``run`` runs one)."""
    try:
        return pipeline_joint(problem, patterns=JOINT_PATTERNS, steps=1, offload=True,
                              max_evals=JOINT_EVALS, storages=storages)  # fmt: skip
    except Infeasible:
        raise InvalidSchedule(
            f"the joint planner found no cut of the traced model's {problem.length} "
            f"blocks, schedule and per-stage plans (store-all or rotor"
            f"{_more(problem, storages)}) that fit the "
            f"devices' memory"
        ) from None


def _more(problem: PipelineProblem, storages: Sequence) -> str:
    """The other plans an error message names: offload, low-bit storages."""
    more = ", offload" if has_host_link(problem.platform) else ""
    return more + "".join(f", {name}" for name, _ in storages)


def has_memories(platform: Platform) -> bool:
    return any(d.memory is not None for d in platform.devices)


def chunk_cuts(schedule: PipelineSchedule) -> tuple[int, ...]:
    """The chunk boundaries of a schedule, in stage order."""
    firsts = {op.first for _, ops in schedule.ops for op in ops if isinstance(op, Fwd)}
    lasts = {op.last for _, ops in schedule.ops for op in ops if isinstance(op, Fwd)}
    return tuple(sorted(firsts | lasts))


# the joint planner's search as a schedule (solvers.pipeline.joint.pipeline_joint)
JOINT = "joint"


# schedule="auto" tries these, in this order (ties keep the earlier)
AUTO_SCHEDULES = ("1f1b", "zb_h1", "zb_h2", "gpipe", "interleaved_1f1b", "v_shape", JOINT)


# the schedules whose cut may follow a platform (one chunk per device)
ONE_CHUNK = ("1f1b", "zb_h1", "zb_h2", "gpipe")


def platform_devices(platform: Platform, n: int, schedule: str) -> list[str]:
    """The names of the platform's first ``n`` devices, one per pipeline device."""
    if schedule not in (*ONE_CHUNK, JOINT):
        raise ValueError(
            f"platform= with schedule = {schedule!r}: the cut over a platform takes one chunk "
            f"per device ({', '.join(ONE_CHUNK)}) or the joint planner's ({JOINT!r})"
        )
    if len(platform.devices) < n:
        raise ValueError(f"platform has {len(platform.devices)} devices, the plan {n}")
    return [d.name for d in platform.devices[:n]]


def predicted_figures(problem: PipelineProblem, schedule: PipelineSchedule) -> Predicted:
    speed = {d.name: d.speed for d in problem.platform.devices}
    device_of = {(op.first, op.last): dev
                 for dev, ops in schedule.ops for op in ops if isinstance(op, Fwd)}  # fmt: skip
    extra = {(op.first, op.last): op.recompute
             for _, ops in schedule.ops for op in ops if isinstance(op, Bwd)}  # fmt: skip
    seconds = tuple((problem.work(i, j) + extra[i, j]) / speed[device_of[i, j]]
                    for i, j in sorted(device_of))  # fmt: skip
    trace_ = simulate_pipeline(problem, schedule)
    devices = len(schedule.ops)
    busy = problem.microbatches * sum(seconds)
    bubble = 1.0 - busy / (devices * trace_.makespan) if trace_.makespan > 0 else 0.0
    return Predicted(seconds, trace_.makespan, bubble, dict(trace_.device_peak))

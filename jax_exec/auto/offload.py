"""Host offload in the automatic planner: remat, offload and low-bit storage chosen
together (docs/auto.md, "Host offload").

With a platform that has a host link (``jax_exec.plan(..., platform=...)``: a
:class:`schedir.Platform`, or a preset name such as ``"pcie4"``), ``auto`` also plans
with offload: for a few choices of every block's save option (the DP's answer at the
budget, the store-all reference's, and the least-memory schedule's), the block chain
of that choice is turned into its chain (:meth:`schedir.blocks.BlockChain.to_chain`,
an upper bound of its bytes) and solved by ``rotor_offload`` (Beaumont, Eyraud-Dubois,
Shilova, NeurIPS 2021: recomputation and offloading of whole buffers chosen together
by an exact DP of their two-stream model). Its schedule (chain ops and copy ops) runs
on the block model as a :class:`~schedir.blocks.BlockSchedule` of that choice; its
device peak is the block chain's program-order peak (what the op-by-op runtime
measures after every op, the offloaded buffers counted until their ``Wait`` and from
their ``Prefetch``), its time the offload simulator's two-stream makespan (copies on
their own engines, overlapping compute as the platform's bandwidth allows). The
fastest answer that fits the device budget (and the host's memory) is kept, the
remat-only plan among them: a joint plan is never predicted slower than remat-only.

What is offloaded is a whole buffer (a block's recorded outputs and saved residuals,
or a recomputed segment's input), not each saved value on its own; low-bit storage
(``activation_tolerance``) applies to the options these choices are made from.
"""

from __future__ import annotations

from dataclasses import dataclass

import solvers
from jax_exec.program.model import BlockModel
from jax_exec.program.problem import build_problem
from schedir import OffloadProblem, Platform, simulate_offload
from schedir.blocks.schedule import BlockSchedule
from schedir.blocks.simulate import simulate_blocks
from schedir.offload.ops import Offload
from schedir.platform import PRESETS


def as_platform(platform: Platform | str | None) -> Platform | None:
    """``platform`` as a :class:`schedir.Platform` (a preset name: a host link of that
    bandwidth each way), or None; a ``ValueError`` naming the field otherwise."""
    if platform is None or isinstance(platform, Platform):
        return platform
    if isinstance(platform, str) and platform in PRESETS:
        return Platform.host_offload(platform)
    known = ", ".join(PRESETS)
    raise ValueError(f"platform = {platform!r}: expected a schedir.Platform or a preset ({known})")


def has_host_link(platform: Platform | None) -> bool:
    return platform is not None and platform.offload.bandwidth > 0 < platform.prefetch.bandwidth


def within_host_memory(host_resident: tuple[int, ...], platform: Platform | None) -> bool:
    """Whether a schedule's bytes in host memory after every op (a trace's
    ``host_resident``) fit ``platform.host_memory`` (None: unlimited)."""
    limit = None if platform is None else platform.host_memory
    return limit is None or max(host_resident, default=0) <= limit


@dataclass(frozen=True)
class Joint:
    """The offload plans found at a budget: ``found`` (schedule, device peak, makespan),
    and ``least``: the least budget at which a choice that found none would (None: no
    such choice, or none can)."""

    found: tuple
    least: int | None


def joint_plans(
    bm: BlockModel, nbytes: int, platform: Platform, choices: list[tuple[int, ...]],
    exact: bool,
) -> Joint:  # fmt: skip
    """``rotor_offload`` on the chain of each choice of options (module docstring)."""
    found, least = [], []
    for options in dict.fromkeys(tuple(c) for c in choices):
        if exact and bm.compile(bm.every_kernel(options)):
            bm.problem = build_problem(bm)
        problem = OffloadProblem(bm.problem.to_chain(options), platform)
        try:
            schedule = solvers.solve(problem, nbytes, method="rotor_offload")
        except solvers.Infeasible as err:
            if err.min_budget is not None:
                least.append(err.min_budget)
            continue
        if not any(isinstance(op, Offload) for op in schedule.ops):
            continue  # rotor's answer: the remat-only DP's own ground
        block = BlockSchedule(schedule.ops, dict(schedule.meta), options)
        trace = simulate_blocks(bm.problem, block)
        makespan = simulate_offload(problem, schedule).makespan
        host = max(trace.host_resident, default=0)
        if trace.peak_memory > nbytes or not within_host_memory(trace.host_resident, platform):
            continue  # pragma: no cover - the chain bounds the block chain's bytes from above
        block.meta.update(peak_memory=trace.peak_memory, makespan=makespan, host_peak=host,
                          offloaded=offloaded(block))  # fmt: skip
        found.append((block, trace.peak_memory, makespan))
    return Joint(tuple(found), min(least) if least else None)


def offloaded(schedule: BlockSchedule) -> list[str]:
    """The buffers a schedule offloads, in order (``abar[k]``: block k-1's recorded
    outputs and saved residuals; ``a[k]``: the input of a recomputed segment)."""
    return list(dict.fromkeys(op.buffer for op in schedule.ops if isinstance(op, Offload)))

"""Low-bit storage of a traced pipeline's chunks (docs/pipelines.md, "Any Flax model").

With ``plan_pipeline(..., activation_tolerance=t)`` a chunk's plan may keep its stages'
new residuals in bfloat16, float8 or int8 with a scale (the codecs and their byte
rule: :mod:`jax_exec.auto.lowbit`). Per storage, :func:`storage_chain` is the block
stages' chain with every stage's saved bytes those of its compressed kernels (the
functions the runtime runs, :func:`~jax_exec.pipeline.chunks.stored_functions`:
exact, traced) and the codec's roofline seconds in its backward; the per-stage
planner (:class:`solvers.pipeline.stage_plans.StagePlans`) chooses among them.

The gradient error is measured as :func:`jax_exec.auto.lowbit.within_tolerance`
measures it: ``||g - g_ref|| / ||g_ref||`` on the example batch given to the plan (its
micro-batches, the traced parameters), g the gradient with the plan's storages and
g_ref the full-precision one, both computed by the runtime's own chunk program
(:class:`~jax_exec.pipeline.chunks.ChunkProgram`: every block stage on one device,
store-all; rematerialization recomputes the same values, so the error depends only
on which stage stores what). Each storage is first tried alone (every stage in it);
those above the tolerance are not offered. The chosen schedule's error is measured
again and its least precise storage withdrawn while it exceeds the tolerance
(:func:`jax_exec.auto.lowbit.tolerated`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import jax
import numpy as np

from jax_exec.auto.lowbit import residual_codec
from jax_exec.pipeline.chunks import ChunkProgram, split_microbatches, stored_functions
from jax_exec.stages.split import Stage
from schedir import Chain
from schedir.chain.ops import store_all_ops
from schedir.pipeline.schedule import STORAGES, PipelineSchedule


@dataclass(frozen=True)
class LowBitReport:
    """What low-bit storage a pipeline plan uses and its measured error.

    Attributes:
        tolerance: the gradient's relative error allowed.
        gradient_error: the plan's measured ``||g - g_ref|| / ||g_ref||`` (0: no
            chunk stores low-bit).
        storage: per chunk ``(first, last, storage or None)``, in stage order.
        screen: storage -> the error with every stage stored in it (the storages
            above the tolerance were not offered).
    """

    tolerance: float
    gradient_error: float
    storage: tuple[tuple[int, int, str | None], ...]
    screen: dict = field(default_factory=dict)


def storage_chain(chain: Chain, stages: Sequence[Stage], specs: Sequence, storage: str,
                  bytes_per_second: float) -> Chain:  # fmt: skip
    """``chain`` (the block stages' problem chain, the loss last) with every stage's
    new residuals in ``storage``: its saved bytes those of the compressed kernels,
    its backward longer by the codec's memory-bound seconds."""
    saved, bwd = list(chain.saved_size), list(chain.bwd_time)
    for k, (stage, spec) in enumerate(zip(stages, specs, strict=False)):
        plain = stored_functions(stage, spec, None)
        saved[k] = stored_functions(stage, spec, storage).saved_bytes
        bwd[k] += residual_codec(plain.recipe.new, storage).moved_bytes / bytes_per_second
    return replace(chain, saved_size=tuple(saved), bwd_time=tuple(bwd))


def stage_storages(schedule: PipelineSchedule, length: int) -> tuple[str | None, ...]:
    """Per block stage, the storage its chunk's plan keeps its residuals in."""
    out: list[str | None] = [None] * length
    for p in schedule.plans:
        out[p.first : p.last] = [p.storage] * (p.last - p.first)
    return tuple(out)


class StorageCheck:
    """The storages a traced pipeline may use and its gradient error (module
    docstring): ``stages`` (the block stages, the last with the loss), ``specs``
    (their input shapes), ``params`` (per stage, its positions among the model's
    parameter leaves), ``inputs`` (the first stage's encoded input of the example
    batch), ``microbatches``, ``loss`` (the runtime's loss function)."""

    def __init__(self, stages: Sequence[Stage], specs: Sequence, params: Sequence[tuple],
                 inputs: tuple, microbatches: int, loss: Callable, tolerance: float,
                 storages: Sequence[str], chain: Chain, bytes_per_second: float):  # fmt: skip
        self.stages, self.specs, self.params = list(stages), list(specs), list(params)
        self.parts = split_microbatches(inputs, microbatches)
        self.loss, self.tolerance = loss, tolerance
        self._errors: dict = {}
        L = len(self.stages)
        self.reference = self.gradient((None,) * L)
        self.screen = {s: self.error((s,) * L) for s in storages}
        self.kept = tuple(s for s in storages if self.screen[s] <= tolerance)
        self.chains = {s: storage_chain(chain, self.stages, self.specs, s, bytes_per_second)
                       for s in self.kept}  # fmt: skip

    def gradient(self, storages: tuple) -> dict[int, np.ndarray]:
        """Per parameter leaf position, the step's gradient (float64) with block stage
        k's residuals in ``storages[k]``: the runtime's chunk program over every
        stage, store-all, traced into one jitted step (the same kernels inlined), the
        micro-batches' gradients summed."""
        L = len(self.stages)
        prog = ChunkProgram(self.stages, 0, L, self.specs, self.loss, store_all_ops(L), storages)
        scale = 1.0 / len(self.parts)

        @jax.jit  # one compilation of the whole step, not one per stage kernel
        def step(p: list, r: list, x: tuple) -> list:
            stash, _ = prog.forward(p, r, x)
            return prog.backward(p, r, stash, ((), scale)).grads

        p = [s.params for s in self.stages]
        r = [s.rest for s in self.stages]
        total: dict[int, np.ndarray] = {}
        for x in self.parts:
            grads = step(p, r, x)
            for positions, g in zip(self.params, grads, strict=True):
                for j, leaf in zip(positions, jax.tree_util.tree_leaves(g), strict=True):
                    v = np.asarray(leaf, dtype=np.float64)
                    total[j] = total[j] + v if j in total else v
        return total

    def error(self, storages: tuple) -> float:
        """``||g - g_ref|| / ||g_ref||`` with ``storages`` per block stage (cached)."""
        if not any(storages):
            return 0.0
        if storages not in self._errors:
            got, ref = self.gradient(storages), self.reference
            diff = sum(float(np.sum((got[j] - ref[j]) ** 2)) for j in ref)
            norm = sum(float(np.sum(v**2)) for v in ref.values())
            self._errors[storages] = math.sqrt(diff / norm) if norm > 0 else math.sqrt(diff)
        return self._errors[storages]

    def storage_chains(self, kept: Sequence[str]) -> tuple[tuple[str, Chain], ...]:
        """``(storage, chain)`` of the storages ``kept`` (:func:`storage_chain`)."""
        return tuple((s, self.chains[s]) for s in STORAGES if s in kept)

    def report(self, schedule: PipelineSchedule, error: float) -> LowBitReport:
        chunks = tuple(sorted((p.first, p.last, p.storage) for p in schedule.plans))
        return LowBitReport(self.tolerance, error, chunks, dict(self.screen))

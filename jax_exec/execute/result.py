"""The one result type of every executor (:func:`jax_exec.run`, ``Plan.run``,
docs/jax_exec.md).

Every field has a neutral default, so each executor fills what it measures and leaves
the rest empty: a run without copies has no ``host_bytes``, a single-device run no
``device_peaks``, a training step no ``outputs``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import jax


@dataclass(frozen=True)
class RunResult:
    """What one executed step did.

    Attributes:
        loss: the loss value (a scalar array); None for inference.
        aux: ``loss_fn``'s auxiliary output (``has_aux``), else None.
        grads: parameter gradients: an ``nnx.State`` like ``nnx.value_and_grad``'s for a
            traced model; one pytree per layer for a stage list (``nnx.State`` for NNX
            layers; a parameter several layers read is in the first of them, with the
            sum of the gradients of its uses), or a dict ``module name -> nnx.State``
            for a DAG model; None for inference. A pipeline run over several processes
            gives None for the layers another process ran.
        new_state: a traced model's state (non-parameter variables, and the parameters
            ``loss_fn`` wrote: ``nnx.WeightNorm``'s kernel) after the step
            (``nnx.update(model, result.new_state)`` applies it), else None.
        node_states: a traced model's run: the state after the step of each Flax graph
            node among the call's arguments (an ``nnx.Rngs``, a teacher module), in
            their order (``nnx.update(node, state)`` applies it; their ``nnx.Param``
            variables are not in it: the call leaves them unchanged).
        outputs: the model outputs (inference runs), else None.
        peak_bytes: max over the initial state and every op of ``op_peak_bytes``
            (device activation bytes).
        initial_bytes: device activation bytes before the first op (the inputs).
        resident_bytes: live device activation bytes after each op.
        host_bytes: live ``pinned_host`` bytes after each op (empty without copies).
        op_peak_bytes: bytes each op needed: live device bytes right after it produced
            its output (before freeing anything) plus its temporary bytes; for an op
            that computes nothing, the live bytes after it.
        op_temp_bytes: temporary bytes of each op's compiled kernel (``memory_analysis``).
        op_times: wall time of each op, seconds (dispatch to completion).
        op_kernels: per op, the kernel it launched (graph runs: ``"fwd v"``, ``"res v"``,
            ``"bwd v"``, ``"loss"``, v a DAG module's name or a block's index, whose
            backward runs as several phase kernels; None for an op that launches none).
        total_time: wall time of the whole step, seconds.
        param_bytes: bytes of the parameters, each once (not in the activation figures;
            a traced model planned with a ``wrt`` filter: those it differentiates, the
            others are state, read like the rest of it).
        grad_bytes: bytes of the parameter gradients (not in the activation figures).
        batch_bytes: bytes of the inputs and the target (a traced model: the call's
            arguments).
        output_bytes: bytes of the program outputs besides the loss (``aux``, the state
            after the step), not in the activation figures.
        ops: the ops that ran (single-device runs).
        device_peaks: multi-device runs: device name -> the largest activation bytes
            the runtime held on it after an op (arrays in flight and ``jax.vjp``
            residuals; parameters excluded); a sharded model's op-by-op run: its
            shards on each device (``str(device)``; ``peak_bytes`` and the other
            figures are the fullest device's).
        op_log: multi-device runs: ``(device, op or task, start, end)`` in seconds since
            the start of the step.
        op_device_bytes: MPMD pipeline runs: per ``op_log`` entry, the activation bytes
            measured on its device right after the op (what ``device_peaks`` maxes).
        op_model_bytes: MPMD pipeline runs: per ``op_log`` entry, what the ops' effects
            say the same live buffers of that device weigh (the problem's sizes).
        op_host_bytes, op_model_host_bytes: MPMD pipeline runs: per ``op_log`` entry,
            the bytes its device holds in host memory (offloaded buffers), measured and
            as the chunks' plans say (``ChunkPlan.host``).
        placement: multi-device runs: device name -> JAX device.
        makespan: dynamic runs: seconds from the first task's start to the last
            task's end.
        predicted: dynamic runs: the same policy run in the simulator with the
            calibrated times (a ``schedir.dynamic.DynamicTrace``).
        same_device: dynamic runs: fraction of tasks placed where the simulation
            placed them.
        counts, predicted_counts: dynamic runs: tasks per device, realized / simulated.
        perf_model: dynamic runs: the performance model's final mean seconds per
            ``"kind@device"``.
        trace: dynamic runs: the runtime's own account of the run (a
            ``schedir.dynamic.DynamicTrace``: placement, durations, the bytes it
            counted per device, evictions).
        measured_bytes: dynamic runs: after every task, device name -> bytes of the
            distinct arrays the runtime held there.
    """

    loss: Any = None
    aux: Any = None
    grads: Any = None
    new_state: Any = None
    node_states: tuple = ()
    outputs: Any = None
    peak_bytes: int = 0
    initial_bytes: int = 0
    resident_bytes: tuple[int, ...] = ()
    host_bytes: tuple[int, ...] = ()
    op_peak_bytes: tuple[int, ...] = ()
    op_temp_bytes: tuple[int, ...] = ()
    op_times: tuple[float, ...] = ()
    op_kernels: tuple[str | None, ...] = ()
    total_time: float = 0.0
    param_bytes: int = 0
    grad_bytes: int = 0
    batch_bytes: int = 0
    output_bytes: int = 0
    ops: tuple = ()
    device_peaks: dict[str, int] = field(default_factory=dict)
    op_log: tuple = ()
    op_device_bytes: tuple[int, ...] = ()
    op_model_bytes: tuple[int, ...] = ()
    op_host_bytes: tuple[int, ...] = ()
    op_model_host_bytes: tuple[int, ...] = ()
    placement: dict = field(default_factory=dict)
    makespan: float = 0.0
    predicted: Any = None
    same_device: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    predicted_counts: dict[str, int] = field(default_factory=dict)
    perf_model: dict[str, float] = field(default_factory=dict)
    trace: Any = None
    measured_bytes: tuple = ()


def tree_bytes(tree: Any) -> int:
    """Bytes of the arrays of a pytree (each leaf counted as given; a leaf that is not
    an array, such as a Python number, counts 0)."""
    return sum(int(leaf.nbytes) for leaf in jax.tree_util.tree_leaves(tree)
               if hasattr(leaf, "nbytes"))  # fmt: skip


def distinct_bytes(tree: Any) -> int:
    """Bytes of the distinct arrays of a pytree (a leaf held twice counted once): what
    the arrays occupy, as :meth:`~jax_exec.execute.buffers.Buffers.nbytes` counts."""
    leaves = {id(a): a for a in jax.tree_util.tree_leaves(tree)}
    return sum(int(a.nbytes) for a in leaves.values())


class OpMeter:
    """What a single-device runtime measures per op, turned into a :class:`RunResult`.

    Create it when the step starts (after its inputs are placed), ``record`` each op,
    ``stop`` when the last op is done, then ``result(loss=..., grads=..., ...)``.
    """

    def __init__(self, initial_bytes: int, *, kernels: bool = False) -> None:
        self.initial_bytes = initial_bytes
        self.with_kernels = kernels  # record the kernel each op launched (graph runs)
        self.resident: list[int] = []
        self.host: list[int] = []
        self.peak: list[int] = []
        self.temp: list[int] = []
        self.times: list[float] = []
        self.kernels: list[str | None] = []
        self.device_peaks: dict[str, int] = {}
        self.started = time.perf_counter()
        self.total = 0.0

    def record(
        self,
        seconds: float,
        temp: int,
        need: int,
        resident: int,
        *,
        host: int | None = None,
        kernel: str | None = None,
        devices: dict | None = None,
    ) -> None:
        """One op: its wall time, kernel temporary bytes, need (live bytes right after
        its output plus ``temp``), live device bytes after it; with copies the live
        host bytes; for graph runs the kernel it launched; for a sharded model the live
        bytes on each device after it (``devices``: device -> bytes)."""
        for device, nbytes in (devices or {}).items():
            name = str(device)
            self.device_peaks[name] = max(self.device_peaks.get(name, 0), nbytes)
        self.times.append(seconds)
        self.temp.append(temp)
        self.peak.append(need)
        self.resident.append(resident)
        if host is not None:
            self.host.append(host)
        if self.with_kernels:
            self.kernels.append(kernel)

    def stop(self) -> None:
        self.total = time.perf_counter() - self.started

    def figures(self) -> dict[str, Any]:
        """The recorded device figures, as the result fields every runtime shares (and
        ``device_peaks`` where devices were recorded)."""
        per_device = {"device_peaks": dict(self.device_peaks)} if self.device_peaks else {}
        return per_device | {
            "peak_bytes": max([self.initial_bytes, *self.peak]),
            "initial_bytes": self.initial_bytes,
            "resident_bytes": tuple(self.resident),
            "host_bytes": tuple(self.host),
            "op_peak_bytes": tuple(self.peak),
            "op_temp_bytes": tuple(self.temp),
            "op_times": tuple(self.times),
            "total_time": self.total,
        }

    def result(self, **fields: Any) -> RunResult:
        """The :class:`RunResult` of the recorded ops plus ``fields`` (loss, grads, ...)."""
        return RunResult(
            **self.figures(),
            op_kernels=tuple(self.kernels),
            **fields,
        )

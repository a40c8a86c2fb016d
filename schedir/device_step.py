"""One training step on one data-parallel device: the whole device's memory and the
step's time, from an activation schedule's trace and the training state's placement.

The activation schedule (a block chain's, :mod:`schedir.blocks`) is judged by the
simulator, whose :class:`~schedir.trace.Trace` gives each op's time and activation
need. This module adds what the rest of the device holds and does, under a
:class:`Strategy`: a :class:`~schedir.training_state.Placement` of parameters,
gradients and optimizer state over the N data-parallel devices (ZeRO stages 1-3,
Rajbhandari et al. 2020; the optimizer state and its update on the host, ZeRO-Offload,
Ren et al. 2021), and whether communication overlaps compute.

Memory (bytes, per device) is additive, so the least feasible budget of a strategy is
its state plus its buffers plus the activation schedule's least budget:

- the resident state, exactly (:func:`~schedir.training_state.device_bytes`);
- reserved communication buffers, as DeepSpeed's prefetch and reduce buckets: with
  sharded parameters, one gather buffer holding the largest block's full parameters
  (two with ``prefetch``); with sharded gradients, one reduce buffer holding the largest
  block's full gradients (two with ``overlap``). A block is a block of the activation
  chain (its ``block_params``: the parameters it reads; the loss stage is the last);
- the activation need of each op (the trace), or during the optimizer update its
  ``updates`` (the bytes of the parameters this device updates) when the update runs
  on the device.

Time (seconds) is a two-stream timeline: the compute stream runs the trace's ops in
order with their durations; the ring runs collectives in the order they are issued, at
the slowest hop of the ring over the first N devices of the platform
(:func:`~schedir.training_state.ring_bandwidth`; a gather or reduce-scatter of B bytes
takes (N - 1) (latency + B / (N bandwidth))); host copies run on the platform's
``offload`` (device to host) and ``prefetch`` (host to device) engines.

- Sharded parameters: before each op, its block's split parameters are all-gathered
  (recomputations gather again). Issued when the previous op ends, or when it starts
  with ``prefetch``; the op starts when its gather has arrived.
- Gradients: with sharded gradients, each backward op (``B`` and ``Loss``) reduce-scatters
  the gradients of its block's parameters into the local shard (a tied parameter read by
  two blocks twice); a backward op waits for the reduction issued ``depth`` reductions
  before (depth 1, or 2 with ``overlap``: its buffer must be free). With replicated
  gradients (accumulated in place), each tensor is reduced once complete, after the
  backward of the first block reading it: all-reduced (two ring passes) when the
  optimizer state is replicated, reduce-scattered (one pass) when it is sharded or on
  the host (each device updates its shard). Gradients nobody reads (zero) move nothing.
- The update starts when the compute stream, the ring and the host copies are done.
  Each device updates what its optimizer state covers: everything when it is
  replicated, its shard otherwise; it reads those gradients and reads and writes those
  parameters and its optimizer state. On the device at ``update_bytes_per_second``
  (its ``updates``, the parameters it updates, are device bytes); on the host each
  reduced gradient shard is copied down as its reduction ends, the parameter shard is
  copied down from the start, the update runs at ``host_bytes_per_second`` and the
  updated parameter shard is copied back up.
- With replicated parameters and an optimizer state that is not replicated (ZeRO 1-2,
  offload) the updated parameters are then all-gathered (one pass); this step waits for
  it (no overlap with the next step's forward is assumed).

Compute times are whatever the trace says (a roofline model for the automatic
planner); the collective and copy times are a model of the platform, not a measure.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from schedir.chain.ops import B, Loss
from schedir.errors import InvalidProblem
from schedir.platform import CopyEngine, Device, Platform
from schedir.trace import Trace
from schedir.training_state import (
    DeviceBytes,
    Placement,
    as_tensors,
    device_bytes,
    local_bytes,
    ring_bandwidth,
    ring_pass,
    split_bytes,
)


@dataclass(frozen=True)
class Strategy:
    """Where the training state lives and what overlaps.

    Attributes:
        placement: parameters, gradients and optimizer state over the data axis.
        prefetch: sharded parameters: gather the next op's block while this op runs
            (two gather buffers).
        overlap: sharded gradients: the next backward runs while a block's gradients
            are reduce-scattered (two reduce buffers).
    """

    placement: Placement
    prefetch: bool = False
    overlap: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.placement, Placement):
            raise InvalidProblem(f"placement = {self.placement!r}: expected a Placement")
        if self.prefetch and self.placement.params != "sharded":
            raise InvalidProblem("prefetch = True: only sharded parameters are gathered")
        if self.overlap and self.placement.grads != "sharded":
            raise InvalidProblem("overlap = True: only sharded gradients need a reduce buffer")

    @property
    def stage(self) -> int:
        """The ZeRO stage of the placement (1 for a host optimizer state over
        replicated gradients)."""
        p = self.placement
        if p.params == "sharded":
            return 3
        if p.grads == "sharded":
            return 2
        return 0 if p.opt_state == "replicated" else 1

    @property
    def name(self) -> str:
        """E.g. ``"ZeRO-3 +offload +prefetch"``."""
        parts = [f"ZeRO-{self.stage}"]
        if self.placement.opt_state == "host":
            parts.append("+offload")
        if self.prefetch:
            parts.append("+prefetch")
        if self.overlap:
            parts.append("+overlap")
        return " ".join(parts)


def strategies() -> tuple[Strategy, ...]:
    """The 15 candidate strategies: ZeRO stages 0-3, stages 1-3 with the optimizer state
    on the host, and the overlap choices each allows. Placements outside ZeRO's order
    (sharded gradients under a replicated optimizer state, sharded parameters under
    replicated gradients) are left out: the update would need the full gradients or
    parameters on every device anyway, so they hold no less and communicate no less."""
    out = []
    for offload in (False, True):
        for stage in range(1 if offload else 0, 4):
            p = Placement.zero(stage, offload=offload)
            for prefetch in (False, True) if stage == 3 else (False,):
                for overlap in (False, True) if stage >= 2 else (False,):
                    out.append(Strategy(p, prefetch, overlap))
    return tuple(out)


@dataclass(frozen=True)
class StepCosts:
    """Throughputs of the optimizer update (bytes it reads and writes per second).

    Attributes:
        update_bytes_per_second: on the device (memory bound).
        host_bytes_per_second: on the host (a CPU optimizer).
    """

    update_bytes_per_second: float = 1.5e12
    host_bytes_per_second: float = 2e10

    def __post_init__(self) -> None:
        for name in ("update_bytes_per_second", "host_bytes_per_second"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v > 0:
                raise InvalidProblem(f"{name} = {v!r}: expected a positive number (bytes/s)")


@dataclass(frozen=True)
class DeviceStep:
    """One step on one device under a strategy (module docstring).

    Attributes:
        strategy: the strategy.
        state: the training state's bytes (resident and the single-buffer transients).
        buffers: bytes of the reserved gather and reduce buffers.
        activation_peak: the activation schedule's peak (bytes).
        update_bytes: device bytes the optimizer update adds (its ``updates``).
        compute_time: seconds of the activation schedule's ops (the trace's makespan).
        update_time: seconds of the optimizer update.
        step_time: seconds of the whole step (the timeline's end).
        ring_time: seconds the ring is busy.
        collective_bytes: bytes this device sends over the ring.
        host_bytes: bytes copied between this device and the host.
    """

    strategy: Strategy
    state: DeviceBytes
    buffers: int
    activation_peak: int
    update_bytes: int
    compute_time: float
    update_time: float
    step_time: float
    ring_time: float
    collective_bytes: int
    host_bytes: int

    @property
    def peak_bytes(self) -> int:
        """Resident state + buffers + max(activation peak, update bytes)."""
        return self.state.resident + self.buffers + max(self.activation_peak, self.update_bytes)

    @property
    def fixed_bytes(self) -> int:
        """What the strategy holds besides activations: resident state and buffers (the
        activation budget left by a device budget B is B - fixed_bytes, when the update's
        bytes fit it)."""
        return self.state.resident + self.buffers

    @property
    def exposed_time(self) -> float:
        """Seconds the step spends beyond its compute and update: communication (and
        waits for buffers) not hidden by compute."""
        return self.step_time - self.compute_time - self.update_time


def data_parallel_platform(
    devices: int,
    *,
    link_bandwidth: float = 100e9,
    link_latency: float = 5e-6,
    host_bandwidth: float = 25e9,
) -> Platform:
    """N devices fully connected at ``link_bandwidth`` bytes/s per direction and a host
    link of ``host_bandwidth`` each way (defaults: the order of a node of 8 GPUs with a
    high-speed interconnect and PCIe 4 to the host; a model, state yours)."""
    if isinstance(devices, bool) or not isinstance(devices, numbers.Integral) or devices < 1:
        raise InvalidProblem(f"devices = {devices!r}: expected a positive int")
    ring = Platform.fully_connected(
        [Device(f"dev{i}") for i in range(int(devices))], link_bandwidth, link_latency
    )
    engine = CopyEngine(host_bandwidth)
    return Platform(offload=engine, prefetch=engine, devices=ring.devices, links=ring.links)


def _block_params(block_params: object, count: int) -> tuple[tuple[int, ...], ...]:
    out = []
    for b, ids in enumerate(block_params):
        ids = tuple(ids)
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < count:
                raise InvalidProblem(
                    f"block_params[{b}] = {ids!r}: indices must lie in [0, {count})"
                )
        out.append(ids)
    if not out:
        raise InvalidProblem("block_params: expected one entry per block and the loss stage")
    return tuple(out)


@dataclass(frozen=True)
class FixedBytes:
    """What a strategy holds on a device besides activations (bytes).

    Attributes:
        state: the training state (:class:`~schedir.training_state.DeviceBytes`).
        buffers: the reserved gather and reduce buffers.
        update_bytes: the optimizer update's ``updates`` on the device, the bytes of the
            parameters it updates (all, or its shard under a sharded optimizer state;
            0 on the host).
    """

    state: DeviceBytes
    buffers: int
    update_bytes: int

    @property
    def fixed(self) -> int:
        """Resident state + buffers: a device budget B leaves B - fixed to activations
        (and the update needs ``update_bytes <= B - fixed``)."""
        return self.state.resident + self.buffers


def fixed_bytes(
    block_params: Sequence[Sequence[int]],
    params: object,
    opt_state: object,
    strategy: Strategy,
    devices: int,
    *,
    grads: object = None,
) -> FixedBytes:
    """The device bytes ``strategy`` holds besides activations (module docstring)."""
    if not isinstance(strategy, Strategy):
        raise InvalidProblem(f"strategy = {strategy!r}: expected a Strategy")
    ps, os_ = as_tensors("params", params), as_tensors("opt_state", opt_state)
    gs = ps if grads is None else as_tensors("grads", grads)
    groups = _block_params(block_params, len(ps))
    p = strategy.placement
    state = device_bytes(ps, os_, p, devices, grads=gs, blocks=groups)
    buffers = state.gather * (2 if strategy.prefetch else 1)
    buffers += state.reduce_scatter * (2 if strategy.overlap else 1)
    part = "replicated" if p.opt_state == "replicated" else "sharded"  # what one device updates
    update = 0 if p.opt_state == "host" else sum(local_bytes(x, part, devices) for x in ps)
    return FixedBytes(state, buffers, update)


def device_step(
    trace: Trace,
    block_params: Sequence[Sequence[int]],
    params: object,
    opt_state: object,
    strategy: Strategy,
    devices: int,
    platform: Platform,
    costs: StepCosts | None = None,
    *,
    grads: object = None,
) -> DeviceStep:
    """Memory and time of one step on one of ``devices`` data-parallel devices.

    Args:
        trace: the simulator's trace of the activation schedule (block-chain ops).
        block_params: per block 0..L (L: the loss stage), indices into ``params`` of the
            parameters it reads.
        params, opt_state, grads: per-tensor ``(shape, itemsize)``
            (:func:`~schedir.training_state.device_bytes`).
        strategy: a :class:`Strategy`.
        devices: N.
        platform: the ring's devices and links (N > 1) and the host copy engines.
        costs: optimizer update throughputs (default :class:`StepCosts`).
    """
    held = fixed_bytes(block_params, params, opt_state, strategy, devices, grads=grads)
    costs = costs or StepCosts()
    p, n, state = strategy.placement, devices, held.state
    ps = as_tensors("params", params)
    gs = ps if grads is None else as_tensors("grads", grads)
    groups = _block_params(block_params, len(ps))
    L = len(groups) - 1
    bandwidth, latency = ring_bandwidth(platform, n) if n > 1 else (math.inf, 0.0)
    sharded_grads = p.grads == "sharded"
    passes = 2 if p.opt_state == "replicated" else 1
    depth = 2 if strategy.overlap else 1
    ops = trace.ops
    if len(trace.start) != len(ops) or len(trace.end) != len(ops):
        raise InvalidProblem("trace: start and end must give one time per op")

    def block(op: object) -> int:
        if isinstance(op, Loss):
            return L
        k = getattr(op, "index", None)
        if not isinstance(k, int) or not 0 <= k < L:
            raise InvalidProblem(f"trace op {op!r}: no block {k!r} in block_params")
        return k

    first_reader: dict[int, int] = {}  # tensor -> lowest block reading it
    for k, ids in enumerate(groups):
        for t in ids:
            first_reader[t] = min(first_reader.get(t, k), k)
    complete: dict[int, list[int]] = {}
    for t, k in first_reader.items():
        complete.setdefault(k, []).append(t)
    gather = [split_bytes(ps, g, n, p.params) for g in groups]

    clock = {"compute": 0.0, "ring": 0.0, "down": 0.0, "ring_busy": 0.0}
    totals = {"sent": 0, "host": 0}

    def collective(nbytes: int, at: float, times: int = 1) -> float:
        sent, seconds = ring_pass(nbytes, n, bandwidth, latency)
        start = max(clock["ring"], at)
        clock["ring"] = start + times * seconds
        clock["ring_busy"] += times * seconds
        totals["sent"] += times * sent
        return clock["ring"]

    def copy_down(nbytes: int, at: float) -> None:
        start = max(clock["down"], at)
        clock["down"] = start + platform.offload.time(nbytes)
        totals["host"] += nbytes

    if p.opt_state == "host":  # the parameter shard the host update reads
        copy_down(sum(local_bytes(t, "sharded", n) for t in ps), 0.0)
    arrived = [0.0] * len(ops)
    if ops and gather[block(ops[0])]:
        arrived[0] = collective(gather[block(ops[0])], 0.0)
    reduced: list[float] = []
    for i, op in enumerate(ops):
        k = block(op)
        backward = isinstance(op, B | Loss)
        start = max(clock["compute"], arrived[i])
        if backward and sharded_grads and len(reduced) >= depth:
            start = max(start, reduced[-depth])
        end = start + (trace.end[i] - trace.start[i])
        clock["compute"] = end
        if i + 1 < len(ops) and gather[block(ops[i + 1])]:
            arrived[i + 1] = collective(
                gather[block(ops[i + 1])], start if strategy.prefetch else end
            )
        if not backward:
            continue
        tensors = sorted(set(groups[k])) if sharded_grads else sorted(complete.get(k, ()))
        volume = sum(gs[t].nbytes for t in tensors)
        if not volume:
            continue
        done = collective(volume, end, passes)
        if sharded_grads:
            reduced.append(done)
        if p.opt_state == "host":
            copy_down(sum(local_bytes(gs[t], "sharded", n) for t in tensors), done)
    t = max(clock["compute"], clock["ring"], clock["down"])
    part = "replicated" if p.opt_state == "replicated" else "sharded"  # what one device updates
    upd_p = sum(local_bytes(x, part, n) for x in ps)
    upd_g = sum(local_bytes(x, part, n) for x in gs)
    touched = upd_g + 2 * upd_p + 2 * (state.host if p.opt_state == "host" else state.opt_state)
    if p.opt_state == "host":
        update_time = touched / costs.host_bytes_per_second
        t += update_time + platform.prefetch.time(upd_p)
        totals["host"] += upd_p
    else:
        update_time = touched / costs.update_bytes_per_second
        t += update_time
    if p.params == "replicated" and p.opt_state != "replicated" and n > 1:
        # (parameters the model shards over the data axis itself stay sharded)
        t = collective(sum(x.nbytes for x in ps if x.data_axis is None), t)
    return DeviceStep(
        strategy=strategy,
        state=state,
        buffers=held.buffers,
        activation_peak=trace.peak_memory,
        update_bytes=held.update_bytes,
        compute_time=trace.makespan,
        update_time=update_time,
        step_time=t,
        ring_time=clock["ring_busy"],
        collective_bytes=totals["sent"],
        host_bytes=totals["host"],
    )


__all__ = [
    "DeviceStep",
    "FixedBytes",
    "StepCosts",
    "Strategy",
    "data_parallel_platform",
    "device_step",
    "fixed_bytes",
    "strategies",
]

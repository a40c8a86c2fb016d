"""Bytes of the training state on each data-parallel device, and its communication.

The training state is the parameters, their gradients and the optimizer state. Each of
the three has a placement on a data-parallel axis of N devices:

- ``replicated``: every device holds a full copy (plain data parallelism);
- ``sharded``: each device holds 1/N of every tensor that can be split (ZeRO,
  Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models": stage 1 shards the optimizer state, stage 2 also the gradients,
  stage 3 also the parameters);
- ``host`` (optimizer state only): the optimizer state and its update live in host
  memory (ZeRO-Offload, Ren et al. 2021), partitioned over the N data-parallel
  processes as ZeRO-Offload does; the device keeps none of it.

Sharding rule (the one :mod:`jax_exec.zero` executes): a tensor of shape ``s`` is split
along its first axis whose size is a positive multiple of N, into N equal contiguous
pieces, one per device (``jax.sharding.NamedSharding`` with ``PartitionSpec('data')`` on
that axis). ``NamedSharding`` refuses an axis that N does not divide (it neither pads nor
gives extra rows to some devices), so a tensor with no such axis (a scalar, a bias of odd
length) stays replicated on every device, whatever the placement. A tensor with a zero
size holds 0 bytes anywhere. With N = 1 every placement holds the full tensor.

A model sharded by its authors (FSDP, tensor parallelism: ``nnx.with_partitioning`` on
a mesh with a ``data`` axis) keeps its own shardings: a :class:`Tensor` is then what one
data-parallel ring sees, its ``shape`` divided by the model's other mesh axes, and its
``data_axis`` the axis the model itself splits over ``data`` (sharded along it under
every placement), if any; the rule above applies to the others.

All byte counts are exact integers computed from per-tensor ``(shape, itemsize)``;
:func:`zero_paper_bytes` is the paper's closed form, for comparison.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction

from schedir.errors import InvalidProblem
from schedir.platform import Platform

PLACEMENTS = ("replicated", "sharded", "host")


@dataclass(frozen=True)
class Tensor:
    """One array of the training state.

    Attributes:
        shape: dimensions (elements); ``()`` for a scalar. Of a model sharded by its
            authors: one device's piece over the mesh axes other than ``data``.
        itemsize: bytes per element.
        data_axis: the axis the model's own sharding splits over the data axis (e.g.
            FSDP), sharded along it under every placement; None: placed by the rule.
    """

    shape: tuple[int, ...]
    itemsize: int
    data_axis: int | None = None

    def __post_init__(self) -> None:
        shape = self.shape
        if not isinstance(shape, tuple | list) or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise InvalidProblem(f"shape = {shape!r}: expected a tuple of non-negative ints")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        size = self.itemsize
        if not isinstance(size, numbers.Integral) or isinstance(size, bool) or size <= 0:
            raise InvalidProblem(f"itemsize = {size!r}: expected a positive int (bytes)")
        object.__setattr__(self, "itemsize", int(size))
        axis = self.data_axis
        if axis is not None and (
            not isinstance(axis, numbers.Integral) or isinstance(axis, bool)
            or not 0 <= axis < len(self.shape)
        ):  # fmt: skip
            raise InvalidProblem(
                f"data_axis = {axis!r}: expected None or an axis of shape {self.shape}"
            )

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return math.prod(self.shape) * self.itemsize


def as_tensors(name: str, tensors: object) -> tuple[Tensor, ...]:
    """``tensors`` (Tensor or ``(shape, itemsize)`` items) as Tensors; InvalidProblem naming
    ``name[k]`` for a malformed item."""
    if isinstance(tensors, str | bytes) or not hasattr(tensors, "__iter__"):
        raise InvalidProblem(f"{name} = {tensors!r}: expected a list of (shape, itemsize)")
    out = []
    for k, t in enumerate(tensors):
        if isinstance(t, Tensor):
            out.append(t)
            continue
        if not isinstance(t, tuple | list) or len(t) != 2:
            raise InvalidProblem(f"{name}[{k}] = {t!r}: expected (shape, itemsize)")
        try:
            out.append(Tensor(tuple(t[0]) if isinstance(t[0], list) else t[0], t[1]))
        except InvalidProblem as err:
            raise InvalidProblem(f"{name}[{k}]: {err}") from None
    return tuple(out)


def _devices(devices: object) -> int:
    if not isinstance(devices, numbers.Integral) or isinstance(devices, bool) or devices < 1:
        raise InvalidProblem(f"devices = {devices!r}: expected a positive int")
    return int(devices)


def shard_axis(shape: tuple[int, ...], devices: int) -> int | None:
    """The axis a ``sharded`` tensor of ``shape`` is split along over ``devices``, or None
    when it stays replicated (no axis is a positive multiple of ``devices``, or N = 1).

    >>> shard_axis((10, 16), 8), shard_axis((13,), 8), shard_axis((), 8)
    (1, None, None)
    """
    devices = _devices(devices)
    if devices == 1:
        return None
    return next((a for a, d in enumerate(shape) if d > 0 and d % devices == 0), None)


def split(tensor: Tensor, placement: str, devices: int) -> bool:
    """Whether each device holds 1/``devices`` of ``tensor`` under ``placement`` (never
    with N = 1): the model splits it over the data axis itself (``data_axis``), or the
    placement is ``sharded`` or ``host`` and the rule finds an axis. InvalidProblem for
    a ``data_axis`` that ``devices`` does not divide."""
    if placement not in PLACEMENTS:
        raise InvalidProblem(f"placement = {placement!r}: expected one of {PLACEMENTS}")
    n = _devices(devices)
    if n == 1:
        return False
    if tensor.data_axis is not None:
        if tensor.shape[tensor.data_axis] % n:
            raise InvalidProblem(
                f"data_axis = {tensor.data_axis} of shape {tensor.shape}: not a multiple of "
                f"the {n} devices"
            )
        return True
    return placement != "replicated" and shard_axis(tensor.shape, n) is not None


def local_bytes(tensor: Tensor, placement: str, devices: int) -> int:
    """Bytes of ``tensor`` that one device holds under ``placement`` (0 for ``host``)."""
    pieces = devices if split(tensor, placement, devices) else 1
    return 0 if placement == "host" else tensor.nbytes // pieces


@dataclass(frozen=True)
class Placement:
    """Where each part of the training state lives.

    Attributes:
        params, grads: ``replicated`` or ``sharded``.
        opt_state: ``replicated``, ``sharded`` or ``host``.
    """

    params: str = "replicated"
    grads: str = "replicated"
    opt_state: str = "replicated"

    def __post_init__(self) -> None:
        for name, allowed in (("params", PLACEMENTS[:2]), ("grads", PLACEMENTS[:2]),
                              ("opt_state", PLACEMENTS)):  # fmt: skip
            if getattr(self, name) not in allowed:
                raise InvalidProblem(f"{name} = {getattr(self, name)!r}: expected one of {allowed}")

    @classmethod
    def zero(cls, stage: int, *, offload: bool = False) -> Placement:
        """ZeRO stage 0 (data parallelism), 1, 2 or 3; ``offload``: optimizer state on host.

        >>> Placement.zero(2)
        Placement(params='replicated', grads='sharded', opt_state='sharded')
        """
        if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
            raise InvalidProblem(f"stage = {stage!r}: expected 0, 1, 2 or 3")
        opt = "host" if offload else ("sharded" if stage >= 1 else "replicated")
        return cls(
            params="sharded" if stage >= 3 else "replicated",
            grads="sharded" if stage >= 2 else "replicated",
            opt_state=opt,
        )


@dataclass(frozen=True)
class DeviceBytes:
    """The training state's bytes on one device (and its share of host memory).

    Attributes:
        params, grads, opt_state: bytes held for the whole step on the device.
        gather: transient bytes of stage 3's all-gather, the largest block's full
            parameters among those the rule splits (the others are whole already;
            freed after the block's forward or backward); 0 otherwise.
        reduce_scatter: transient bytes of the largest block's full gradients before
            their reduce-scatter (sharded gradients only, tensors the rule splits; the
            all-reduce of replicated gradients is in place); 0 otherwise.
        host: bytes of optimizer state this device's process keeps in host memory.
    """

    params: int
    grads: int
    opt_state: int
    gather: int
    reduce_scatter: int
    host: int

    @property
    def resident(self) -> int:
        """params + grads + opt_state, bytes."""
        return self.params + self.grads + self.opt_state

    @property
    def peak(self) -> int:
        """resident plus both transients (a bound: they need not coincide), bytes."""
        return self.resident + self.gather + self.reduce_scatter


def _blocks(blocks: object, count: int) -> tuple[tuple[int, ...], ...]:
    if blocks is None:
        return tuple((k,) for k in range(count))
    out = []
    for b, block in enumerate(blocks):
        ids = tuple(block)
        for i in ids:
            if not isinstance(i, numbers.Integral) or isinstance(i, bool) or not 0 <= i < count:
                raise InvalidProblem(f"blocks[{b}] = {ids!r}: indices must lie in [0, {count})")
        out.append(ids)
    return tuple(out)


def split_bytes(
    tensors: tuple[Tensor, ...], indices: object, devices: int, placement: str = "sharded"
) -> int:
    """Full bytes of the tensors among ``indices`` split over ``devices`` under
    ``placement`` (:func:`split`: those a gather or a reduce-scatter moves; the others
    are whole on every device already), each index once."""
    return sum(tensors[i].nbytes for i in set(indices) if split(tensors[i], placement, devices))


def block_bytes(
    tensors: tuple[Tensor, ...], groups: object, devices: int, placement: str = "sharded"
) -> int:
    """The largest group's :func:`split_bytes` (0 for no group or N = 1)."""
    return max((split_bytes(tensors, g, devices, placement) for g in groups), default=0)


def device_bytes(
    params: object,
    opt_state: object,
    placement: Placement,
    devices: int,
    *,
    grads: object = None,
    blocks: object = None,
) -> DeviceBytes:
    """Bytes one of ``devices`` data-parallel devices holds under ``placement``.

    Args:
        params: the parameters, ``(shape, itemsize)`` per tensor.
        opt_state: the optimizer state's tensors (``jax.eval_shape(optimizer.init, params)``).
        placement: a :class:`Placement`.
        devices: N, the size of the data-parallel axis.
        grads: the gradients' tensors, in the order of ``params``; default: ``params``
            (mixed precision keeps fp16 gradients of fp16 parameters).
        blocks: groups of indices into ``params`` gathered together by stage 3 (e.g. one
            transformer layer); default: each tensor alone.

    >>> p = [((16, 4), 4), ((3,), 4)]
    >>> device_bytes(p, p + [((), 4)], Placement.zero(3), 8)
    DeviceBytes(params=44, grads=44, opt_state=48, gather=256, reduce_scatter=256, host=0)
    """
    if not isinstance(placement, Placement):
        raise InvalidProblem(f"placement = {placement!r}: expected a Placement")
    n = _devices(devices)
    ps, os_ = as_tensors("params", params), as_tensors("opt_state", opt_state)
    gs = ps if grads is None else as_tensors("grads", grads)
    if len(gs) != len(ps):
        raise InvalidProblem(f"grads: {len(gs)} tensors for {len(ps)} params")
    groups = _blocks(blocks, len(ps))
    # what is split is gathered whole before use and reduce-scattered after the
    # backward: under a sharded placement, and tensors the model splits itself
    gather = block_bytes(ps, groups, n, placement.params)
    scatter = block_bytes(gs, groups, n, placement.grads)
    host = sum(local_bytes(t, "sharded", n) for t in os_) if placement.opt_state == "host" else 0
    return DeviceBytes(
        params=sum(local_bytes(t, placement.params, n) for t in ps),
        grads=sum(local_bytes(t, placement.grads, n) for t in gs),
        opt_state=sum(local_bytes(t, placement.opt_state, n) for t in os_),
        gather=gather,
        reduce_scatter=scatter,
        host=host,
    )


def zero_paper_bytes(parameters: int, devices: int, stage: int, k: int = 12) -> Fraction:
    """The ZeRO paper's per-device bytes of mixed-precision training (Fig. 1, Table 1):
    2 bytes of fp16 parameters, 2 of fp16 gradients and K of optimizer state (K = 12 for
    Adam: fp32 parameters, momentum, variance) per parameter, the parts of each stage
    divided by N. Exact (a Fraction); the paper prints GB = 1e9 bytes, rounded.

    >>> float(zero_paper_bytes(7_500_000_000, 64, 0)) / 1e9
    120.0
    """
    n = _devices(devices)
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise InvalidProblem(f"stage = {stage!r}: expected 0, 1, 2 or 3")
    for name, v in (("parameters", parameters), ("k", k)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 0:
            raise InvalidProblem(f"{name} = {v!r}: expected a non-negative int")
    parts = [2, 2, k]  # params, grads, optimizer state, bytes per parameter
    return sum(
        (Fraction(b * parameters, n if i < stage else 1) for i, b in enumerate(reversed(parts))),
        Fraction(0),
    )


def mixed_precision_adam(params: object) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """The paper's mixed-precision Adam state of ``params`` (shapes; itemsizes ignored):
    fp16 parameters (2 bytes/element) and the optimizer's fp32 master copy, momentum and
    variance (3 x 4 bytes/element). Returns (params, opt_state) for :func:`device_bytes`."""
    shapes = [t.shape for t in as_tensors("params", params)]
    half = tuple(Tensor(s, 2) for s in shapes)
    return half, tuple(Tensor(s, 4) for s in shapes for _ in range(3))


@dataclass(frozen=True)
class StepComm:
    """Communication of one training step on one device (a model; see :func:`step_comm`).

    Attributes:
        collective_bytes: bytes each device sends over the data-parallel ring.
        collective_time: seconds of the all-gathers, reduce-scatters and all-reduces.
        host_bytes: bytes copied device -> host plus host -> device.
        host_time: seconds of those copies.
    """

    collective_bytes: int
    collective_time: float
    host_bytes: int
    host_time: float

    @property
    def time(self) -> float:
        """collective_time + host_time, seconds (no overlap with compute assumed)."""
        return self.collective_time + self.host_time


def ring_bandwidth(platform: Platform, devices: int) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of the slowest hop of the ring over the first
    ``devices`` devices of ``platform`` in their order; InvalidProblem for a missing link."""
    n = _devices(devices)
    if len(platform.devices) < n:
        raise InvalidProblem(f"devices = {n}: the platform has {len(platform.devices)} devices")
    names = [d.name for d in platform.devices[:n]]
    hops = [platform.link(names[i], names[(i + 1) % n]) for i in range(n)] if n > 1 else []
    return (min((h.bandwidth for h in hops), default=math.inf),
            max((h.latency for h in hops), default=0.0))  # fmt: skip


def ring_pass(nbytes: int, n: int, bandwidth: float, latency: float) -> tuple[int, float]:
    """One ring all-gather or reduce-scatter of a buffer of ``nbytes`` (the full size):
    N - 1 steps, each sending nbytes / N per device."""
    if n == 1:
        return 0, 0.0
    sent = (n - 1) * nbytes // n
    return sent, (n - 1) * latency + (sent / bandwidth if sent else 0.0)


def step_comm(
    params: object,
    placement: Placement,
    devices: int,
    platform: Platform,
    *,
    grads: object = None,
) -> StepComm:
    """Per-device communication of one step under ``placement`` (a model, not a measure).

    Collectives run on a ring over the platform's first N devices at its slowest hop
    (:func:`ring_bandwidth`); each all-gather or reduce-scatter of a B-byte buffer sends
    (N - 1) / N * B bytes per device in N - 1 steps of the link's latency. Gradients are
    always reduce-scattered (an all-reduce is a reduce-scatter plus an all-gather), and
    parameters all-gathered once (after the update: stages 0-2) or twice (before the
    forward and before the backward: stage 3, the paper's 1.5x). Host-resident optimizer
    state copies each device's gradient shard to the host (``platform.offload``) and the
    updated parameter shard back (``platform.prefetch``). Tensors the sharding rule keeps
    replicated are all-reduced with the rest (same volume).
    """
    n = _devices(devices)
    ps = as_tensors("params", params)
    gs = ps if grads is None else as_tensors("grads", grads)
    p_bytes, g_bytes = sum(t.nbytes for t in ps), sum(t.nbytes for t in gs)
    bandwidth, latency = ring_bandwidth(platform, n) if n > 1 else (math.inf, 0.0)
    gathers = 2 if placement.params == "sharded" else 1
    sent, seconds = 0, 0.0
    for nbytes, times in ((g_bytes, 1), (p_bytes, gathers)):
        s, t = ring_pass(nbytes, n, bandwidth, latency)
        sent, seconds = sent + times * s, seconds + times * t
    host_bytes, host_time = 0, 0.0
    if placement.opt_state == "host":
        down = sum(local_bytes(t, "sharded", n) for t in gs)
        up = sum(local_bytes(t, "sharded", n) for t in ps)
        host_bytes = down + up
        host_time = platform.offload.time(down) + platform.prefetch.time(up)
    return StepComm(sent, seconds, host_bytes, host_time)

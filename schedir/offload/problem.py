"""Offloading problems, copy ops, schedules and their two-stream simulator (docs/offload.md).

An :class:`OffloadProblem` pairs a chain with a :class:`~schedir.platform.Platform`
(device and host capacities, one copy engine per direction). A schedule mixes the
chain ops of docs/semantics.md with copy ops on named buffers (``a[k]``, ``abar[k]``,
``d[k]``; with ``weight_size`` also ``w[k]``, the weights of stage k, and ``g[k]``,
their gradient):

- ``Offload(buf)``: device -> host on the offload engine.
- ``Prefetch(buf)``: host -> device on the prefetch engine.
- ``Wait(buf)``: the compute stream waits until the last copy of ``buf`` ends.
- ``Evict(buf)``: drop the device copy of a buffer the host also holds (weights).

Timing. The compute stream runs the chain ops in order; a copy op is issued when the
compute stream reaches it (at the end of the previous compute op or Wait) and starts
when its engine is free. A compute op whose input is still being prefetched waits for
that copy. Makespan is the end of the last op of any stream.

Memory (exact rules in ``docs/offload.md``). A buffer being offloaded occupies the
device until its copy ends (and until every compute op that read it meanwhile ends);
a prefetched buffer occupies the device from its copy's start. The trace reports

- ``peak_memory``: the peak of the timed device curve (the physical peak);
- ``resident`` / ``op_peak``: program-order figures, what a runtime that only
  observes copies at ``Wait`` holds: an offloaded buffer is counted until its
  ``Wait``, a prefetched one from its ``Prefetch``. ``program_peak`` >= ``peak_memory``.

A schedule without copy ops has exactly the chain simulator's makespan and peak.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from schedir.chain.ops import OP_TYPES, B, F_all, F_ck, F_n, Loss, parse_op
from schedir.chain.problem import MAX_TOTAL_SIZE, SIZE_FIELDS, Chain, _as_size, scaled_sum
from schedir.errors import InvalidProblem, InvalidSchedule
from schedir.io import FORMATS
from schedir.platform import Platform
from schedir.schedule import Schedule
from schedir.simulate import SIMULATORS, op_time

_BUF_RE = re.compile(r"^(a|abar|d|w|g)\[(\d+)\]$")
KINDS = ("a", "abar", "d", "w", "g")


def parse_buffer(text: str) -> tuple[str, int]:
    """``"abar[3]"`` -> ``("abar", 3)``; InvalidSchedule otherwise."""
    match = _BUF_RE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InvalidSchedule(f"buffer {text!r}: expected one of {', '.join(KINDS)} as 'a[3]'")
    return match.group(1), int(match.group(2))


@dataclass(frozen=True)
class _CopyOp:
    buffer: str

    def __post_init__(self) -> None:
        buf = self.buffer
        if isinstance(buf, tuple):
            buf = f"{buf[0]}[{buf[1]}]"
        kind, k = parse_buffer(buf)
        object.__setattr__(self, "buffer", f"{kind}[{k}]")

    @property
    def key(self) -> tuple[str, int]:
        return parse_buffer(self.buffer)

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.buffer})"

    __repr__ = __str__


class Offload(_CopyOp):
    """Copy ``buffer`` device -> host; its device copy is freed when the copy ends."""


class Prefetch(_CopyOp):
    """Copy ``buffer`` host -> device; it occupies device memory from the copy's start."""


class Wait(_CopyOp):
    """The compute stream waits for the last copy of ``buffer`` to end."""


class Evict(_CopyOp):
    """Drop the device copy of a buffer that the host also holds (weights)."""


COPY_OP_TYPES: dict[str, type] = {
    "Offload": Offload,
    "Prefetch": Prefetch,
    "Wait": Wait,
    "Evict": Evict,
}
_COPY_RE = re.compile(r"^\s*(Offload|Prefetch|Wait|Evict)\(\s*([a-z]+\[\d+\])\s*\)\s*$")


def parse_offload_op(text: str):
    """Parse a chain op or a copy op from its printed form, e.g. ``"Offload(a[2])"``."""
    match = _COPY_RE.match(text) if isinstance(text, str) else None
    if match is not None:
        return COPY_OP_TYPES[match.group(1)](match.group(2))
    return parse_op(text)


@dataclass(frozen=True)
class OffloadProblem:
    """A chain to train on one device with a host memory (docs/offload.md).

    Attributes:
        chain: the chain (sizes in bytes, times in seconds).
        platform: ``device_memory`` / ``host_memory`` (bytes, None: unlimited) and the
            ``offload`` (device -> host) and ``prefetch`` copy engines.
        weight_size: optional bytes of the weights of each stage (L + 1 entries, index
            L the loss). None: weights are not modeled (always resident, not counted,
            as in the chain model). Given: every weight starts on the host, a stage's
            ops need ``w[k]`` on the device and ``B(k)`` adds its gradient ``g[k]``.
    """

    chain: Chain
    platform: Platform = field(default_factory=Platform)
    weight_size: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.chain, Chain):
            raise InvalidProblem(f"chain = {self.chain!r}: expected a schedir.Chain")
        if not isinstance(self.platform, Platform):
            raise InvalidProblem(f"platform = {self.platform!r}: expected a schedir.Platform")
        if self.weight_size is not None:
            if isinstance(self.weight_size, str | bytes) or not hasattr(
                self.weight_size, "__len__"
            ):
                raise InvalidProblem(f"weight_size = {self.weight_size!r}: expected a sequence")
            sizes = tuple(self.weight_size)
            n = self.chain.length + 1
            if len(sizes) != n:
                raise InvalidProblem(f"weight_size has length {len(sizes)}, expected L + 1 = {n}")
            sizes = tuple(_as_size("weight_size", k, v) for k, v in enumerate(sizes))
            chain_total = sum(sum(getattr(self.chain, f)) for f in SIZE_FIELDS)
            if 2 * sum(sizes) + chain_total >= MAX_TOTAL_SIZE:
                raise InvalidProblem(
                    "weight_size: weights and gradients with the chain's sizes reach 2**62 "
                    "bytes; express sizes in a larger unit"
                )
            object.__setattr__(self, "weight_size", sizes)
        self._check_transfer_times()

    def _check_transfer_times(self) -> None:
        """Refuse copy engines so slow that a makespan overflows (bandwidth 0 is fine:
        no copy happens)."""
        chain = self.chain
        sizes = [*chain.in_size, *chain.saved_size, *(self.weight_size or ())]
        L = chain.length
        for name in ("offload", "prefetch"):
            engine = getattr(self.platform, name)
            times = [engine.time(v) for v in sizes]
            # every buffer copied at most once per node of a schedule tree
            total = scaled_sum(4 * (2 * L + 2), [t for t in times if math.isfinite(t)])
            if not math.isfinite(total):
                raise InvalidProblem(
                    f"platform.{name}: bandwidth {engine.bandwidth!r} B/s, latency "
                    f"{engine.latency!r} s: transfer times overflow a makespan"
                )

    def to_dict(self) -> dict:
        d = {"format": "schedir.offload_problem", "version": 1, "chain": self.chain.to_dict()}
        d["platform"] = self.platform.to_dict()
        if self.weight_size is not None:
            d["weight_size"] = list(self.weight_size)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> OffloadProblem:
        if not isinstance(d, dict) or d.get("format") != "schedir.offload_problem":
            raise InvalidProblem("expected a JSON object with format 'schedir.offload_problem'")
        if d.get("version") != 1:
            raise InvalidProblem(f"version = {d.get('version')!r}: this library reads version 1")
        return cls(
            Chain.from_dict(d["chain"]), Platform.from_dict(d["platform"]), d.get("weight_size")
        )


@dataclass(frozen=True)
class OffloadSchedule(Schedule):
    """Chain ops and copy ops, with JSON format ``schedir.offload_schedule`` (version 1)."""

    FORMAT: ClassVar[str] = "schedir.offload_schedule"
    OPS: ClassVar[str] = "a chain or copy op"

    @staticmethod
    def parse_op(text: str):
        return parse_offload_op(text)

    @staticmethod
    def is_op(op) -> bool:
        return type(op) in OP_TYPES.values() or type(op) in COPY_OP_TYPES.values()


@dataclass(frozen=True)
class OffloadTrace:
    """What a schedule does on an :class:`OffloadProblem`.

    Attributes:
        makespan: end of the last op on any stream, seconds.
        peak_memory: peak of the timed device memory curve, bytes.
        program_peak: max of ``initial_memory`` and ``op_peak`` (program order), bytes.
        host_peak: peak host bytes (offloaded activations, weights, gradients).
        initial_memory: device bytes before the first op (x_0).
        resident: device bytes after each op in program order (an offloaded buffer
            counts until its ``Wait``, a prefetched one from its ``Prefetch``).
        op_peak: program-order bytes each op needs (compute ops: resident after adding
            the output, plus temporaries; other ops: resident after them).
        host_resident: host bytes after each op (program order).
        start, end: per op, seconds: compute ops on the compute stream, copy ops the
            copy itself, ``Wait`` the compute stream's wait (``Evict``: instant).
        stream: per op, ``"compute"``, ``"offload"``, ``"prefetch"`` or ``"wait"``.
        device_curve, host_curve: ``(time, bytes)`` after every memory event, in order.
        ops: the ops.
        buffers: device-resident buffer names after each op (when asked for).
    """

    makespan: float
    peak_memory: int
    program_peak: int
    host_peak: int
    initial_memory: int
    resident: tuple[int, ...]
    op_peak: tuple[int, ...]
    host_resident: tuple[int, ...]
    start: tuple[float, ...]
    end: tuple[float, ...]
    stream: tuple[str, ...]
    device_curve: tuple[tuple[float, int], ...]
    host_curve: tuple[tuple[float, int], ...]
    ops: tuple
    buffers: tuple[frozenset[str], ...] | None = None


def _as_offload_ops(schedule_or_ops) -> tuple:
    if isinstance(schedule_or_ops, OffloadSchedule):
        return schedule_or_ops.ops
    if isinstance(schedule_or_ops, Schedule):
        return schedule_or_ops.ops  # a plain chain schedule: no copy ops
    return OffloadSchedule(tuple(schedule_or_ops)).ops


def simulate_offload(
    problem: OffloadProblem, schedule_or_ops: Schedule | Iterable, *, record_buffers: bool = False
) -> OffloadTrace:
    """Run a schedule with copy ops on ``problem`` and return its :class:`OffloadTrace`.

    Raises :class:`InvalidSchedule` (op index, op, buffer) when an op cannot run, when
    the step is incomplete, or when host memory exceeds ``platform.host_memory``.

    >>> from schedir import Chain, F_all, Loss, B, Platform
    >>> c = Chain.from_rotor([1.0], [2.0, 0.5], [4, 8], [0, 12], [0], [0, 0])
    >>> p = OffloadProblem(c, Platform.host_offload(4.0))
    >>> t = simulate_offload(p, [Offload("a[0]"), F_all(0), Wait("a[0]"),
    ...                          Prefetch("a[0]"), Loss(), Wait("a[0]"), B(0)])
    >>> t.makespan, t.peak_memory, t.program_peak
    (4.0, 28, 28)
    """
    from schedir.offload.simulate import run

    return run(problem, _as_offload_ops(schedule_or_ops), record_buffers)


def op_seconds(chain: Chain, op) -> float:
    """Compute time of a chain op, seconds."""
    return op_time(chain, op)


def is_compute(op) -> bool:
    return isinstance(op, F_ck | F_n | F_all | Loss | B)


SIMULATORS[OffloadProblem] = simulate_offload
FORMATS["schedir.offload_problem"] = OffloadProblem
FORMATS["schedir.offload_schedule"] = OffloadSchedule

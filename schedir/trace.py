"""Records shared by the kinds: the single-stream :class:`Trace` (chain, graph, blocks)
and the :class:`Span` a kind's ``lanes`` function returns for the renderings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Trace:
    """What a schedule does on a problem, op by op on one stream.

    Attributes:
        makespan: total time, seconds (sum of op times).
        peak_memory: bytes, max of ``initial_memory`` and every ``op_peak``.
        initial_memory: bytes resident before the first op.
        resident: bytes resident after each op.
        op_peak: bytes each op needs: resident after adding its output, plus its
            temporary bytes.
        start: start time of each op, seconds; ``end`` likewise.
        ops: the ops.
        buffers: names of the resident buffers after each op (only when asked for).
        host_resident: bytes in host memory after each op (block chains with copy
            ops; empty where nothing is offloaded).
        serial_makespan: block chains: the time with every host-memory variant's
            copies charged whole to its recording and its backward (what the block DP
            minimizes; never below ``makespan``, which overlaps them with compute);
            None for the other kinds.
    """

    makespan: float
    peak_memory: int
    initial_memory: int
    resident: tuple[int, ...]
    op_peak: tuple[int, ...]
    start: tuple[float, ...]
    end: tuple[float, ...]
    ops: tuple
    buffers: tuple[frozenset[str], ...] | None = None
    host_resident: tuple[int, ...] = ()
    serial_makespan: float | None = None


@dataclass(frozen=True)
class Span:
    """One op on one resource: ``[start, end)`` seconds, its printed ``label`` and
    ``kind`` (a key of ``schedir.render.LETTERS`` and ``schedir.plot_style.OP_KINDS``:
    its letter and colour)."""

    start: float
    end: float
    label: str
    kind: str


class TraceRecorder:
    """Collects a single-stream simulation op by op and builds its :class:`Trace`
    (the bookkeeping the chain, graph and block-chain simulators share).

    >>> r = TraceRecorder(initial_memory=4)
    >>> r.record(need=10, resident=8, duration=1.5)
    >>> r.record(need=8, resident=2, duration=0.5)
    >>> t = r.trace(ops=("x", "y")); t.makespan, t.peak_memory, t.start
    (2.0, 10, (0.0, 1.5))
    """

    def __init__(self, initial_memory: int, record_buffers: bool = False):
        self.initial_memory = initial_memory
        self.record_buffers = record_buffers
        self.clock = 0.0
        self.peak = initial_memory
        self.resident: list[int] = []
        self.op_peak: list[int] = []
        self.start: list[float] = []
        self.end: list[float] = []
        self.buffers: list[frozenset[str]] = []

    def record(
        self, need: int, resident: int, duration: float, buffers=None, not_before: float = 0.0
    ) -> None:
        """One op: the bytes it needs, the bytes resident after it, its seconds, and
        (when recording buffers) a callable returning the resident buffer names; it
        starts when the previous op ends, or at ``not_before`` if later (it waits for a
        copy)."""
        self.peak = max(self.peak, need)
        self.op_peak.append(need)
        self.resident.append(resident)
        self.clock = max(self.clock, not_before)
        self.start.append(self.clock)
        self.clock += duration
        self.end.append(self.clock)
        if self.record_buffers:
            self.buffers.append(frozenset(buffers()))

    def trace(self, ops: tuple) -> Trace:
        return Trace(
            makespan=self.clock,
            peak_memory=self.peak,
            initial_memory=self.initial_memory,
            resident=tuple(self.resident),
            op_peak=tuple(self.op_peak),
            start=tuple(self.start),
            end=tuple(self.end),
            ops=ops,
            buffers=tuple(self.buffers) if self.record_buffers else None,
        )

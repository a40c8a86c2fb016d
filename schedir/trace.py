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


@dataclass(frozen=True)
class Span:
    """One op on one resource: ``[start, end)`` seconds, its printed ``label`` and
    ``kind`` (a key of ``schedir.render.KINDS``: its letter and color)."""

    start: float
    end: float
    label: str
    kind: str

"""What a device holds under a fixed op order, given its chunks' plans: the bytes that
the pipeline simulator charges for the micro-batches in flight.

A chunk planned with footprint F and held bytes H (:class:`~schedir.pipeline.schedule.
ChunkPlan`, :func:`schedir.pipeline.ops.effect`) holds H per micro-batch from its
forward's start to its backward's end, and the op running on the device adds the rest
of its chunk's footprint, F - H, while it runs; an input part of a split backward
leaves its ``W`` the weight-gradient data (``wgrad_bytes``, or H and the incoming
gradient). A plan that does not say what it holds (H None) holds F all along. So, on
a device whose op list is fixed, the activation bytes at the moment an op runs are

    sum over its chunks c of (stashes of c alive) H_c + (weight-gradient data of c
    alive) W_c, plus the running op's F - H (a W without H: its chunk's working set)

(:func:`charge`: their maximum over the ops; between ops it is at most the next op's,
which holds everything alive then). Messages (inputs arriving, gradients arriving or
being sent) come on top, outside footprints (``message_reserve``); the simulator,
which counts them as they are timed, stays the judge.

:func:`fastest_within` picks the device's plans from this exact charge, where the
joint planner used to budget each micro-batch in flight its chunk's whole footprint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from schedir.pipeline.ops import Bwd, Fwd, Wgt, wgrad_hold
from schedir.pipeline.problem import PipelineProblem
from schedir.pipeline.schedule import PipelineSchedule
from solvers.pipeline.stage_plans import Plan, StagePlans

Chunk = tuple[int, int]


@dataclass(frozen=True)
class Moment:
    """One compute op of a device's list while it runs: its chunk (``running``) and
    ``kind`` ("F", "B", "Bi", "W"), and per chunk of the device the micro-batches
    holding a stash (``stashes``, the running op's included) and holding
    weight-gradient data (``wgrads``, a running ``W``'s included)."""

    running: Chunk
    kind: str
    stashes: tuple[tuple[Chunk, int], ...]
    wgrads: tuple[tuple[Chunk, int], ...]


def moments(schedule: PipelineSchedule) -> dict[str, tuple[Moment, ...]]:
    """Per device, one :class:`Moment` per compute op of its list, in order."""
    out: dict[str, tuple[Moment, ...]] = {}
    for dev, ops in schedule.ops:
        stash: dict[Chunk, int] = {}
        wdata: dict[Chunk, int] = {}
        rows = []
        for op in ops:
            if not isinstance(op, Fwd | Bwd | Wgt):
                continue
            c = (op.first, op.last)
            if isinstance(op, Fwd):
                stash[c] = stash.get(c, 0) + 1  # allocated at its start
                kind = "F"
            elif isinstance(op, Bwd):
                kind = "Bi" if op.part == "input" else "B"
            else:
                kind = "W"
            rows.append(Moment(c, kind, _items(stash), _items(wdata)))
            if isinstance(op, Bwd):  # released (handed to its W) when it ends
                stash[c] -= 1
                if op.part == "input":
                    wdata[c] = wdata.get(c, 0) + 1
            elif isinstance(op, Wgt):
                wdata[c] -= 1
        out[dev] = tuple(rows)
    return out


def _items(counts: dict[Chunk, int]) -> tuple[tuple[Chunk, int], ...]:
    return tuple(sorted((c, n) for c, n in counts.items() if n))


def relabeled(rows: Sequence[Moment], chunk: Chunk) -> tuple[Moment, ...]:
    """The moments of a device running one chunk, as if it ran ``chunk`` (the counts
    of a fixed pattern do not depend on its cuts)."""
    return tuple(
        Moment(chunk, m.kind, tuple((chunk, n) for _, n in m.stashes),
               tuple((chunk, n) for _, n in m.wgrads))
        for m in rows
    )  # fmt: skip


def charge(problem: PipelineProblem, rows: Sequence[Moment], sizes: dict) -> int:
    """The most activation bytes the device holds while one of its ops runs (module
    docstring); ``sizes``: chunk -> (footprint, held or None), what its
    :class:`~schedir.pipeline.schedule.ChunkPlan` reserves."""
    x, L = problem.chain.in_size, problem.length
    per_stash, per_wgrad = {}, {}
    for (i, j), (f, h) in sizes.items():
        per_stash[i, j] = f if h is None else h
        kept = f if h is None else h + (x[j] if j < L else 0)  # effect: H and d_j
        per_wgrad[i, j] = wgrad_hold(problem, i, j, kept)
    top = 0
    for m in rows:
        f, h = sizes[m.running]
        if h is not None:
            temp = f - h
        elif m.kind == "W":
            temp = max(problem.chain.bwd_tmp[m.running[0] : m.running[1]])
        else:
            temp = 0
        held = sum(n * per_stash[c] for c, n in m.stashes)
        held += sum(n * per_wgrad[c] for c, n in m.wgrads)
        top = max(top, held + temp)
    return top


def fastest_within(
    plans: StagePlans,
    problem: PipelineProblem,
    rows: Sequence[Moment],
    chunks: Sequence[Chunk],
    room: float,
    share_host: int = 1,
) -> list[Plan] | None:
    """The plans of a device's ``chunks`` whose :func:`charge` fits ``room`` bytes,
    the fastest found: every chunk runs its fastest plan within a common budget b per
    micro-batch (:meth:`StagePlans.within`), b the largest of the chunks' plan-change
    budgets (:meth:`StagePlans.budgets`) whose charge fits, by bisection (the charge
    grows with b but for rotor's held bytes, which may dip: then a faster plan that
    fits may be missed, never one that does not fit be returned). None if even the
    least budget does not fit."""
    if math.isinf(room):
        return [plans.store_all(i, j) for i, j in chunks]
    if room < 0:
        return None
    budgets = sorted({b for i, j in chunks for b in plans.budgets(i, j) if b <= room})

    def at(b: int) -> list[Plan] | None:
        got = [plans.within(i, j, b, share_host) for i, j in chunks]
        if any(p is None for p in got):
            return None
        sizes = {c: plans.reserved(*c, p) for c, p in zip(chunks, got, strict=True)}
        return got if charge(problem, rows, sizes) <= room else None

    lo, hi, best = 0, len(budgets) - 1, None
    if hi >= 0 and (top := at(budgets[hi])) is not None:
        return top
    while lo < hi:  # the answer's index is in [lo, hi): budgets[hi] does not fit
        mid = (lo + hi) // 2
        got = at(budgets[mid])
        if got is None:
            hi = mid
        else:
            best, lo = got, mid + 1
    return best


def room_left(
    plans: StagePlans,
    problem: PipelineProblem,
    rows: Sequence[Moment],
    chunks: Sequence[Chunk],
    chosen: Sequence[Plan],
    room: float,
) -> float:
    """How many bytes ``room`` may lose with ``chosen`` (the plans of ``chunks``) still
    fitting (inf: any)."""
    if math.isinf(room):
        return math.inf
    sizes = {c: plans.reserved(*c, p) for c, p in zip(chunks, chosen, strict=True)}
    return room - charge(problem, rows, sizes)

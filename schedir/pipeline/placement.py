"""Chunks (virtual stages) and their placement on devices; op lists from per-device orders.

A *placement* is a tuple of chunks ``(first, last, device)`` in stage order covering
stages 0..L-1: chunk c runs stages [first, last) on ``device``. One device may hold
several chunks (interleaved 1F1B: chunk c on device c mod p; the V-shape: chunk c on
device c for c < p and on device 2p - 1 - c after). An *order* is, per device, the
sequence of its compute ops as ``(kind, chunk, mb)`` with kind "F", "B" (full
backward), "Bi" (input part) or "W" (weight part); :func:`schedule_from_orders` adds
the messages: a Recv before an op whose input comes from another device, a Send
right after the op that makes what another device needs.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedir.errors import InvalidSchedule
from schedir.pipeline.ops import Bwd, Fwd, Recv, Send, Wgt
from schedir.pipeline.problem import PipelineProblem
from schedir.pipeline.schedule import ChunkPlan, PipelineSchedule

Chunk = tuple[int, int, str]
Order = list[tuple[str, int, int]]


def check_placement(problem: PipelineProblem, chunks: Sequence[Chunk]) -> tuple[Chunk, ...]:
    """``chunks`` as a tuple, or InvalidSchedule naming the first bad chunk."""
    chunks = tuple((int(a), int(b), str(u)) for a, b, u in chunks)
    pos = 0
    for c, (first, last, dev) in enumerate(chunks):
        if first != pos or last <= first:
            raise InvalidSchedule(f"chunk {c} = [{first}, {last}) on {dev}: chunks must be "
                                  f"consecutive and non-empty from stage {pos}")  # fmt: skip
        problem.platform.device(dev)
        pos = last
    if pos != problem.length:
        raise InvalidSchedule(f"chunks cover stages 0..{pos - 1}, not 0..{problem.length - 1}")
    return chunks


def balanced_cuts(
    problem: PipelineProblem,
    parts: int,
    devices: Sequence[str] | None = None,
    inflight: Sequence[int] | None = None,
) -> list[int]:
    """Cut points 0 = c_0 < ... < c_parts = L minimizing the largest part's training
    work (forward + backward, the loss in the last part); exact DP, O(L^2 parts).

    With ``devices`` (one device of the platform per part, in order) part q's work is
    divided by its device's speed, and a part that does not fit its device's memory is
    not cut: its weights, and ``inflight[q]`` micro-batches (default: all of them) of
    its store-all stash (its input and every stage's saved bytes, the target on the
    last part) must fit. InvalidSchedule when no cut fits."""
    L = problem.length
    if not 1 <= parts <= L:
        raise InvalidSchedule(f"cannot cut {L} stages into {parts} non-empty chunks")
    devs = [problem.platform.device(u) for u in devices] if devices is not None else None
    if devs is not None and len(devs) != parts:
        raise InvalidSchedule(f"devices: {len(devs)} given for {parts} parts")
    inflight = list(inflight) if inflight is not None else [problem.microbatches] * parts
    c, inf = problem.chain, float("inf")

    def cost(q: int, i: int, j: int) -> float:
        if devs is None:
            return problem.work(i, j)
        stash = c.in_size[i] + sum(c.saved_size[i:j]) + (problem.target_bytes if j == L else 0)
        held = sum(problem.weights[i:j]) + inflight[q] * stash
        if devs[q].memory is not None and held > devs[q].memory:
            return inf
        return problem.work(i, j) / devs[q].speed

    best = [[inf] * (L + 1) for _ in range(parts + 1)]
    arg = [[0] * (L + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for q in range(1, parts + 1):
        for j in range(q, L + 1):
            for i in range(q - 1, j):
                value = max(best[q - 1][i], cost(q - 1, i, j))
                if value < best[q][j]:
                    best[q][j], arg[q][j] = value, i
    if best[parts][L] == inf:
        raise InvalidSchedule(f"no cut of {L} stages into {parts} parts fits the devices' memory")
    cuts, j = [L], L
    for q in range(parts, 0, -1):
        j = arg[q][j]
        cuts.append(j)
    return cuts[::-1]


def place(cuts: Sequence[int], devices: Sequence[str], shape: str = "loop") -> tuple[Chunk, ...]:
    """Chunks [cuts[c], cuts[c+1]) on devices: ``"loop"`` puts chunk c on devices[c mod
    p] (1F1B with one chunk each, interleaved 1F1B with several), ``"v"`` on devices[c]
    then back (c >= p: devices[2p - 1 - c]; two chunks per device)."""
    p, n = len(devices), len(cuts) - 1
    if shape == "v":
        if n != 2 * p:
            raise InvalidSchedule(f"a V-shape needs 2 x {p} chunks, got {n}")
        owner = [devices[c] if c < p else devices[2 * p - 1 - c] for c in range(n)]
    elif shape == "loop":
        owner = [devices[c % p] for c in range(n)]
    else:
        raise InvalidSchedule(f"placement shape = {shape!r}: expected 'loop' or 'v'")
    return tuple((cuts[c], cuts[c + 1], owner[c]) for c in range(n))


def schedule_from_orders(
    problem: PipelineProblem,
    chunks: Sequence[Chunk],
    orders: dict[str, Order],
    meta: dict | None = None,
    recompute: Sequence[float] | None = None,
    footprints: Sequence[int | None] | None = None,
) -> PipelineSchedule:
    """The op lists of per-device ``orders`` on ``chunks`` (module docstring), with
    ``recompute[c]`` seconds on every backward of chunk c; one plan per chunk, holding
    ``footprints[c]`` bytes per micro-batch (None: its own accounting)."""
    chunks = check_placement(problem, chunks)
    C = len(chunks)
    rec = list(recompute) if recompute is not None else [0.0] * C
    fp = list(footprints) if footprints is not None else [None] * C
    lists = []
    for dev, order in orders.items():
        ops: list = []
        for kind, c, mb in order:
            first, last, owner = chunks[c]
            if owner != dev:
                raise InvalidSchedule(f"order of {dev}: chunk {c} is on {owner}")
            prev = chunks[c - 1][2] if c > 0 else None
            nxt = chunks[c + 1][2] if c + 1 < C else None
            if kind == "F":
                if prev not in (None, dev):
                    ops.append(Recv("a", first, mb, prev))
                ops.append(Fwd(first, last, mb))
                if nxt not in (None, dev):
                    ops.append(Send("a", last, mb, nxt))
            elif kind in ("B", "Bi"):
                if nxt not in (None, dev):
                    ops.append(Recv("d", last, mb, nxt))
                ops.append(Bwd(first, last, mb, rec[c], "full" if kind == "B" else "input"))
                if prev not in (None, dev):
                    ops.append(Send("d", first, mb, prev))
            elif kind == "W":
                ops.append(Wgt(first, last, mb))
            else:
                raise InvalidSchedule(f"order of {dev}: op kind {kind!r} (expected F, B, Bi, W)")
        lists.append((dev, tuple(ops)))
    plans = tuple(ChunkPlan(a, b, u, f) for (a, b, u), f in zip(chunks, fp, strict=True))
    return PipelineSchedule(tuple(lists), {"kind": "training", **(meta or {})}, plans=plans)

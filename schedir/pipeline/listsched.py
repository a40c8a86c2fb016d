"""Priority list scheduling of F / B / W ops on a placement, under per-device memory caps.

An event-driven greedy (the classic list scheduler; Qi et al. 2023 build their
zero-bubble heuristic the same way): whenever a device is idle it starts, among its
ops whose inputs are there, the first by ``priority`` (kinds in order, then oldest
micro-batch, then the chunk nearest the loss for backwards and nearest the input for
forwards). A forward starts only if the device's activation bytes (stashes from
forward start to backward end, weight-gradient data from the input part's end to
W's end, as :func:`schedir.pipeline.ops.effect` counts them) stay within its cap. Durations are
the effects' work over the device's speed; a message takes its link time, links
serve messages in the order they are produced. The result is an order per device
(:mod:`schedir.pipeline.placement`); the simulator judges the schedule built from it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from schedir.errors import InvalidSchedule
from schedir.pipeline.ops import Bwd, Fwd, Wgt, effect
from schedir.pipeline.placement import Chunk, Order, check_placement
from schedir.pipeline.problem import PipelineProblem, link_time


@dataclass(frozen=True)
class ListSchedule:
    """The orders of :func:`list_schedule` and ``cap_slack`` (bytes): the largest
    amount by which every cap may be lowered at once with the same orders coming out
    (every comparison of a device's bytes with its cap that passed still passes; inf
    without caps). Lowering the caps by more gives the next schedule of smaller
    memories: walking down these steps visits every schedule of every lower cap."""

    orders: dict[str, Order]
    cap_slack: float


def list_orders(problem: PipelineProblem, chunks: Sequence[Chunk], **options) -> dict[str, Order]:
    """The orders of :func:`list_schedule` (same arguments)."""
    return list_schedule(problem, chunks, **options).orders


def list_schedule(
    problem: PipelineProblem,
    chunks: Sequence[Chunk],
    *,
    split: bool = True,
    priority: Sequence[str] = ("B", "F", "W"),
    caps: dict[str, float] | None = None,
    footprint: Sequence[int | None] | None = None,
    held: Sequence[int | None] | None = None,
    recompute: Sequence[float] | None = None,
    cap_wgrad: bool = True,
    w_defer: dict[str, int] | None = None,
    messages: bool = False,
) -> ListSchedule:
    """Per-device orders of one training step of ``problem.microbatches`` micro-batches.

    ``split``: backwards as "Bi" + "W" (else full "B"). ``priority``: the kinds "B"
    (either backward), "F", "W" in the order a device prefers them. ``caps``: bytes of
    activations a device may hold (None or absent: no cap); a cap below one chunk's
    stash raises InvalidSchedule; ``cap_wgrad=False`` caps the stashes only (the
    weight-gradient data come on top). ``w_defer[u]``: once more weight gradients than
    this wait on device u, a W goes before forwards. A micro-batch's first forward on
    a device reserves the stashes of its later chunks there (so that a V-shape never
    starts a micro-batch it cannot finish). ``footprint[c]``: a per-micro-batch
    footprint of chunk c (its ``ChunkPlan.footprint``) and ``held[c]`` the part of it held
    between forward and backward (``ChunkPlan.held``: the caps count what is held, the
    rest being the running op's working set, which they do not), ``recompute[c]``:
    extra backward seconds. ``messages``: the caps also cover the messages between
    devices as the simulator counts them inside footprints: a received buffer from its
    sender's op end until its consumer starts, a sent gradient from its backward's end
    until its transfer ends;
    an op starts only if what it sends fits its receiver (credit-based flow control).
    With ``messages``, each device also keeps room for the gradients of its backward
    path (:func:`gradient_reserve`: one incoming gradient per chunk fed from another
    device, one outgoing gradient's own copy) that neither its forwards' stashes nor
    incoming activations may take: without it a device full of stashes could not
    receive the gradient that frees them (a deadlock whose occurrence depended on the
    cap's value, so that more memory could make list scheduling fail).
    """
    chunks = check_placement(problem, chunks)
    C, m = len(chunks), problem.microbatches
    caps = caps or {}
    fp = list(footprint) if footprint is not None else [None] * C
    kept = list(held) if held is not None else [None] * C
    rec = list(recompute) if recompute is not None else [0.0] * C
    devs = sorted({u for _, _, u in chunks}, key=[u for _, _, u in chunks].index)
    speed = {u: problem.platform.device(u).speed for u in devs}
    rank = {kind: k for k, kind in enumerate(priority)}
    bwd_kind = "Bi" if split else "B"
    slack = [math.inf]  # least margin of a passed comparison with a cap

    def fits(u: str, want: float) -> bool:
        cap = caps.get(u)
        if cap is None:
            return True
        if want > cap:
            return False
        slack[0] = min(slack[0], cap - want)
        return True

    def op_of(kind: str, c: int, n: int):
        first, last, _ = chunks[c]
        if kind == "F":
            return Fwd(first, last, n)
        if kind == "W":
            return Wgt(first, last, n)
        return Bwd(first, last, n, rec[c], "input" if kind == "Bi" else "full")

    dur, stash, hold = {}, {}, {}
    for c, (_, _, u) in enumerate(chunks):
        for kind in ("F", bwd_kind) + (("W",) if split else ()):
            eff = effect(
                problem, u, op_of(kind, c, 0), training=True, footprint=fp[c], held=kept[c]
            )
            dur[kind, c] = eff.work / speed[u]
            if kind == "F":
                stash[c] = sum(size for key, size in eff.allocs if key[1] == "s")
            if kind == "Bi":
                hold[c] = sum(size for key, size in eff.allocs_end if key[1] == "w")
                if not any(key[1] == "s" for key in eff.releases):  # the stash lives to W
                    hold[c] += stash[c]
    later = [sum(stash[k] for k in range(c + 1, C) if chunks[k][2] == chunks[c][2])
             for c in range(C)]  # fmt: skip
    reserved: set = set()  # (chunk, mb) whose stash an earlier forward reserved
    booked = dict.fromkeys(devs, 0.0)
    x = problem.chain.in_size
    grad_room = gradient_reserve(problem, chunks) if messages else dict.fromkeys(devs, 0)
    for u in devs:
        need = grad_room[u] + max(stash[c] + later[c] for c in range(C) if chunks[c][2] == u)
        if not fits(u, need):
            raise InvalidSchedule(f"list scheduling: device {u} caps activations at "
                                  f"{caps[u]} bytes, below one chunk's stash "
                                  f"and its gradients' room ({need})")  # fmt: skip

    arrive: dict[tuple, float] = {}  # (kind, c, mb) -> time its inputs are on its device
    link_free: dict[tuple, float] = {}
    done: set = set()
    pending = {u: set() for u in devs}  # ops whose inputs are known to arrive
    for n in range(m):
        arrive["F", 0, n] = 0.0
        pending[chunks[0][2]].add(("F", 0, n))
    act = dict.fromkeys(devs, 0.0)
    free_at = dict.fromkeys(devs, 0.0)
    running: dict[str, tuple] = {}
    orders: dict[str, Order] = {u: [] for u in devs}
    events: list[tuple[float, int, str]] = []  # (end time, seq, device)
    seq, now = 0, 0.0
    total = m * C * (3 if split else 2)
    inbox: dict[tuple, int] = {}  # op -> bytes of its received input, held until it starts
    timed: list[tuple[float, str, int]] = []  # (time, device, bytes freed then)

    def deliver(key: tuple, src: str, dst: str, ready: float, nbytes: int) -> None:
        if src == dst:
            arrive[key] = ready
        else:
            start = max(ready, link_free.get((src, dst), 0.0))
            link_free[src, dst] = start + link_time(problem, src, dst, nbytes)
            arrive[key] = link_free[src, dst]
            if messages:
                act[dst] += nbytes
                inbox[key] = nbytes
                if key[0] != "F":  # the sender's copy of a gradient, until sent
                    act[src] += nbytes
                    heapq.heappush(timed, (link_free[src, dst], src, nbytes))
        pending[dst].add(key)

    def sends_fit(kind: str, c: int) -> bool:
        """Whether the receiver (and, for a gradient, the sender) has room for it."""
        if not messages:
            return True
        first, last, u = chunks[c]
        if kind == "F" and c + 1 < C and chunks[c + 1][2] != u:
            # an activation may not take the room the receiver keeps for gradients
            v, size, own = chunks[c + 1][2], x[last] + grad_room[chunks[c + 1][2]], 0
        elif kind in ("B", "Bi") and c > 0 and chunks[c - 1][2] != u:
            v, size, own = chunks[c - 1][2], x[first], x[first]
        else:
            return True
        return fits(v, act[v] + size) and fits(u, act[u] + own)

    def finish(u: str, key: tuple, t: float) -> None:
        kind, c, n = key
        done.add(key)
        first, last, _ = chunks[c]
        if kind == "F":
            if c + 1 < C:
                deliver(("F", c + 1, n), u, chunks[c + 1][2], t, x[last])
            else:
                arrive[bwd_kind, c, n] = t
                pending[u].add((bwd_kind, c, n))
        elif kind in ("B", "Bi"):
            act[u] -= stash[c]
            if kind == "Bi":
                act[u] += hold[c] if cap_wgrad else 0
                arrive["W", c, n] = t
                pending[u].add(("W", c, n))
            if c > 0:
                deliver((bwd_kind, c - 1, n), u, chunks[c - 1][2], t, x[first])
        elif cap_wgrad:
            act[u] -= hold[c]

    defer = w_defer or {}

    def sort_key(key: tuple, u: str, waiting: int):
        kind, c, n = key
        group = rank["B" if kind in ("B", "Bi") else kind]
        if kind == "W" and u in defer and waiting > defer[u]:
            group = min(group, rank["F"] - 0.5)
        return (group, n, -c if kind in ("B", "Bi") else c)

    while len(done) < total:
        for u in devs:
            if u in running or free_at[u] > now:
                continue
            options = [k for k in pending[u] if arrive[k] <= now and _inputs_done(k, done)]
            waiting = sum(1 for k in options if k[0] == "W")
            options.sort(key=lambda k, u=u, w=waiting: sort_key(k, u, w))
            for key in options:
                kind, c, n = key
                if not sends_fit(kind, c):
                    continue
                if kind == "F" and (c, n) in reserved:
                    reserved.discard((c, n))
                    booked[u] -= stash[c]
                elif kind == "F":
                    want = act[u] + booked[u] + stash[c] + later[c] - inbox.get(key, 0)
                    want += grad_room[u]
                    if not fits(u, want):
                        continue
                    reserved.update((k, n) for k in range(c + 1, C) if chunks[k][2] == u)
                    booked[u] += later[c]
                if kind == "F":
                    act[u] += stash[c]
                act[u] -= inbox.pop(key, 0)
                pending[u].discard(key)
                orders[u].append((kind, c, n))
                end = now + dur[kind, c]
                running[u] = key
                seq += 1
                heapq.heappush(events, (end, seq, u))
                break
        waits = [arrive[k] for u in devs for k in pending[u] if arrive[k] > now]
        waits += [t for t, _, _ in timed if t > now]
        if not events and not waits:
            stuck = {u: sorted(pending[u])[:3] for u in devs if pending[u]}
            raise InvalidSchedule(f"list scheduling: no op can start (memory caps too small?) "
                                  f"at t={now:.6g}: {stuck}")  # fmt: skip
        now = min(([events[0][0]] if events else []) + waits)
        while timed and timed[0][0] <= now:
            _, u, size = heapq.heappop(timed)
            act[u] -= size
        while events and events[0][0] <= now:
            t, _, u = heapq.heappop(events)
            finish(u, running.pop(u), t)
            free_at[u] = t
    return ListSchedule(orders, slack[0])


def gradient_reserve(problem: PipelineProblem, chunks: Sequence[Chunk]) -> dict[str, int]:
    """Bytes each device keeps for its backward path's messages: an incoming gradient
    d_last for each of its chunks whose successor is on another device, and the own
    copy of the largest gradient d_first it sends. With one chunk per device (a loop
    placement) this guarantees progress: the oldest micro-batch's gradient always fits
    its receiver, whose backward then sends its own (by induction down to the first
    chunk, which sends nothing)."""
    x = problem.chain.in_size
    into: dict[str, int] = {}
    out: dict[str, int] = {}
    for c, (first, last, u) in enumerate(chunks):
        if c + 1 < len(chunks) and chunks[c + 1][2] != u:
            into[u] = into.get(u, 0) + x[last]
        if c > 0 and chunks[c - 1][2] != u:
            out[u] = max(out.get(u, 0), x[first])
    return {u: into.get(u, 0) + out.get(u, 0) for _, _, u in chunks}


def _inputs_done(key: tuple, done: set) -> bool:
    """A W needs its input part done; F and backwards are pending only once fed."""
    kind, c, n = key
    return kind != "W" or ("Bi", c, n) in done

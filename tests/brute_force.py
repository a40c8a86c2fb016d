"""Exhaustive search over persistent chain schedules, for cross-checking exact solvers.

Written from the op table of docs/semantics.md, independently of schedir.simulate.
Dijkstra over states
(resident buffers, backwards done, buffer produced by the previous op) with time as
the distance; an op is allowed only if the memory it needs fits the budget.

Persistence (rotor's notion): a stored buffer is only freed by the backward that
consumes it. The only other removal, ``F_n(k)`` dropping its input, is therefore
allowed only right after the op that produced that input (the running state of a
forward sweep, never a stored checkpoint).
"""

from __future__ import annotations

import heapq
import itertools
import math


def brute_force_optimum(chain, budget: int) -> float:
    """Least makespan of a persistent schedule within ``budget``; inf if none."""
    L = chain.length
    x = list(chain.in_size) + [0]
    s = chain.saved_size

    def size(buf):
        kind, k = buf
        return s[k - 1] if kind == "abar" else x[k]

    def total(res):
        return sum(size(b) for b in res)

    start = (frozenset({("a", 0)}), 0, None)  # next backward index counts down from L
    # progress p: number of backwards done (Loss first, then B(L-1), ..., B(0)).
    if x[0] > budget:
        return math.inf
    counter = itertools.count()
    heap = [(0.0, next(counter), start)]
    best = {start: 0.0}
    while heap:
        time, _, state = heapq.heappop(heap)
        if time > best.get(state, math.inf):
            continue
        res, done, last = state
        if done == L + 1:
            return time
        for op, k in _candidate_ops(L, done):
            new = _apply(op, k, res, last, L, done, size, chain)
            if new is None:
                continue
            new_res, need, cost, produced = new
            if need > budget:
                continue
            new_state = (new_res, done + (op in ("Loss", "B")), produced)
            t2 = time + cost
            if t2 < best.get(new_state, math.inf):
                best[new_state] = t2
                heapq.heappush(heap, (t2, next(counter), new_state))
    return math.inf


def _candidate_ops(L, done):
    for k in range(L):
        for op in ("F_ck", "F_n", "F_all"):
            yield op, k
    if done == 0:
        yield "Loss", L
    elif done <= L:
        yield "B", L - done


def _apply(op, k, res, last, L, done, size, chain):
    res = set(res)
    if op == "B":
        if ("d", k + 1) not in res or ("abar", k + 1) not in res:
            return None
    src = ("a", k) if ("a", k) in res else ("abar", k) if ("abar", k) in res else None
    if src is None:
        return None
    out = {"F_ck": ("a", k + 1), "F_n": ("a", k + 1), "F_all": ("abar", k + 1)}.get(op, ("d", k))
    if out in res:
        return None
    if op == "F_n" and src != last:
        return None  # persistence: only the running state may be dropped
    res.add(out)
    need = sum(size(b) for b in res)
    if op in ("F_ck", "F_n", "F_all"):
        need += chain.fwd_tmp[k]
        cost = chain.fwd_time[k]
        if op == "F_n":
            res.discard(src)
    elif op == "Loss":
        need += chain.bwd_tmp[L]
        cost = chain.fwd_time[L] + chain.bwd_time[L]
        if src[0] == "a":
            res.discard(src)
    else:
        need += chain.bwd_tmp[k]
        cost = chain.bwd_time[k]
        if src[0] == "a":
            res.discard(src)
        res.discard(("d", k + 1))
        res.discard(("abar", k + 1))
    return frozenset(res), need, cost, out

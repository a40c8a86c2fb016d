"""Persistent chain schedules as trees: emit their ops, or cost them without emitting.

A persistent schedule for stages i..t (starting from the input of stage i, a[i] or
abar[i], with d[t+1] resident; ending with d[i]) is one of three moves, recursively
(docs/chain_solvers.md):

- ``i == t``: the base case, ``F_all(i) B(i)`` (or ``Loss()`` for the loss stage);
- *record*: ``F_all(i)``, then stages i+1..t, then ``B(i)``;
- *split at j* (i < j <= t): a forward segment ``F_ck(i) F_n(i+1) ... F_n(j-1)`` (the
  input of i stays, a[j] is the new checkpoint), then stages j..t, then stages i..j-1.
  With ``record_first`` the segment starts with ``F_all(i)`` instead, and ``F_n(i+1)``
  drops abar[i+1]: the same time, and less memory when s_i < x_{i+1} (j >= i + 2).

Every chain solver of this package chooses moves; :func:`tree_ops` turns the choices
into ops and :class:`TreeCost` gives the makespan and peak of the same schedule in
O(nodes), without ops or simulator (tests check it against ``schedir.simulate``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from schedir import B, Chain, F_all, F_ck, F_n, Loss


class Record(NamedTuple):
    """Record stage i; ``state`` goes to the solve of stages i+1..t."""

    state: Any = None


class Split(NamedTuple):
    """Split at j; ``right`` is the state of stages j..t, ``left`` of stages i..j-1."""

    j: int
    right: Any = None
    left: Any = None
    record_first: bool = False


# choose(i, t, state) -> the move for stages i..t (i < t).
Chooser = Callable[[int, int, Any], Record | Split]


def record_first(chain: Chain, i: int, j: int) -> bool:
    """Whether the forward segment of a split of i at j starts with F_all(i): when
    abar[i+1] is smaller than a[i+1] and F_n(i+1) follows to drop it."""
    return j >= i + 2 and chain.saved_size[i] < chain.in_size[i + 1]


def segment_ops(i: int, j: int, first_all: bool = False) -> list:
    """The forward segment of a split of i at j."""
    return [F_all(i) if first_all else F_ck(i)] + [F_n(k) for k in range(i + 1, j)]


def tree_ops(L: int, choose: Chooser, state: Any = None) -> tuple:
    """Ops of the persistent schedule of stages 0..L whose moves ``choose`` picks."""
    ops: list = []
    stack: list = [("solve", 0, L, state)]
    while stack:
        item = stack.pop()
        if item[0] == "emit":
            ops.append(item[1])
            continue
        _, i, t, st = item
        if i == t:
            ops.extend([Loss()] if i == L else [F_all(i), B(i)])
            continue
        move = choose(i, t, st)
        if isinstance(move, Record):
            ops.append(F_all(i))
            stack.append(("emit", B(i)))
            stack.append(("solve", i + 1, t, move.state))
        else:
            j, right, left, first_all = move
            if not i < j <= t:
                raise AssertionError(f"split at {j} outside ({i}, {t}]")
            ops.extend(segment_ops(i, j, first_all))
            stack.append(("solve", i, j - 1, left))  # runs after stages j..t
            stack.append(("solve", j, t, right))
    return tuple(ops)


class _RangeMax:
    """max(values[a:b]) in O(1) after O(n log n) preprocessing (a sparse table)."""

    def __init__(self, values: np.ndarray):
        self.levels = [np.asarray(values, dtype=np.int64)]
        width = 1
        while 2 * width <= len(values):
            prev = self.levels[-1]
            self.levels.append(np.maximum(prev[:-width], prev[width:]))
            width *= 2

    def __call__(self, a: int, b: int) -> int:
        if b <= a:
            return -1
        k = (b - a).bit_length() - 1
        level = self.levels[k]
        return int(max(level[a], level[b - (1 << k)]))


class TreeCost:
    """(makespan seconds, peak bytes) of the schedules :func:`tree_ops` would emit.

    The same rules as the simulator (docs/semantics.md), node by node: the memory a
    sub-chain i..t needs besides its input is the max over its ops, computed from its
    children's needs (an explicit stack: no recursion limit). Built once per chain;
    ``memo`` (a dict) caches sub-trees by (i, t, state) across calls, for choosers
    whose state determines the sub-tree.
    """

    def __init__(self, chain: Chain):
        L = chain.length
        self.chain, self.L = chain, L
        self.x = x = chain.in_size + (0,)
        s, ftmp, btmp = chain.saved_size, chain.fwd_tmp, chain.bwd_tmp
        self.pairs = _RangeMax(np.asarray([x[k] + x[k + 1] + ftmp[k] for k in range(L + 1)]))
        self.prefix = [0.0, *np.cumsum(chain.fwd_time).tolist()]
        self.op_time = [chain.fwd_time[k] + chain.bwd_time[k] for k in range(L + 1)]
        # B(i) (the loss: d_L and its temporary), and the leaf F_all(i) B(i)
        self.backward = [x[i] + x[i + 1] + s[i] + btmp[i] for i in range(L)] + [x[L] + btmp[L]]
        self.leaf = [max(x[i + 1] + s[i] + ftmp[i], self.backward[i]) for i in range(L)]
        self.leaf.append(self.backward[L])

    def _segment(self, i: int, j: int, t: int, first_all: bool) -> int:
        c, x = self.chain, self.x
        first = c.saved_size[i] if first_all else x[i + 1]
        need = first + c.fwd_tmp[i]
        if j >= i + 2:
            need = max(need, first + x[i + 2] + c.fwd_tmp[i + 1], self.pairs(i + 2, j))
        return x[t + 1] + need

    def __call__(self, choose: Chooser, state: Any = None, memo: dict | None = None):
        c, x, prefix = self.chain, self.x, self.prefix
        done: list[tuple[float, int]] = []  # (time, need) of solved sub-chains, in order
        stack: list = [("solve", 0, self.L, state)]
        while stack:
            item = stack.pop()
            if item[0] == "solve":
                _, i, t, st = item
                if i == t:
                    done.append((self.op_time[i], self.leaf[i]))
                    continue
                key = (i, t, st)
                if memo is not None and key in memo:
                    done.append(memo[key])
                    continue
                move = choose(i, t, st)
                if isinstance(move, Record):
                    own = max(x[t + 1] + c.saved_size[i] + c.fwd_tmp[i], self.backward[i])
                    stack.append(("record", key, self.op_time[i], own, c.saved_size[i]))
                    stack.append(("solve", i + 1, t, move.state))
                else:
                    j, right, left, first_all = move
                    if not i < j <= t:
                        raise AssertionError(f"split at {j} outside ({i}, {t}]")
                    own = self._segment(i, j, t, first_all)
                    stack.append(("split", key, prefix[j] - prefix[i], own, x[j]))
                    stack.append(("solve", i, j - 1, left))
                    stack.append(("solve", j, t, right))
                continue
            kind, key, time, own, held = item
            if kind == "record":
                child_time, child = done.pop()
                result = (time + child_time, max(own, held + child))
            else:  # split: done ends with [.., right, left]
                left_time, left = done.pop()
                right_time, right = done.pop()
                result = (time + right_time + left_time, max(own, held + right, left))
            if memo is not None:
                memo[key] = result
            done.append(result)
        ((time, root),) = done
        return time, x[0] + root

    def fits(self, choose: Chooser, state: Any, budget: int) -> bool:
        """Whether the peak is at most ``budget``; stops at the first op that exceeds it
        (the rightmost path, where checkpoints pile up, is visited first)."""
        c, x = self.chain, self.x
        room = budget - x[0]  # bytes for everything but a_0
        stack: list = [(0, self.L, state, 0)]  # (i, t, state, bytes held by ancestors)
        while stack:
            i, t, st, held = stack.pop()
            if i == t:
                if held + self.leaf[i] > room:
                    return False
                continue
            move = choose(i, t, st)
            if isinstance(move, Record):
                own = max(x[t + 1] + c.saved_size[i] + c.fwd_tmp[i], self.backward[i])
                if held + own > room:
                    return False
                stack.append((i + 1, t, move.state, held + c.saved_size[i]))
            else:
                j, right, left, first_all = move
                if held + self._segment(i, j, t, first_all) > room:
                    return False
                stack.append((i, j - 1, left, held))
                stack.append((j, t, right, held + x[j]))
        return room >= 0


def tree_cost(chain: Chain, choose: Chooser, state: Any = None) -> tuple[float, int]:
    """(makespan seconds, peak bytes) of ``tree_ops(chain.length, choose, state)``."""
    return TreeCost(chain)(choose, state)

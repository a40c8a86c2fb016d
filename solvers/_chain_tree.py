"""Emit chain ops from a persistent schedule's tree structure (docs/chain_solvers.md).

A persistent chain schedule for stages i..t (starting from a_i, ending with d_i) is one
of three moves, recursively:

- ``i == t``: the base case, ``F_all(i) B(i)`` (or ``Loss()`` for the loss stage);
- *record*: ``F_all(i)``, then stages i+1..t, then ``B(i)``;
- *split at j* (i < j <= t): ``F_ck(i) F_n(i+1) ... F_n(j-1)`` (a_i stays, a_j is the
  new checkpoint), then stages j..t, then stages i..j-1.

Every chain solver of this package (the DP and the baselines) chooses moves; this
module turns the choices into ops with an explicit stack (no recursion limit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from schedir import B, F_all, F_ck, F_n, Loss


class Record(NamedTuple):
    """Record stage i; ``state`` goes to the solve of stages i+1..t."""

    state: Any = None


class Split(NamedTuple):
    """Split at j; ``right`` is the state of stages j..t, ``left`` of stages i..j-1."""

    j: int
    right: Any = None
    left: Any = None


# choose(i, t, state) -> the move for stages i..t (i < t).
Chooser = Callable[[int, int, Any], Record | Split]


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
            j, right, left = move
            if not i < j <= t:
                raise AssertionError(f"split at {j} outside ({i}, {t}]")
            ops.append(F_ck(i))
            ops.extend(F_n(k) for k in range(i + 1, j))
            stack.append(("solve", i, j - 1, left))  # runs after stages j..t
            stack.append(("solve", j, t, right))
    return tuple(ops)

"""Chain schedules as trees (docs/jax_exec.md), and the checks every executor runs first.

A tree-shaped op sequence for stages i..t (a_i resident, d_{t+1} resident unless t = L)
is one of:

- nothing, when i = t + 1;
- ``Loss()``, when i = t = L;
- ``F_all(i)``, the sequence for i+1..t, ``B(i)``: :class:`Record` (stage i saves
  its residuals);
- ``F_ck(i) F_n(i+1) .. F_n(j-1)`` with j <= t, the sequence for j..t, then the
  sequence for i..j-1: :class:`Segment` (stages i..j-1 run under ``jax.checkpoint``,
  their backward recomputes them with the inner structure).

Every schedule of the exact DP has this shape; so do revolve's, Chen's and
store-all's. Other valid sequences (e.g. one consuming an ``abar`` with ``F_n``) are
rejected with the index of the first op that does not fit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from schedir import B, Chain, F_all, F_ck, F_n, InvalidSchedule, Loss, Schedule, simulate_chain
from schedir.offload.ops import Offload, Prefetch, Wait, is_compute
from schedir.schedule import as_ops


@dataclass(frozen=True)
class Empty:
    """No work: the stages i..t are empty (i = t + 1)."""


@dataclass(frozen=True)
class LossNode:
    """The loss and its gradient."""


@dataclass(frozen=True)
class Record:
    """Stage ``index`` runs recording its residuals, then ``rest`` (stages index+1..t)."""

    index: int
    rest: Node


@dataclass(frozen=True)
class Segment:
    """Stages ``start``..``stop``-1 run under ``jax.checkpoint``.

    ``after`` handles stages stop..t from a_stop; ``inside`` is the structure of the
    recomputation of start..stop-1 during the backward.
    """

    start: int
    stop: int
    after: Node
    inside: Node


Node = Empty | LossNode | Record | Segment


def check_schedule(schedule: Schedule | Iterable, length: int) -> tuple:
    """Validate a chain schedule for a model of ``length`` stages; return its ops.

    Raises :class:`schedir.InvalidSchedule` when the schedule was made for another chain
    length, or when it cannot run (the simulator's message, naming the op).
    """
    ops = as_ops(schedule)
    indices = [op.index for op in ops if not isinstance(op, Loss)]
    backwards = [op.index for op in ops if isinstance(op, B)]
    made_for = max(backwards, default=-1) + 1
    if (indices and max(indices) >= length) or made_for != length:
        made_for = max(made_for, max(indices, default=-1) + 1)
        raise InvalidSchedule(
            f"the schedule is for a chain of {made_for} stages, but the model has {length} layers"
        )
    simulate_chain(unit_chain(length), ops)
    return ops


def unit_chain(length: int) -> Chain:
    """A chain of ``length`` stages with unit sizes: enough to check ops and name buffers."""
    return Chain(
        fwd_time=(0.0,) * (length + 1),
        bwd_time=(0.0,) * (length + 1),
        in_size=(1,) * (length + 1),
        saved_size=(1,) * length + (0,),
        fwd_tmp=(0,) * (length + 1),
        bwd_tmp=(0,) * (length + 1),
    )


def parse_tree(schedule: Schedule | Iterable, length: int) -> Node:
    """The tree of a valid, tree-shaped schedule for ``length`` stages (see module doc)."""
    ops = check_schedule(schedule, length)
    pos = 0

    def fail(why: str) -> InvalidSchedule:
        at = f"op {pos}: {ops[pos]}" if pos < len(ops) else f"op {pos} (after the last op)"
        return InvalidSchedule(
            f"{at}: not tree-shaped, {why}; the compiled path lowers only schedules "
            f"made of F_all/B pairs and F_ck..F_n segments (use jax_exec.run instead)"
        )

    def expect(op) -> None:
        nonlocal pos
        if pos >= len(ops) or ops[pos] != op:
            raise fail(f"expected {op}")
        pos += 1

    def parse(i: int, t: int) -> Node:
        nonlocal pos
        if i == t + 1:
            return Empty()
        if pos >= len(ops):
            raise fail(f"stages {i}..{t} are not done")
        op = ops[pos]
        if i == length:
            expect(Loss())
            return LossNode()
        if op == F_all(i):
            pos += 1
            rest = parse(i + 1, t)
            expect(B(i))
            return Record(i, rest)
        if op == F_ck(i):
            pos += 1
            j = i + 1
            while pos < len(ops) and ops[pos] == F_n(j):
                pos += 1
                j += 1
            if j > t:
                raise fail(f"the forward from a[{i}] runs past stage {t}")
            after = parse(j, t)
            inside = parse(i, j - 1)
            return Segment(i, j, after, inside)
        raise fail(f"expected F_all({i}) or F_ck({i}) (stages {i}..{t} with a[{i}] at hand)")

    tree = parse(0, length)
    if pos != len(ops):
        raise fail("ops remain after the backward of stage 0")
    return tree


def node_ops(node: Node) -> int:
    """Number of chain ops of a subtree (where each node starts in the op sequence)."""
    if isinstance(node, Empty):
        return 0
    if isinstance(node, LossNode):
        return 1
    if isinstance(node, Record):
        return 2 + node_ops(node.rest)
    return (node.stop - node.start) + node_ops(node.after) + node_ops(node.inside)


def split_copies(ops: Iterable) -> tuple[tuple, frozenset[int]]:
    """``(chain ops, offloaded)``: the compute ops of a schedule with copy ops, and the
    positions among them of the ops right after an ``Offload``: the tree nodes whose
    input buffer lives in host memory between its forward and its backward (what the
    offload solvers emit: ``Offload(in)`` right before a sub-chain's first forward, its
    ``Prefetch`` before the sub-chain's last backward; docs/offload.md)."""
    chain_ops, offloaded, pending = [], set(), False
    for op in ops:
        if isinstance(op, Offload):
            pending = True
        elif is_compute(op):
            if pending:
                offloaded.add(len(chain_ops))
            chain_ops.append(op)
            pending = False
        elif not isinstance(op, Prefetch | Wait):
            raise InvalidSchedule(f"{op!r}: the compiled path lowers activation offload only")
    return tuple(chain_ops), frozenset(offloaded)

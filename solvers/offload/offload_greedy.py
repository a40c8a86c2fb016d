"""``offload_greedy``: offload where the transfers hide under compute, remat for the rest.

A one-step-lookahead greedy on the schedule tree of :mod:`solvers.rotor_offload`'s model
(Beaumont, Eyraud-Dubois, Shilova, NeurIPS 2021 for the setting). One rotor table
(recomputation only, docs/chain_solvers.md, tight model) values every sub-chain. Top-down, at
each sub-chain (i, t) with m bytes, the greedy compares rotor's moves with the moves
that offload the sub-chain's input *only when the transfers are hidden*: the offload
takes at most the forward compute it overlaps (``F_all(i)``, or the forward segment
``F_ck(i) .. F_n(j-1)``) and the prefetch at most the backward op it overlaps. Each
candidate is valued as its own cost plus rotor's values of its sub-chains (i.e.
"offload here, remat below"); the best is taken and the sub-chains are solved the
same way with the memory the choice leaves them. Cost: one rotor table plus
O(L^2) candidate evaluations per budget. By induction the result is never slower
than rotor (rotor's own move is always a candidate, valued at rotor's optimum).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from schedir import OffloadProblem, OffloadSchedule
from solvers.offload.rotor_offload import (
    INF,
    Model,
    build_table,
    check_budget,
    emit,
    host_fits,
    slot_for,
)
from solvers.registry import Infeasible, register


def greedy_ops(
    problem: OffloadProblem, budget: int, slot: int = 1, progress=None
) -> tuple[tuple, tuple]:
    """(greedy ops, rotor's ops) at ``budget`` bytes; Infeasible if rotor has none (its
    ``min_budget`` is exact: the greedy succeeds wherever rotor's table does)."""
    plain = replace(problem, platform=problem.platform.with_bandwidth(0.0))
    table = build_table(plain, slot, progress=progress)  # rotor's values (no offload moves)
    if not math.isfinite(table.value(budget)):
        raise Infeasible("offload_greedy", budget, table.min_budget())
    model = Model.of(problem, slot, greedy=True)

    def choose(i: int, t: int, kind: int, m: int):
        best, move = INF, None
        for label, values in model.candidates(
            table.tables, table.right_cols, i, t, kind, np.array([m])
        ):
            flat = values.reshape(-1)
            k = int(np.argmin(flat))
            if flat[k] < best:
                best = flat[k]
                move = (label[0], i + 1 + k) if label[0].startswith("split") else (label[0], None)
        return move

    return emit(model, choose, table.memory(budget), table.width), table.ops(budget)


@register(
    "offload_greedy",
    problem=OffloadProblem,
    exact=False,
    description="offload where transfers hide under compute, rotor remat for the rest",
)
def offload_greedy(
    problem: OffloadProblem,
    budget: int,
    *,
    max_units: int = 3000,
    slots: int = 500,
    progress=None,
) -> OffloadSchedule:
    """Greedy remat + offload schedule (module doc) under ``budget`` device bytes; if the
    host cannot hold its offloads, rotor's schedule (``meta["fallback"] = "rotor"``)."""
    budget = check_budget(problem, budget)
    slot, _ = slot_for(problem, max_units, slots)
    ops, plain = greedy_ops(problem, budget, slot, progress)
    meta = {"slot_size": slot, "exact": False}
    note = host_fits(problem, ops)
    if note is not None:
        ops = plain
        meta.update(fallback="rotor", note=note)
    return OffloadSchedule(ops, meta)

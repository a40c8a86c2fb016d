"""Brute force over interval mappings (tests and tiny instances): every split of the
chain into intervals, every assignment of devices, scored by the model of
docs/pipelines.md (:func:`schedir.steady.evaluate`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from schedir.pipeline.problem import Interval, Mapping, PipelineProblem
from schedir.steady import evaluate


def compositions(length: int, parts: int | None = None) -> Iterator[tuple[int, ...]]:
    """Cut points (0, c1, ..., L) of every split of 0..L into consecutive intervals."""
    for n in range(1, length + 1) if parts is None else (parts,):
        for cuts in itertools.combinations(range(1, length), n - 1):
            yield (0, *cuts, length)


def all_mappings(problem: PipelineProblem, replicate: bool = True) -> Iterator[Mapping]:
    """Every interval mapping (device sets as sorted tuples); exponential, for tests."""
    names = [d.name for d in problem.platform.devices]
    P = len(names)
    for cuts in compositions(problem.length):
        n = len(cuts) - 1
        if n > P:
            continue
        # assign each device to one of the n intervals or to none (label n)
        for labels in itertools.product(range(n + 1), repeat=P):
            groups = [tuple(names[u] for u in range(P) if labels[u] == g) for g in range(n)]
            if any(not g for g in groups) or (not replicate and any(len(g) > 1 for g in groups)):
                continue
            yield Mapping(tuple(Interval(cuts[g], cuts[g + 1], groups[g]) for g in range(n)))


def exhaustive(
    problem: PipelineProblem, replicate: bool = True, pairs: str = "all", budget: int | None = None
) -> tuple[float, Mapping | None]:
    """Least period over every interval mapping that fits memory (brute force)."""
    best, arg = math.inf, None
    for m in all_mappings(problem, replicate):
        rep = evaluate(problem, m, pairs, budget)
        if rep.fits and rep.period < best - 1e-15:
            best, arg = rep.period, m
    return best, arg

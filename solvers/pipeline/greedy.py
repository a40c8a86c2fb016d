"""Fast heuristic for interval mapping on heterogeneous platforms (``"pipeline_greedy"``).

Bisection on the target period T. For a given T, intervals are built left to right:
the next interval takes the r fastest unused devices, with the least r for which at
least one more stage fits (compute max_u W / speed_u / r <= T, memory, and the link
term with the previous interval <= T), and then as many stages as fit. T is feasible
if the chain is covered. The best mapping found is then improved by giving leftover
devices, one at a time, to the bottleneck interval while that lowers the period, and
by a first-improvement local search (shift a cut; move, swap, add or drop a device;
merge neighbours; split an interval onto an unused device), which also starts from
the whole chain replicated on every device and from the fastest device alone.
Two device orders are tried (fastest first, and the platform's order, which follows
the links of a chain-like topology); the better mapping is returned. O(iterations
x L x P) evaluations; in the spirit of the heuristics of Benoit and Robert (JPDC 2008).
"""

from __future__ import annotations

import math

from schedir.pipeline.problem import Interval, Mapping, PipelineProblem, capacity
from schedir.steady import boundary_period, evaluate, mapping_memory
from solvers.pipeline.dp import mapping_schedule, require_inference
from solvers.registry import Infeasible, register


def _build(problem: PipelineProblem, order: list, T: float, budget=None) -> Mapping | None:
    L = problem.length
    plat = problem.platform
    pos, free, ivs = 0, list(order), []
    while pos < L:
        placed = None
        for r in range(1, len(free) + 1):
            group = tuple(free[:r])
            speed = min(plat.device(u).speed for u in group)
            caps = [capacity(problem, u, budget) for u in group]
            best_j = None
            for j in range(pos + 1, L + 1):
                if problem.work(pos, j) / speed / r > T * (1 + 1e-12):
                    break
                # its memory if the next interval has one replica (checked again at the end)
                need = mapping_memory(problem, [*ivs, Interval(pos, j, group)], 1)[-1]
                if any(c is not None and need > c for c in caps):
                    continue
                best_j = j
            if best_j is None:
                continue
            if ivs and boundary_period(problem, pos, ivs[-1].devices, group)[0] > T * (1 + 1e-12):
                continue
            placed = Interval(pos, best_j, group)
            break
        if placed is None:
            return None
        ivs.append(placed)
        free = free[len(placed.devices) :]
        pos = placed.last
    mapping = Mapping(tuple(ivs))
    return mapping if evaluate(problem, mapping, budget=budget).fits else None


def _improve(problem: PipelineProblem, mapping: Mapping, budget=None) -> Mapping:
    used = {u for iv in mapping.intervals for u in iv.devices}
    left = sorted(
        (d for d in problem.platform.devices if d.name not in used), key=lambda d: -d.speed
    )
    best = evaluate(problem, mapping, budget=budget)
    for dev in left:
        rep = best
        worst = max(range(len(rep.compute)), key=lambda g: rep.compute[g])
        ivs = list(mapping.intervals)
        iv = ivs[worst]
        ivs[worst] = Interval(iv.first, iv.last, (*iv.devices, dev.name))
        cand = Mapping(tuple(ivs))
        new = evaluate(problem, cand, budget=budget)
        if new.fits and new.period < best.period:
            mapping, best = cand, new
    return mapping


def _score(problem: PipelineProblem, mapping: Mapping, budget=None) -> tuple[float, float]:
    """(memory excess in bytes, period): lexicographic, so feasibility comes first."""
    rep = evaluate(problem, mapping, budget=budget)
    over = sum(
        max(0, need - cap)
        for u, need in rep.memory.items()
        if (cap := capacity(problem, u, budget)) is not None
    )
    return float(over), rep.period


def _neighbors(problem: PipelineProblem, mapping: Mapping):
    """Mappings one move away: shift a cut, move / swap / add / drop a device,
    merge two neighbours, split an interval with an unused device."""
    ivs = [(iv.first, iv.last, list(iv.devices)) for iv in mapping.intervals]
    used = {u for _, _, d in ivs for u in d}
    free = [d.name for d in problem.platform.devices if d.name not in used]

    def make(parts) -> Mapping:
        return Mapping(tuple(Interval(a, b, tuple(d)) for a, b, d in parts))

    for g in range(len(ivs) - 1):
        for delta in (-1, 1):
            cut = ivs[g][1] + delta
            if ivs[g][0] < cut < ivs[g + 1][1]:
                new = [list(x) for x in ivs]
                new[g][1] = new[g + 1][0] = cut
                yield make(new)
        merged = ivs[:g] + [(ivs[g][0], ivs[g + 1][1], ivs[g][2] + ivs[g + 1][2])] + ivs[g + 2 :]
        yield make(merged)
    for g, (a, b, d) in enumerate(ivs):
        for u in free:
            yield make(ivs[:g] + [(a, b, [*d, u])] + ivs[g + 1 :])
            for v in d:
                yield make(ivs[:g] + [(a, b, [w if w != v else u for w in d])] + ivs[g + 1 :])
            for cut in range(a + 1, b):
                yield make(ivs[:g] + [(a, cut, d), (cut, b, [u])] + ivs[g + 1 :])
                yield make(ivs[:g] + [(a, cut, [u]), (cut, b, d)] + ivs[g + 1 :])
        if len(d) > 1:
            for v in d:
                yield make(ivs[:g] + [(a, b, [w for w in d if w != v])] + ivs[g + 1 :])
        for h in range(g + 1, len(ivs)):
            for u in d:
                for v in ivs[h][2]:
                    new = [(x, y, list(z)) for x, y, z in ivs]
                    new[g][2][new[g][2].index(u)] = v
                    new[h][2][new[h][2].index(v)] = u
                    yield make(new)


def local_search(
    problem: PipelineProblem, mapping: Mapping, rounds: int = 200, budget: int | None = None
) -> Mapping:
    """First-improvement hill climbing on :func:`_neighbors`."""
    best = _score(problem, mapping, budget)
    for _ in range(rounds):
        for cand in _neighbors(problem, mapping):
            sc = _score(problem, cand, budget)
            if sc < best and (sc[0] < best[0] or sc[1] < best[1] * (1 - 1e-12)):
                mapping, best = cand, sc
                break
        else:
            break
    return mapping


def greedy_mapping(
    problem: PipelineProblem, iterations: int = 50, budget: int | None = None
) -> tuple[float, Mapping]:
    """(period, mapping) of the heuristic; raises Infeasible if nothing was found."""
    devs = problem.platform.devices
    orders = [[d.name for d in sorted(devs, key=lambda d: -d.speed)], [d.name for d in devs]]
    total = problem.work(0, problem.length)
    best: tuple[float, Mapping | None] = (math.inf, None)
    for order in orders:
        lo, hi = total / sum(d.speed for d in devs) / 2, None
        T = total / min(d.speed for d in devs)
        found = None
        for _ in range(8):  # find a feasible upper bound
            found = _build(problem, order, T, budget)
            if found is not None:
                hi = T
                break
            T *= 4
        if found is None:  # start the local search from everything on one device
            found = Mapping((Interval(0, problem.length, (order[0],)),))
            found = local_search(problem, found, budget=budget)
            rep = evaluate(problem, found, budget=budget)
            if rep.fits and rep.period < best[0]:
                best = (rep.period, found)
            continue
        for _ in range(iterations):
            mid = (lo + hi) / 2
            m = _build(problem, order, mid, budget)
            if m is None:
                lo = mid
            else:
                hi, found = mid, m
        found = local_search(problem, _improve(problem, found, budget), budget=budget)
        rep = evaluate(problem, found, budget=budget)
        if rep.fits and rep.period < best[0]:
            best = (rep.period, found)
    # two more starting points for the local search: the whole chain replicated on
    # every device (data parallel), and on the fastest device alone
    fastest = max(devs, key=lambda d: d.speed).name
    for start in (tuple(d.name for d in devs), (fastest,)):
        start_at = Mapping((Interval(0, problem.length, start),))
        found = local_search(problem, start_at, budget=budget)
        rep = evaluate(problem, found, budget=budget)
        if rep.fits and rep.period < best[0]:
            best = (rep.period, found)
    if best[1] is None:
        raise Infeasible("pipeline_greedy", budget, None, "found no mapping that fits memory")
    return best[0], best[1]


@register(
    "pipeline_greedy",
    problem=PipelineProblem,
    exact=False,
    description="bisection on the period, greedy interval building, leftover replication",
)
def pipeline_greedy(problem: PipelineProblem, budget: int | None = None, *, iterations: int = 50):
    """``budget`` (bytes, optional) bounds every device besides its own memory."""
    require_inference(problem, "pipeline_greedy")
    period, mapping = greedy_mapping(problem, iterations, budget)
    return mapping_schedule(problem, mapping, "pipeline_greedy", exact=False)

"""The joint planner of training pipelines (``"pipeline_joint"``): partition, F/B/W
schedule, and each chunk's rematerialization or activation offload, for throughput.

Given a training :class:`PipelineProblem` (a profiled chain, a platform, device
memories; optionally ``budget`` bytes bounding every device), it searches:

- a *pattern*: the order of F / B / W on every device (1F1B, ZB-H1, ZB-H2, the V-shape;
  :mod:`schedir.pipeline.baselines`), or list scheduling under the devices' memory
  (:mod:`schedir.pipeline.listsched`);
- a device order (the platform's, and by decreasing memory and by speed);
- the cuts: a DP over prefixes minimizing the slowest chunk (one chunk per device;
  the V-shape starts from balanced cuts), each chunk's time being its plan's under the
  bytes per micro-batch its device can give it, then a local search moving one cut at
  a time judged by the simulator;
- per chunk the fastest :class:`~solvers.pipeline.stage_plans.Plan` (store-all, rotor,
  rotor_offload) that fits. What fits comes from the pattern's order
  (:mod:`solvers.pipeline.inflight`): on device u, with s_k and w_k the stashes and
  weight-gradient data alive while its k-th op runs (counted from the op list, which
  fixes them), a plan of footprint F holding H between forward and backward must
  satisfy weights + messages + max_k (s_k H + w_k W + F - H) <= memory (W: the
  chunk's ``wgrad_bytes``, or H and the incoming gradient), what the simulator
  charges (with list scheduling: k micro-batches in flight, the list scheduler's caps
  counting what is held and leaving room for the largest F - H).

Every candidate is simulated over repeated steps (:func:`schedir.pipeline.steps.
step_report`); one whose simulated peak exceeds a device is retried with that
device's budget lowered by the excess, then dropped. The store-all and full-remat
versions of every pattern on balanced cuts are candidates too, so the answer is
never slower than a baseline that fits. Not exact (``meta["exact"]`` is False):
a heuristic search whose every answer the simulator judges. The schedule's ``plans``
say per chunk its plan, footprint and (rotor) chain ops.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from schedir.chain.problem import Chain
from schedir.errors import InvalidSchedule
from schedir.pipeline.baselines import gpipe, one_f_one_b, v_shape, zb_h1, zb_h2
from schedir.pipeline.listsched import list_schedule
from schedir.pipeline.ops import Bwd
from schedir.pipeline.placement import balanced_cuts, place, schedule_from_orders
from schedir.pipeline.problem import PipelineProblem, capacity
from schedir.pipeline.schedule import ChunkPlan, PipelineSchedule
from schedir.pipeline.steps import StepReport, step_report
from solvers.pipeline.inflight import Moment, fastest_within, moments, relabeled, room_left
from solvers.pipeline.one_f_one_b import message_reserve
from solvers.pipeline.stage_plans import Plan, shared_plans
from solvers.registry import Infeasible, register

PATTERNS = {"1f1b": one_f_one_b, "zb_h1": zb_h1, "zb_h2": zb_h2, "v_shape": v_shape,
            "gpipe": gpipe}  # fmt: skip
CHUNKS_PER_DEVICE = {"1f1b": 1, "zb_h1": 1, "zb_h2": 1, "v_shape": 2, "gpipe": 1, "list": 1}


def in_flight(chunks: Sequence[tuple[int, int, str]], device: str, k: int) -> tuple[Moment, ...]:
    """The moments of list scheduling with ``k`` micro-batches of each of ``device``'s
    chunks in flight: any of its chunks' ops may run."""
    mine = [(a, b) for a, b, u in chunks if u == device]
    stashes = tuple((c, k) for c in mine)
    return tuple(Moment(c, "F", stashes, ()) for c in mine)


def _most_in_flight(rows: Sequence[Moment]) -> int:
    """The most micro-batches holding a stash at once on a device (1 if none)."""
    return max((sum(n for _, n in m.stashes) for m in rows), default=1)


@dataclass(frozen=True)
class Candidate:
    """A simulated candidate: its repeated-step ``period`` (seconds per step), the
    ``schedule``, its :class:`~schedir.pipeline.steps.StepReport`, and what made it:
    the ``pattern``, the ``cuts``, the chunks' ``plans`` and the planning ``mode``."""

    period: float
    schedule: PipelineSchedule
    report: StepReport
    pattern: str
    cuts: tuple[int, ...]
    plans: tuple[Plan, ...]
    mode: str


class _Search:
    def __init__(self, problem, budget, slots, steps, patterns, max_evals, progress, walk=4,
                 offload=True, storages=()):  # fmt: skip
        self.problem, self.budget, self.steps = problem, budget, steps
        self.patterns, self.max_evals, self.progress = patterns, max_evals, progress
        self.walk = walk
        self.plans = shared_plans(problem, slots, offload, storages)
        self.best: Candidate | None = None
        self.evals = 0
        self.seen: set = set()

    def cap(self, dev: str) -> float:
        c = capacity(self.problem, dev, self.budget)
        return math.inf if c is None else float(c)

    def candidate(self, pattern: str, devs: Sequence[str], cuts: Sequence[int], mode: str):
        """Build, plan, simulate one candidate; ``mode``: "plan" (fastest plans within
        the budgets), "as_is" (the pattern as published: no footprints, the
        simulator's own accounting), "store_all" or "least" (every chunk at rotor's
        least memory: full rematerialization)."""
        key = (pattern, tuple(devs), tuple(cuts), mode)
        if key in self.seen or self.evals >= self.max_evals:
            return None
        self.seen.add(key)
        shape = "v" if pattern == "v_shape" else "loop"
        chunks = place(list(cuts), list(devs), shape)
        if pattern.startswith("list:"):  # k micro-batches per device, then list scheduling
            k = int(pattern.split(":")[1])
            rows = {u: in_flight(chunks, u, k) for u in devs}
        else:
            rows = moments(self._orders(pattern, devs, cuts, chunks, None, None))
        if pattern.startswith("list"):
            return self._walk(pattern, devs, cuts, chunks, rows)
        slack = {u: 0.0 for u in devs}  # bytes taken off a device's room after a try
        for _ in range(4):
            plans = self._choose(chunks, rows, "store_all" if mode == "as_is" else mode, slack)
            if plans is None:
                return None
            try:
                s = self._orders(pattern, devs, cuts, chunks, None if mode == "as_is" else plans,
                                 [p.extra for p in plans])  # fmt: skip
            except InvalidSchedule:
                return None
            period, over = self._judge(s, pattern, cuts, plans, mode)
            if period is not None or mode == "as_is":
                return period
            for u, v in over.items():  # plans shrink by what the simulator found over
                slack[u] += max(0.0, v)
        return None

    def _judge(self, s: PipelineSchedule, pattern, cuts, plans, mode):
        """Simulate ``s`` over repeated steps; keep it if it fits and is the fastest so
        far. Returns (its period or None, bytes over each device's memory)."""
        self.evals += 1
        rep = step_report(self.problem, s, self.steps)
        over = {u: rep.device_peak.get(u, 0) - self.cap(u) for u in rep.device_peak}
        if any(v > 0 for v in over.values()):
            return None, over
        if self.best is None or rep.period < self.best.period - 1e-12:
            self.best = Candidate(rep.period, s, rep, pattern, tuple(cuts), tuple(plans), mode)
        return rep.period, over

    def _walk(self, pattern, devs, cuts, chunks, rows):
        """List scheduling at the devices' memories and at every lower one: the caps and
        the plans' room lowered together by delta bytes, delta walking up through every
        value at which the plans or the list schedule change (``cap_slack``, and the
        margin before a chunk's plan shrinks), until nothing fits. The fastest that
        fits is kept. Greedy list scheduling is not monotone in its caps (more room
        may admit a forward that delays a backward), so a schedule of a smaller memory
        can be faster: walking down makes every schedule that the walk finds at a
        memory M' found at every M > M' too. ``self.walk`` bounds the distinct
        schedules simulated per walk (the first ones, nearest the memory)."""
        tol = 1e-9 * max([1.0] + [self.cap(u) for u in devs if not math.isinf(self.cap(u))])
        best, delta, visited = None, 0.0, set()
        while self.evals < self.max_evals and len(visited) < self.walk:
            plans = self._choose(chunks, rows, "plan", dict.fromkeys(devs, delta))
            if plans is None:
                break
            try:
                s, cap_slack = self._list(pattern, chunks, plans, delta)
            except InvalidSchedule:
                break
            if (s.plans, s.ops) not in visited:
                visited.add((s.plans, s.ops))
                period, _ = self._judge(s, pattern, cuts, plans, "plan")
                if period is not None and (best is None or period < best):
                    best = period
            step = min(cap_slack, self._plan_margin(chunks, rows, plans, delta))
            if math.isinf(step):
                break
            delta += max(step, 0.0) + tol
        return best

    def _plan_margin(self, chunks, rows, plans, delta) -> float:
        """Bytes the devices' room may lose past ``delta`` before a chunk's plan changes."""
        out = math.inf
        for dev in {u for _, _, u in chunks}:
            here = [(a, b) for a, b, u in chunks if u == dev]
            mine = [p for p, (_, _, u) in zip(plans, chunks, strict=True) if u == dev]
            room = self.cap(dev) - self._fixed(dev, chunks) - delta
            out = min(out, room_left(self.plans, self.problem, rows[dev], here, mine, room))
        return out

    def _list(self, pattern, chunks, plans, lower: float = 0.0):
        """The list schedule of ``pattern`` ("list:k[:BFW|BWF]") of the chunks running
        ``plans``, with every device's cap lowered by ``lower`` bytes, and its
        ``cap_slack``. The list scheduler caps the bytes held between ops (stashes,
        weight-gradient data, messages); the working set of the op running, its
        footprint less its held bytes, comes off the cap first."""
        pb = self.problem
        sized = self.plans.chunk_plans([ChunkPlan(a, b, u) for a, b, u in chunks], plans)
        # a W's working set is outside footprints that do not say what they hold
        wgt = max(pb.chain.bwd_tmp[: pb.length]) if pb.wgrad_fraction is not None else 0
        caps = {}
        for u in {v for _, _, v in chunks}:
            mine = [c for c in sized if c.device == u]
            work = max(wgt if c.held is None else c.footprint - c.held for c in mine)
            weights = sum(sum(pb.weights[c.first : c.last]) for c in mine)
            c = self.cap(u) - lower - work - weights
            caps[u] = None if math.isinf(c) else c
        parts = pattern.split(":")
        order = parts[2] if len(parts) > 2 else "BFW"
        rec = [p.extra for p in plans]
        got = list_schedule(pb, chunks, caps=caps, footprint=[c.footprint for c in sized],
                            held=[c.held for c in sized], recompute=rec, priority=tuple(order),
                            messages=True)  # fmt: skip
        s = schedule_from_orders(pb, chunks, got.orders, {"pattern": "list"}, rec)
        return s.with_plans(sized), got.cap_slack

    def _orders(self, pattern, devs, cuts, chunks, plans, rec) -> PipelineSchedule:
        """The fixed-order pattern's schedule on these cuts, the chunks running ``plans``
        (None: the pattern as published, every chunk on its own accounting)."""
        s = PATTERNS[pattern](self.problem, list(devs), cuts=list(cuts), recompute=rec)
        if plans is not None:
            s = s.with_plans(self.plans.chunk_plans([ChunkPlan(a, b, u) for a, b, u in chunks],
                                                    plans))  # fmt: skip
        return s

    def _fixed(self, dev, chunks) -> float:
        pb = self.problem
        mine = [(a, b) for a, b, u in chunks if u == dev]
        return sum(sum(pb.weights[a:b]) + message_reserve(pb, a, b) for a, b in mine)

    def _choose(self, chunks, rows, mode, slack) -> list[Plan] | None:
        """Per chunk its plan: ``mode`` "store_all", "least" (rotor's least memory), or
        "plan": the fastest plans of each device whose in-flight bytes fit its memory
        less its weights, one message of each kind and ``slack[device]``
        (:func:`~solvers.pipeline.inflight.fastest_within`). None if one does not fit."""
        pb = self.problem
        plans: list[Plan | None] = [None] * len(chunks)
        n_all = sum(_most_in_flight(rs) for rs in rows.values())
        for dev in {u for _, _, u in chunks}:
            mine = [c for c, (_, _, u) in enumerate(chunks) if u == dev]
            here = [chunks[c][:2] for c in mine]
            if mode == "store_all":
                got = [self.plans.store_all(a, b) for a, b in here]
            elif mode == "least":
                got = [self.plans.within(a, b, self.plans.least(a, b)) for a, b in here]
            else:
                room = self.cap(dev) - self._fixed(dev, chunks) - slack[dev]
                got = fastest_within(self.plans, pb, rows[dev], here, room, n_all)
            if got is None or any(p is None for p in got):
                return None
            for c, p in zip(mine, got, strict=True):
                plans[c] = p
        return plans  # type: ignore[return-value]

    def dp_cuts(self, pattern: str, devs: Sequence[str], k: int | None = None) -> list[int] | None:
        """Cuts minimizing the slowest chunk (one chunk per device), each chunk's
        time from its plan under the budget its position allows (``k``: k
        micro-batches in flight on every device, for list scheduling)."""
        pb = self.problem
        L, p = pb.length, len(devs)
        if p > L:
            return None
        if k is not None:
            rows = {u: in_flight([(0, 1, u)], u, k) for u in devs}
        else:
            rows = moments(PATTERNS[pattern](pb, list(devs)))
        n_all = sum(_most_in_flight(rs) for rs in rows.values())
        inf = math.inf

        def cost(i: int, j: int, d: int) -> float:
            u = devs[d]
            fixed = sum(pb.weights[i:j]) + message_reserve(pb, i, j)
            # the probe's counts, on chunk [i, j): they do not depend on the cuts
            here = relabeled(rows[u], (i, j))
            got = fastest_within(self.plans, pb, here, [(i, j)], self.cap(u) - fixed, n_all)
            if got is None:
                return inf
            return got[0].time / pb.platform.device(u).speed

        best = [[inf] * (L + 1) for _ in range(p + 1)]
        arg = [[0] * (L + 1) for _ in range(p + 1)]
        best[0][0] = 0.0
        for d in range(1, p + 1):
            for j in range(d, L - (p - d) + 1):
                for i in range(d - 1, j):
                    if best[d - 1][i] == inf:
                        continue
                    v = max(best[d - 1][i], cost(i, j, d - 1))
                    if v < best[d][j]:
                        best[d][j], arg[d][j] = v, i
        if best[p][L] == inf:
            return None
        cuts, j = [L], L
        for d in range(p, 0, -1):
            j = arg[d][j]
            cuts.append(j)
        return cuts[::-1]

    def improve(self, pattern: str, devs: Sequence[str], cuts: list[int]) -> None:
        """Hill climbing on the cuts: evaluate every move of one cut by +-1 and take
        the best while the simulated period improves (from infeasible cuts too: the
        first feasible neighbour is an improvement); where none does, every move by
        +-1 of a run of cuts from the first or to the last (a block handed along the
        pipeline: one move where single moves are each worse)."""
        period = self.candidate(pattern, devs, cuts, "plan")
        period = math.inf if period is None else period
        inner = range(1, len(cuts) - 1)
        single = [(k, k) for k in inner]
        runs = sorted({(1, k) for k in inner} | {(k, inner[-1]) for k in inner} - set(single))
        while self.evals < self.max_evals:
            best = (period, None)
            for moves in (single, runs):
                for a, b in moves:
                    for step in (-1, 1):
                        new = [c + step if a <= k <= b else c for k, c in enumerate(cuts)]
                        if not all(x < y for x, y in zip(new[:-1], new[1:], strict=True)):
                            continue
                        got = self.candidate(pattern, devs, new, "plan")
                        if got is not None and got < best[0] - 1e-12:
                            best = (got, new)
                if best[1] is not None:
                    break
            if best[1] is None:
                return
            period, cuts = best


def plan_pattern(
    problem: PipelineProblem,
    pattern: str,
    devices: Sequence[str],
    cuts: Sequence[int] | None = None,
    *,
    slots: int = 500,
    steps: int = 2,
    max_evals: int = 400,
    storages: Sequence[tuple[str, Chain]] = (),
    offload: bool = False,
) -> PipelineSchedule:
    """One fixed-order ``pattern`` (a key of :data:`PATTERNS`) on ``devices``, every
    chunk running its fastest plan, store-all or rotor (with ``offload`` and a host
    link on the platform, rotor_offload's too), such that the
    bytes its device holds for its micro-batches in flight fit (the module
    docstring's charge), judged by the simulator over ``steps`` repeated steps (1: one
    step alone, its makespan and peaks, as a runtime waiting for each step runs it);
    on ``cuts`` (chunk boundaries) or on the DP's cuts (one chunk per device; else
    balanced) improved by hill climbing. Candidates too, so that the answer is never
    slower than they are where they fit: the pattern storing every activation as
    published (the simulator's own accounting) and with store-all plans, on ``cuts``,
    or on the balanced cut and on the even one (as many blocks per chunk as can be).
    The chunks' plans carry their footprints, kinds, extra seconds and rotor ops, and
    :attr:`~schedir.pipeline.schedule.ChunkPlan.held` (what their chain schedules
    hold between forward and backward, :meth:`StagePlans.held`). ``storages``: the
    low-bit storages a chunk's plan may keep its residuals in, ``(name, chain)``
    (:class:`~solvers.pipeline.stage_plans.StagePlans`). Raises
    :class:`~solvers.registry.Infeasible` when no candidate fits."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern = {pattern!r}: expected one of {', '.join(PATTERNS)}")
    devs = list(devices)
    search = _Search(problem, None, slots, steps, [pattern], max_evals, None, offload=offload,
                     storages=storages)  # fmt: skip
    parts = len(devs) * CHUNKS_PER_DEVICE[pattern]
    L = problem.length
    fixed = (
        [list(cuts)]
        if cuts is not None
        else [balanced_cuts(problem, parts), [round(k * L / parts) for k in range(parts + 1)]]
    )
    for c in fixed:
        for mode in ("as_is", "store_all"):
            search.candidate(pattern, devs, c, mode)
    if cuts is not None:
        search.candidate(pattern, devs, list(cuts), "plan")
    else:
        start = search.dp_cuts(pattern, devs) if parts == len(devs) else None
        search.improve(pattern, devs, start or fixed[0])
    if search.best is None:
        raise Infeasible("pipeline_joint", None, None, f"no cut of {pattern} with per-chunk "
                         "plans fits the devices' memory")  # fmt: skip
    return _chosen(search.best)


def _chosen(best: Candidate) -> PipelineSchedule:
    """The schedule of ``best``: its chunks' plans set by the search, or, as published
    (mode "as_is"), store-all on the simulator's own accounting."""
    if best.mode != "as_is":
        return best.schedule
    return best.schedule.with_plans(
        dataclasses.replace(c, kind="store_all") for c in best.schedule.plans
    )


def apply_plans(schedule: PipelineSchedule, plans: dict[tuple[int, int], Plan]):
    """``schedule`` with chunk [i, j) run by ``plans[i, j]``: its footprint reserved,
    its extra seconds on every backward (``Bwd.recompute``)."""
    lists = []
    for dev, ops in schedule.ops:
        out = []
        for op in ops:
            plan = plans.get((op.first, op.last)) if isinstance(op, Bwd) else None
            out.append(op if plan is None else Bwd(op.first, op.last, op.mb, plan.extra, op.part))
        lists.append((dev, tuple(out)))
    chunks = [c for c in schedule.plans if (c.first, c.last) in plans]
    new = [dataclasses.replace(c, footprint=plans[c.first, c.last].footprint) for c in chunks]
    return dataclasses.replace(schedule, ops=tuple(lists)).with_plans(new)


def full_remat(problem: PipelineProblem, schedule: PipelineSchedule, slots: int = 500):
    """``schedule`` with every chunk of its plans at rotor's least memory (full
    rematerialization, the Megatron-style fallback when activations do not fit)."""
    plans = shared_plans(problem, slots, offload=False)
    return apply_plans(schedule, {(c.first, c.last): plans.within(c.first, c.last,
                                                                  plans.least(c.first, c.last))
                                  for c in schedule.plans})  # fmt: skip


def device_orders(problem: PipelineProblem, every: int = 3) -> list[list[str]]:
    """Every order of up to ``every`` devices; beyond, the platform's order, by
    decreasing memory (front stages hold more micro-batches) and by decreasing and
    increasing speed; without repeats."""
    devs = list(problem.platform.devices)
    if len(devs) <= every:
        orders = [[d.name for d in o] for o in itertools.permutations(devs)]
        return _distinct(problem, orders)
    mem = [d.memory if d.memory is not None else math.inf for d in devs]
    orders = [[d.name for d in devs]]
    orders.append([d.name for _, d in sorted(zip(mem, devs, strict=True), key=lambda t: -t[0])])
    orders.append([d.name for d in sorted(devs, key=lambda d: -d.speed)])
    orders.append([d.name for d in sorted(devs, key=lambda d: d.speed)])
    return _distinct(problem, orders)


def _distinct(problem: PipelineProblem, orders: list[list[str]]) -> list[list[str]]:
    out, seen = [], set()
    for o in orders:  # identical devices in the same places give the same schedules
        sig = tuple((problem.platform.device(u).speed, problem.platform.device(u).memory)
                    for u in o)  # fmt: skip
        if sig not in seen:
            seen.add(sig)
            out.append(o)
    return out


@register(
    "pipeline_joint",
    problem=PipelineProblem,
    exact=False,
    description="training pipeline: partition, F/B/W schedule, per-chunk remat / offload "
    "(DP + patterns + list scheduling, judged by the simulator)",
)
def pipeline_joint(
    problem: PipelineProblem,
    budget: int | None = None,
    *,
    patterns: Sequence[str] = ("1f1b", "zb_h1", "zb_h2", "v_shape", "list"),
    slots: int = 500,
    steps: int = 3,
    max_evals: int = 400,
    walk: int = 4,
    offload: bool = True,
    storages: Sequence[tuple[str, Chain]] = (),
    progress=None,
) -> PipelineSchedule:
    """The fastest schedule found (module docstring); ``budget`` bytes bound every
    device besides its memory; ``patterns``: names or one comma-separated string;
    ``steps``: repeated steps simulated per candidate (1: one step alone, as a runtime
    waiting for each step runs it); ``max_evals`` bounds the simulated candidates;
    ``walk`` the list schedules of lower memories simulated per list candidate
    (``_Search._walk``); ``offload``: whether chunks may offload activations over the
    platform's host link (else store-all or rotor only); ``storages``: low-bit storages
    of the chunks' residuals, ``(name, chain)`` per storage
    (:class:`~solvers.pipeline.stage_plans.StagePlans`)."""
    if not problem.training:
        raise ValueError("pipeline_joint needs a training problem (training=True)")
    if isinstance(patterns, str):  # "1f1b,zb_h1" from the command line
        patterns = [name.strip() for name in patterns.split(",") if name.strip()]
    for name in patterns:
        if name not in CHUNKS_PER_DEVICE:
            raise ValueError(f"pipeline_joint: pattern {name!r} unknown; known: "
                             f"{', '.join(CHUNKS_PER_DEVICE)}")  # fmt: skip
    t0 = time.perf_counter()
    if isinstance(walk, bool) or not isinstance(walk, int) or walk < 1:
        raise ValueError(f"pipeline_joint: walk = {walk!r}: expected an integer >= 1")
    search = _Search(problem, budget, slots, steps, list(patterns), max_evals, progress, walk,
                     offload, storages)  # fmt: skip
    L = problem.length
    orders = device_orders(problem)
    for n, devs in enumerate(orders):
        dp_1f1b = search.dp_cuts("1f1b", devs) if len(devs) <= L else None
        for pattern in patterns:
            v = CHUNKS_PER_DEVICE[pattern]
            if len(devs) * v > L:
                continue
            balanced = balanced_cuts(problem, len(devs) * v)
            for mode in ("as_is", "store_all", "least"):
                if pattern != "list":
                    search.candidate(pattern, devs, balanced, mode)
            if pattern == "list":
                # list scheduling with budgets for k micro-batches in flight per device
                # (priorities: backwards, forwards, weight gradients, or W before F)
                tried = {}
                for k in range(1, min(problem.microbatches, 2 * len(devs)) + 1):
                    for c in (balanced, dp_1f1b or balanced,
                              search.dp_cuts(pattern, devs, k) or balanced):  # fmt: skip
                        for order in ("BFW", "BWF"):
                            name = f"list:{k}:{order}"
                            got = search.candidate(name, devs, c, "plan")
                            if got is not None and got < tried.get(name, (math.inf,))[0]:
                                tried[name] = (got, c)
                if tried:
                    name = min(tried, key=lambda kk: tried[kk][0])
                    search.improve(name, devs, list(tried[name][1]))
                else:  # nothing fits yet: climb from the cuts of one micro-batch in flight
                    search.improve("list:1", devs, search.dp_cuts(pattern, devs, 1) or balanced)
                continue
            cuts = search.dp_cuts(pattern, devs) if v == 1 else None
            search.improve(pattern, devs, cuts or balanced)
            if progress is not None:
                progress((n + 1) / len(orders), f"pipeline_joint: {search.evals} candidates")
    if search.best is None:
        raise Infeasible("pipeline_joint", budget, None,
                         "no pattern, cut and per-chunk plan fits the devices' memory")  # fmt: skip
    best, m = search.best, problem.microbatches
    s, rep = best.schedule, best.report
    meta = {**s.meta, "method": "pipeline_joint", "period": best.period / m,
            "step_period": best.period, "step_throughput": rep.throughput,
            "bubble": rep.bubble, "candidates": search.evals, "exact": False,
            "plans_exact": all(p.exact for p in best.plans),
            "search_time": time.perf_counter() - t0}  # fmt: skip
    return dataclasses.replace(_chosen(best), meta=meta)

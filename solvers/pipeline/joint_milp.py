"""MILP of the joint training-pipeline problem on small instances (``"pipeline_joint_milp"``).

Enumerated outside the MILP: the device order (every permutation up to 4 devices,
else :func:`solvers.pipeline.joint.device_orders`) and the cuts (one chunk per
device, every composition of the L stages); combinations are solved by increasing
lower bound (m times the slowest device's fastest plan) and the enumeration stops
when that bound reaches the best period found. For each, HiGHS solves:

- variables: start S_o of every op o (F, and Bi + W when the problem splits the
  backward, else B; of every chunk c and micro-batch n), the plan z[c, q] of every
  chunk from a menu (:class:`~solvers.pipeline.stage_plans.Plan`: store-all, and
  rotor / rotor_offload under the budgets room / k, k = 1..2m, dominated ones
  dropped), the order y[o, o'] of every two ops of a device of different kinds, and
  the period T;
- durations: F and W fixed; the backward's grows by the chosen plan's extra seconds;
  all over the device's speed;
- precedence: F(c, n) after F(c - 1, n) and its message (link time, no contention),
  the backward of the last chunk after its forward, B(c, n) after B(c + 1, n) and its
  message, W(c, n) after Bi(c, n); each kind in micro-batch order on its chunk (the
  order every published schedule keeps); disjunctions (big-M) between kinds;
- memory of device u at every forward's start and every backward's end:
  f_q (stashes alive) + H_q (weight-gradient data alive) <= room_u when z[c, q] = 1,
  the counts linear in y, room_u = memory - weights - one message of each kind
  (``message_reserve``);
- period: a device's last op ends at most T after its first starts, so the step
  repeats every T without a barrier (the repeated-step semantics of
  :mod:`schedir.pipeline.steps`); minimize T.

Its answer's orders are simulated over repeated steps: the simulated period is at
most T (the simulator starts every op as early as the orders allow) and is what the
answer reports; an answer whose simulated peak exceeds a device (messages beyond the
reserve) is dropped. Exact for this model when no MILP hit the time limit and every
plan of the menus was exact; the model is narrower than ``pipeline_joint``'s
search (one chunk per device, menus of plans, FIFO per kind), so the fast method
may be better.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from schedir.pipeline.ops import wgrad_hold
from schedir.pipeline.placement import place, schedule_from_orders
from schedir.pipeline.problem import PipelineProblem, capacity, link_time
from schedir.pipeline.schedule import PipelineSchedule
from schedir.pipeline.steps import step_report
from solvers._highs import run
from solvers.pipeline.exhaustive import compositions
from solvers.pipeline.joint import device_orders
from solvers.pipeline.milp import HighsOutcome, _highs_model, _Rows
from solvers.pipeline.one_f_one_b import message_reserve
from solvers.pipeline.stage_plans import Plan, StagePlans, shared_plans
from solvers.registry import Infeasible, register


def plan_menu(plans: StagePlans, i: int, j: int, room: float, m: int) -> list[Plan]:
    """Store-all and the fastest plans under room / k (k = 1..2m), undominated."""
    found = {plans.store_all(i, j)}
    if math.isfinite(room):
        for k in range(1, 2 * m + 1):
            got = plans.within(i, j, room / k)
            if got is not None:
                found.add(got)
    menu = sorted(found, key=lambda p: (p.footprint, p.time))
    keep = []
    for p in menu:  # by increasing footprint: keep those faster than every smaller one
        if not keep or p.time < keep[-1].time - 1e-15:
            keep.append(p)
    return keep


def _ops(C: int, m: int, split: bool) -> list[tuple[str, int, int]]:
    kinds = ("F", "Bi", "W") if split else ("F", "B")
    return [(k, c, n) for c in range(C) for k in kinds for n in range(m)]


@dataclass(frozen=True)
class ComboSolution:
    """The MILP's answer for one device order and cuts: its period ``T`` (seconds), the
    ``chunks``, the per-device ``orders``, the chosen ``plans`` (one per chunk), whether
    every menu plan was exact (``menus_exact``) and how the solve ended (``outcome``)."""

    T: float
    chunks: tuple
    orders: dict
    plans: list[Plan]
    menus_exact: bool
    outcome: HighsOutcome


def _solve_combo(problem, devs, cuts, plans, budget, time_limit, unit) -> ComboSolution | None:
    """The MILP of one combination (None: no plan menu fits, or no solution)."""
    pb = problem
    m, C = pb.microbatches, len(devs)
    split = pb.wgrad_fraction is not None
    chunks = place(list(cuts), list(devs), "loop")
    speed = [pb.platform.device(u).speed for u in devs]
    rooms, menus = [], []
    for i, j, u in chunks:
        cap = capacity(pb, u, budget)
        room = math.inf if cap is None else cap - sum(pb.weights[i:j]) - message_reserve(pb, i, j)
        if room < 0:
            return None
        menu = [p for p in plan_menu(plans, i, j, room, m) if p.footprint <= room]
        if not menu:
            return None
        rooms.append(room)
        menus.append(menu)
    x = pb.chain.in_size
    R = _Rows()
    T = R.var("T", continuous=True)
    ops = _ops(C, m, split)
    bk = "Bi" if split else "B"
    for o in ops:
        R.var("S", *o, continuous=True)
    for c, menu in enumerate(menus):
        R.add({R.var("z", c, q): 1 for q in range(len(menu))}, 1, 1)

    def dur(o) -> dict:
        """Duration of op o as {column: coef} plus a constant under key None (units)."""
        kind, c, _ = o
        i, j, _ = chunks[c]
        if kind == "F":
            return {None: sum(pb.chain.fwd_time[i:j]) / speed[c] / unit}
        if kind == "W":
            return {None: pb.wgrad_time(i, j) / speed[c] / unit}
        back = sum(pb.chain.bwd_time[i:j]) - (pb.wgrad_time(i, j) if split else 0.0)
        if j == pb.length:
            back += pb.chain.fwd_time[j] + pb.chain.bwd_time[j]
        coefs = {None: back / speed[c] / unit}
        for q, p in enumerate(menus[c]):
            coefs[R.index["z", c, q]] = p.extra / speed[c] / unit
        return coefs

    durs = {o: dur(o) for o in ops}
    horizon = sum(
        max(d[None] + sum(v for k, v in d.items() if k is not None), 0) for d in durs.values()
    )
    links = 0.0
    for c in range(C - 1):
        for a, b in ((c, c + 1), (c + 1, c)):
            links += m * link_time(pb, devs[a], devs[b], x[chunks[c][1]]) / unit
    M = horizon + links + 1.0

    def after(later, earlier, gap: float = 0.0, y: int | None = None, when: int = 1) -> None:
        """S[later] >= S[earlier] + dur(earlier) + gap; with a disjunction column y,
        only when y == ``when`` (big-M M)."""
        coefs = {R.index["S", *later]: 1.0, R.index["S", *earlier]: -1.0}
        low = gap + durs[earlier][None]
        for k, v in durs[earlier].items():
            if k is not None:
                coefs[k] = coefs.get(k, 0.0) - v
        if y is not None and when == 1:  # ... - M (1 - y)
            coefs[y] = -M
            low -= M
        elif y is not None:  # ... - M y
            coefs[y] = M
        R.add(coefs, low, np.inf)

    for c in range(C):
        kinds = ("F", bk) + (("W",) if split else ())
        for kind in kinds:
            for n in range(m - 1):
                after((kind, c, n + 1), (kind, c, n))
        for n in range(m):
            if c > 0:
                t = link_time(pb, devs[c - 1], devs[c], x[chunks[c][0]]) / unit
                after(("F", c, n), ("F", c - 1, n), t)
            if c == C - 1:
                after((bk, c, n), ("F", c, n))
            else:
                t = link_time(pb, devs[c + 1], devs[c], x[chunks[c][1]]) / unit
                after((bk, c, n), (bk, c + 1, n), t)
            if split:
                after(("W", c, n), (bk, c, n))
        # disjunctions between kinds on the device; pairs fixed by precedence skipped
        mine = [o for o in ops if o[1] == c]
        for o, o2 in itertools.combinations(mine, 2):
            if o[0] == o2[0] or _fixed(o, o2, bk) is not None:
                continue
            y = R.var("y", o, o2)
            after(o2, o, 0.0, y, 1)  # y = 1: o before o2
            after(o, o2, 0.0, y, 0)  # y = 0: o2 before o
        first = R.index["S", "F", c, 0]
        for o in ((bk, c, m - 1), ("W", c, m - 1)) if split else ((bk, c, m - 1),):
            coefs = {T: 1.0, R.index["S", *o]: -1.0, first: 1.0}
            low = durs[o][None]
            for k, v in durs[o].items():
                if k is not None:
                    coefs[k] = coefs.get(k, 0.0) - v
            R.add(coefs, low, np.inf)
        _memory_rows(R, pb, chunks, c, m, menus[c], rooms[c], bk, split)
    n_cols = len(R.index)
    highs = _highs_model(R, n_cols, 1.0)
    if time_limit is not None:
        highs.setOptionValue("time_limit", max(0.01, float(time_limit)))
    run(highs)
    if highs.getInfo().primal_solution_status != 2:
        return None
    val = np.asarray(highs.getSolution().col_value)
    chosen = [menus[c][int(np.argmax([val[R.index["z", c, q]] for q in range(len(menus[c]))]))]
              for c in range(C)]  # fmt: skip
    rank = {"F": 0, "B": 1, "Bi": 1, "W": 2}
    orders = {u: [] for u in devs}
    for c, (_, _, u) in enumerate(chunks):
        mine = sorted((val[R.index["S", *o]], rank[o[0]], o) for o in ops if o[1] == c)
        orders[u] = [o for _, _, o in mine]
    exact = all(p.exact for menu in menus for p in menu)
    outcome = HighsOutcome.of(highs, n_cols, len(R.lo), unit)
    return ComboSolution(float(val[T]) * unit, chunks, orders, chosen, exact, outcome)


def _fixed(o, o2, bk: str):
    """True if o must precede o2 (same chunk), False if o2 must precede o, else None."""
    order = {"F": 0, bk: 1, "W": 2}
    (k1, _, n1), (k2, _, n2) = o, o2
    if order[k1] < order[k2] and n1 <= n2:
        return True
    if order[k2] < order[k1] and n2 <= n1:
        return False
    return None


def _memory_rows(R, pb, chunks, c, m, menu, room, bk, split) -> None:
    """Stashes and weight-gradient data alive at every forward's start and every
    backward's end, times the chosen plan's bytes, within the room."""
    if math.isinf(room):
        return
    i, j, _ = chunks[c]
    big = max(p.footprint + wgrad_hold(pb, i, j, p.footprint) for p in menu) * 2 * m + room

    def before(o, o2) -> tuple[float, dict]:
        """o ends before o2 starts, as (constant, {y: coef})."""
        if o[0] == o2[0]:
            return (1.0 if o[2] < o2[2] else 0.0), {}
        fixed = _fixed(o, o2, bk)
        if fixed is not None:
            return (1.0 if fixed else 0.0), {}
        key = ("y", o, o2) if ("y", o, o2) in R.index else ("y", o2, o)
        if key[1] == o:
            return 0.0, {R.index[key]: 1.0}
        return 1.0, {R.index[key]: -1.0}

    def count(kind, at) -> tuple[float, dict]:
        """How many ops ``kind`` of this chunk end before op ``at`` starts."""
        const, coefs = 0.0, {}
        for n in range(m):
            o = (kind, c, n)
            if o == at:
                continue
            a, b = before(o, at)
            const += a
            for k, v in b.items():
                coefs[k] = coefs.get(k, 0.0) + v
        return const, coefs

    points = [("F", c, n) for n in range(m)] + [(bk, c, n) for n in range(m)]
    for at in points:
        # stashes alive: forwards started (that op included for a forward) - backwards done
        f_const, f_coefs = count("F", at)
        b_const, b_coefs = count(bk, at)
        # at a forward's start its own stash is allocated; at a backward's end its own
        # stash is freed (and its weight-gradient data allocated)
        stash_const = f_const - b_const + (1.0 if at[0] == "F" else -1.0)
        stash = {k: f_coefs.get(k, 0.0) - b_coefs.get(k, 0.0) for k in set(f_coefs) | set(b_coefs)}
        hold_const, hold = 0.0, {}
        if split:
            w_const, w_coefs = count("W", at)
            hold_const = b_const + (1.0 if at[0] == bk else 0.0) - w_const
            hold = {
                k: b_coefs.get(k, 0.0) - w_coefs.get(k, 0.0) for k in set(b_coefs) | set(w_coefs)
            }
        for q, p in enumerate(menu):
            H = wgrad_hold(pb, i, j, p.footprint)
            coefs = {k: p.footprint * v for k, v in stash.items()}
            for k, v in hold.items():
                coefs[k] = coefs.get(k, 0.0) + H * v
            z = R.index["z", c, q]
            coefs[z] = coefs.get(z, 0.0) + big
            const = p.footprint * stash_const + H * hold_const
            R.add(coefs, -np.inf, room - const + big)


@register(
    "pipeline_joint_milp",
    problem=PipelineProblem,
    exact=True,
    description="training pipeline: partition, F/B/W order and per-chunk plans by MILP "
    "(small instances; one chunk per device)",
)
def pipeline_joint_milp(
    problem: PipelineProblem,
    budget: int | None = None,
    *,
    slots: int = 500,
    time_limit: float | None = 60.0,
    max_combinations: int = 200,
    steps: int = 3,
    progress=None,
) -> PipelineSchedule:
    """The MILP's best answer (module docstring). ``time_limit``: seconds per MILP;
    ``max_combinations``: device orders x cuts solved at most."""
    if not problem.training:
        raise ValueError("pipeline_joint_milp needs a training problem (training=True)")
    t0 = time.perf_counter()
    pb = problem
    L, m = pb.length, pb.microbatches
    plans = shared_plans(pb, slots)
    devices = [d.name for d in pb.platform.devices]
    orders = ([list(o) for o in itertools.permutations(devices)] if len(devices) <= 4
              else device_orders(pb))  # fmt: skip
    P = min(len(devices), L)
    combos = []
    for devs in orders:
        for cuts in compositions(L, P):
            lb = 0.0
            for c in range(P):
                i, j = cuts[c], cuts[c + 1]
                lb = max(lb, m * plans.store_all(i, j).time / pb.platform.device(devs[c]).speed)
            combos.append((lb, devs[:P], tuple(cuts)))
    combos.sort(key=lambda t: t[0])
    unit = max(pb.work(0, L) / max(d.speed for d in pb.platform.devices), 1e-30)
    best, solved, limited, complete, menus_exact = None, 0, False, True, True
    for k, (lb, devs, cuts) in enumerate(combos):
        if best is not None and lb >= best[0].T * (1 - 1e-9):
            break
        if solved >= max_combinations:
            complete = False
            break
        if progress is not None:
            progress(k / len(combos), f"pipeline_joint_milp: combination {k + 1}")
        got = _solve_combo(pb, devs, cuts, plans, budget, time_limit, unit)
        solved += 1
        if got is None:
            continue
        limited = limited or got.outcome.time_limited
        menus_exact = menus_exact and got.menus_exact
        fp = [int(p.footprint) for p in got.plans]
        rec = [p.extra for p in got.plans]
        s = schedule_from_orders(pb, got.chunks, got.orders, {"pattern": "milp"}, rec, fp)
        rep = step_report(pb, s, steps)
        fits = all(rep.device_peak.get(u, 0) <= (capacity(pb, u, budget) or math.inf)
                   for u in devs)  # fmt: skip
        if fits and (best is None or got.T < best[0].T):
            best = (got, s, rep)
    if best is None:
        raise Infeasible("pipeline_joint_milp", budget, None,
                         "no cut, order and plan menu fits the devices' memory")  # fmt: skip
    got, s, rep = best
    exact = complete and not limited and menus_exact
    meta = {**s.meta, "method": "pipeline_joint_milp", "model_period": got.T,
            "step_period": rep.period, "period": rep.period / m,
            "step_throughput": rep.throughput, "bubble": rep.bubble,
            "combinations": solved, "exact": exact, "time_limited": limited,
            "milp": {**got.outcome.report(), "menus_exact": got.menus_exact},
            "search_time": time.perf_counter() - t0}  # fmt: skip
    return dataclasses.replace(s.with_plans(plans.chunk_plans(s.plans, got.plans)), meta=meta)

"""Discrete-event simulation of multi-resource schedules, with a seeded noise model.

Resources: each device's compute stream and each directed link (src, dst). A
:class:`~schedir.pipeline.ops.PipelineSchedule` fixes the order of the ops on every
resource: compute ops run in their device's list order, a ``Send`` runs on link
(device, peer) in list order among that link's sends. An op starts when its resource
is free and its data is there: ``Fwd(i, j, n)`` needs a_i of item n (released at
``n * release_interval`` when i == 0, else delivered by a Send or produced locally),
``Bwd(i, j, n)`` needs its own Fwd and d_j (none when j == L: the loss is in it),
``Wgt(i, j, n)`` its own ``Bwd(i, j, n, part="input")``, a Send needs the local op that
produced what it sends (all read from :func:`schedir.pipeline.ops.effect`). Since
every resource's order is fixed, start times are a longest path over (data +
resource order) edges; a cycle there is a deadlock and is reported.

Durations: compute = work / speed x noise; a send of x bytes = latency + x / bandwidth.
Noise (:class:`Noise`): each compute op's time is multiplied by an independent
log-normal factor exp(sigma Z - sigma^2 / 2) (mean 1) and by a per-device factor drawn
once (same law, ``device_sigma``), seeded, so runs are reproducible.

Memory per device (bytes): the weights of every stage it runs, plus the buffers of
:func:`schedir.pipeline.ops.effect` (inputs, outputs, stashes, receive buffers from
the start of their transfer, the weight-gradient data of split backwards, working
sets), each from its allocation until the last op that releases it has done so. A
chunk whose plan has a footprint (``schedule.plans``) holds it per micro-batch in
place of its own accounting (see ``effect``). At equal times (to 1e-9 relative) frees come
before allocations.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np

from schedir.errors import InvalidProblem, InvalidSchedule
from schedir.pipeline.ops import Bwd, Fwd, Send, Wgt, effect
from schedir.pipeline.problem import PipelineProblem, link_time
from schedir.pipeline.schedule import PipelineSchedule, check_count, check_seconds, expand
from schedir.trace import Span


@dataclass(frozen=True)
class Noise:
    """Multiplicative log-normal noise on compute times (mean factor 1).

    Attributes:
        sigma: per-task standard deviation of log(factor) (0: deterministic).
        seed: seed of the generator.
        device_sigma: per-device persistent factor (a device slower or faster than its
            model all along), drawn once per device name in platform order.
    """

    sigma: float = 0.0
    seed: int = 0
    device_sigma: float = 0.0

    def __post_init__(self) -> None:
        for name in ("sigma", "device_sigma"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 10:
                raise InvalidProblem(f"noise {name} = {v!r}: expected a number in [0, 10]")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InvalidProblem(f"noise seed = {self.seed!r}: expected an integer >= 0")

    def generator(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def device_factors(self, names: list[str]) -> dict[str, float]:
        if self.device_sigma == 0:
            return dict.fromkeys(names, 1.0)
        rng = np.random.default_rng([self.seed, 1])
        s = self.device_sigma
        return {u: float(np.exp(s * rng.standard_normal() - s * s / 2)) for u in names}

    def factor(self, rng: np.random.Generator) -> float:
        s = self.sigma
        return float(np.exp(s * rng.standard_normal() - s * s / 2)) if s > 0 else 1.0


@dataclass(frozen=True)
class OpRecord:
    """One executed op: its resource ("compute", device) or ("link", src, dst)."""

    resource: tuple
    op: str
    start: float
    end: float


@dataclass(frozen=True)
class PipelineTrace:
    """What a multi-resource schedule does.

    Attributes:
        makespan: end of the last op, seconds.
        period: steady-state seconds per item (see :func:`steady_period`); in training
            the last P micro-batches (the drain, P = devices) are left out.
        latency: max over items of completion - release, seconds.
        completion: in-order delivery time of every item (max of its own end and the
            previous item's delivery), seconds.
        peak_memory: max over devices of ``device_peak``, bytes.
        device_peak: peak bytes of every device.
        memory: per device, (times, bytes) of its memory curve (bytes after each event).
        records: every executed op.
        busy: busy seconds of every resource.
    """

    makespan: float
    period: float
    latency: float
    peak_memory: int
    device_peak: dict
    memory: dict
    completion: tuple[float, ...]
    records: tuple[OpRecord, ...]
    busy: dict


def steady_period(completion: list[float], hyper: int = 1) -> float:
    """Seconds per item over the second half of the run, on a whole number of
    hyperperiods (``hyper`` items) so that a periodic regime is measured exactly."""
    c = sorted(completion)
    N = len(c)
    if N < 2:
        return c[0] if c else math.nan
    hyper = max(1, min(hyper, (N - 1) // 1))
    n1 = (N // 2 // hyper) * hyper
    n2 = n1 + ((N - 1 - n1) // hyper) * hyper
    if n2 == n1:
        n1, n2 = 0, N - 1
    return (c[n2] - c[n1]) / (n2 - n1)


def simulate_pipeline(
    problem: PipelineProblem,
    schedule: PipelineSchedule,
    *,
    items: int | None = None,
    noise: Noise | None = None,
    release_interval: float | None = None,
) -> PipelineTrace:
    """Run ``schedule`` on ``problem`` (see the module docstring).

    ``items``: items to simulate for a periodic pattern (default: 50 hyperperiods, at
    least ``problem.microbatches``). ``release_interval``: item n enters at n times
    that many seconds (default: the schedule's ``release_interval``; 0: all at once,
    which measures the throughput but lets queues, and memory, grow). Raises
    InvalidSchedule on a missing producer, an unmatched Send / Recv, an unknown device
    or link, or a deadlock.
    """
    if not isinstance(problem, PipelineProblem):
        raise InvalidSchedule(f"simulate_pipeline: expected a PipelineProblem, got "
                              f"{type(problem).__name__}")  # fmt: skip
    if not isinstance(schedule, PipelineSchedule):
        raise InvalidSchedule(f"a {type(schedule).__name__} is not a schedule of a pipeline "
                              "problem (expected format schedir.pipeline_schedule)")  # fmt: skip
    hyper = schedule.periodic or 1
    if items is not None:
        check_count("items", items)
    if release_interval is None:
        release_interval = schedule.release_interval
    else:
        release_interval = check_seconds("release_interval", release_interval)
    if schedule.periodic:
        schedule = expand(schedule, items or max(problem.microbatches, 50 * hyper))
    plat = problem.platform
    noise = noise or Noise()
    rng = noise.generator() if noise.sigma > 0 else None
    dev_factor = noise.device_factors([d.name for d in plat.devices])
    footprints, held = schedule.footprints(), schedule.held_bytes()
    training = problem.training or any(isinstance(o, Bwd) for _, ops in schedule.ops for o in ops)
    # Tasks: resource, duration, data deps, release time, effect.
    res, dur, deps, rel, label, owner, effects = [], [], [], [], [], [], []
    produced: dict[tuple, int] = {}  # data made by a compute op -> task
    delivered: dict[tuple, int] = {}  # (dst, kind, k, mb) -> send task
    recvs: list[tuple] = []
    weights_on: dict[str, set] = defaultdict(set)
    pending: list[tuple[int, tuple]] = []  # (task, key to resolve)
    for dev, ops in schedule.ops:
        speed = plat.device(dev).speed
        for op in ops:
            whole = kept = None
            if training and isinstance(op, Fwd | Bwd | Wgt):
                whole = footprints.get((op.first, op.last))
                kept = held.get((op.first, op.last))
            try:
                eff = effect(problem, dev, op, training=training, footprint=whole, held=kept)
            except InvalidSchedule as err:
                raise InvalidSchedule(f"device {dev}: {op}: {err}") from None
            t = len(res)
            if not eff.resource:  # a Recv: matched against the Sends below
                recvs.append((dev, op))
                continue
            label.append(op)
            owner.append(dev)
            effects.append(eff)
            deps.append([])
            rel.append(0.0)
            res.append(eff.resource)
            if eff.resource[0] == "link":
                pending += [(t, key) for key in eff.reads]
                lt = link_time(problem, dev, op.peer, eff.nbytes)
                if math.isinf(lt):
                    raise InvalidSchedule(f"device {dev}: {op}: no link {dev}->{op.peer}")
                dur.append(lt)
                delivered[eff.adds[0]] = t
                continue
            for key in eff.reads:
                if key[1] in ("s", "w"):  # made by an earlier op of this device's list
                    if key not in produced:
                        raise InvalidSchedule(f"device {dev}: {op} before {_needs(key)}")
                    deps[t].append(produced[key])
                else:
                    pending.append((t, key))
            weights_on[dev].update(range(op.first, op.last))
            dur.append(eff.work / speed * noise.factor(rng) * dev_factor[dev])
            for key in eff.adds:
                produced[key] = t
            if isinstance(op, Fwd) and op.first == 0:
                rel[t] = op.mb * release_interval
    for t, key in pending:
        src = produced.get(key)
        if src is None or (isinstance(label[t], Fwd | Bwd) and key in delivered):
            src = delivered.get(key, src)
        if src is None:
            raise InvalidSchedule(f"device {owner[t]}: {label[t]}: nothing produces {key[1:]}")
        deps[t].append(src)
    for dev, op in recvs:
        if (dev, op.kind, op.index, op.mb) not in delivered:
            raise InvalidSchedule(f"device {dev}: {op}: no matching Send from {op.peer}")
    start, end = _longest_path(res, dur, deps, rel, label, owner)
    return _trace(problem, hyper, res, start, end, label, owner, effects, weights_on,
                  training, release_interval)  # fmt: skip


def _needs(key: tuple) -> str:
    first, last = key[2]
    if key[1] == "s":
        return f"its forward F({first}:{last},{key[3]})"
    return f"its input-gradient backward Bi({first}:{last},{key[3]})"


def _longest_path(res, dur, deps, rel, label, owner):
    n = len(res)
    succ = [[] for _ in range(n)]
    indeg = [0] * n
    last_on: dict[tuple, int] = {}
    preds = [list(d) for d in deps]
    for t in range(n):
        if res[t] in last_on:
            preds[t].append(last_on[res[t]])
        last_on[res[t]] = t
        for p in preds[t]:
            succ[p].append(t)
            indeg[t] += 1
    start, end = [0.0] * n, [0.0] * n
    ready = deque(t for t in range(n) if indeg[t] == 0)
    done = 0
    while ready:
        t = ready.popleft()
        start[t] = max([rel[t]] + [end[p] for p in preds[t]])
        end[t] = start[t] + dur[t]
        done += 1
        for s in succ[t]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if done < n:
        stuck = [f"{owner[t]}:{label[t]}" for t in range(n) if indeg[t] > 0][:5]
        raise InvalidSchedule(f"deadlock: these ops wait on each other: {', '.join(stuck)}")
    return start, end


def _trace(problem, hyper, res, start, end, label, owner, effects, weights_on, training,
           release_interval) -> PipelineTrace:  # fmt: skip
    L = problem.length
    events: dict[str, list] = defaultdict(list)
    # the memory rule of schedir.pipeline.ops.Effect: a buffer lives from its allocation
    # until the last op that releases it has released it, else until its allocator ends
    released: dict[tuple, float] = {}
    allocated: list[tuple[tuple, int, float, int]] = []  # (key, bytes, time, task)
    completion: dict[int, float] = {}
    for t, eff in enumerate(effects):
        allocated += [(key, size, start[t], t) for key, size in eff.allocs]
        allocated += [(key, size, end[t], t) for key, size in eff.allocs_end]
        for key in eff.releases:
            released[key] = max(released.get(key, -math.inf), end[t])
        for key in eff.releases_start:
            released[key] = max(released.get(key, -math.inf), start[t])
        if eff.temp:
            events[owner[t]] += [(start[t], eff.temp), (end[t], -eff.temp)]
        op = label[t]
        if isinstance(op, Send):
            continue
        if training:
            completion[op.mb] = max(completion.get(op.mb, 0.0), end[t])
        elif op.last == L:
            completion[op.mb] = end[t]
    for key, size, at, t in allocated:
        if size:
            free = max(at, released.get(key, end[t]))
            events[key[0]] += [(at, size), (free, -size)]
    for dev, stages in weights_on.items():
        events[dev].append((0.0, sum(problem.weights[k] for k in stages if k < L)))
    memory, device_peak = {}, {}
    for dev, evs in events.items():
        ts, deltas = _frees_first(evs)
        levels = np.cumsum(deltas)
        memory[dev] = (tuple(ts.tolist()), tuple(levels.tolist()))
        device_peak[dev] = max(0, int(levels.max(initial=0)))
    # outputs are delivered in item order: item n is out once items 0..n are done
    comp = list(itertools.accumulate((completion[n] for n in sorted(completion)), max))
    lat = max((c - n * release_interval for n, c in enumerate(comp)), default=0.0)
    busy: dict = defaultdict(float)
    for t in range(len(res)):
        busy[res[t]] += end[t] - start[t]
    records = tuple(OpRecord(res[t], str(label[t]), start[t], end[t]) for t in range(len(res)))
    return PipelineTrace(
        makespan=max(end, default=0.0),
        period=steady_period(comp[: len(comp) - len(events)] if training else comp, hyper),
        latency=lat,
        peak_memory=max(device_peak.values(), default=0),
        device_peak=device_peak,
        memory=memory,
        completion=tuple(comp),
        records=records,
        busy=dict(busy),
    )


def _frees_first(events: list[tuple[float, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(times, byte deltas) of memory events in time order, frees before allocations at
    equal times; times that differ by float rounding only (1e-9 relative) count as
    equal, so that a buffer freed when the next one is allocated is never counted twice."""
    if not events:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    times = np.array([e[0] for e in events], dtype=float)
    deltas = np.array([e[1] for e in events], dtype=object)
    order = np.argsort(times, kind="stable")
    t = times[order]
    gap = np.diff(t) > 1e-9 * np.maximum(1.0, np.abs(t[:-1]))
    group = np.concatenate([[0], np.cumsum(gap)])
    allocs = np.array([d > 0 for d in deltas[order]])
    order = order[np.lexsort((allocs, group))]
    return times[order], deltas[order]


def judge_pipeline(problem: PipelineProblem, trace: PipelineTrace, budget: int | None) -> dict:
    """The devices' own capacities bound their simulated peaks (``budget``, if given,
    bounds every device too); returns period, latency, throughput and peaks."""
    over = [
        f"{d.name}: {trace.device_peak.get(d.name, 0)} > {d.memory}"
        for d in problem.platform.devices
        if d.memory is not None and trace.device_peak.get(d.name, 0) > d.memory
    ]
    if budget is not None and trace.peak_memory > budget:
        over.append(f"peak {trace.peak_memory} > budget {budget}")
    if over:
        raise InvalidSchedule(f"device memory exceeded ({'; '.join(over)})")
    return {
        "makespan": trace.makespan,
        "peak_memory": trace.peak_memory,
        "device_peak": dict(trace.device_peak),
        "simulated_period": trace.period,
        "latency": trace.latency,
        "throughput": 1 / trace.period if trace.period > 0 else None,
    }


_SPAN_KINDS = {"F": "forward", "B": "backward", "Bi": "backward", "W": "weight_grad",
               "Send": "copy"}  # fmt: skip


def pipeline_lanes(problem: PipelineProblem, schedule, trace: PipelineTrace) -> dict:
    """One lane per device (its compute stream: forward, backward) in platform order,
    then one per directed link ``src->dst`` (its sends: copy), in order of first use."""
    out: dict[str, list[Span]] = {d.name: [] for d in problem.platform.devices}
    for rec in trace.records:
        lane = rec.resource[1] if rec.resource[0] == "compute" else "->".join(rec.resource[1:])
        kind = _SPAN_KINDS.get(rec.op.split("(", 1)[0], "other")
        out.setdefault(lane, []).append(Span(rec.start, rec.end, rec.op, kind))
    return {lane: spans for lane, spans in out.items() if spans}


def pipeline_memory(trace: PipelineTrace) -> tuple[list[float], list[int]]:
    """The largest device memory at every instant (``peak_memory`` is its maximum)."""
    events = sorted(
        (t, k, dev, level)
        for dev, (times, levels) in trace.memory.items()
        for k, (t, level) in enumerate(zip(times, levels, strict=True))
    )
    current: dict[str, int] = {}
    times, values = [0.0], [0]
    for t, _, dev, level in events:
        current[dev] = int(level)
        times.append(t)
        values.append(max(current.values()))
    return times, values

"""Task graphs, and the simulator in which dynamic policies place tasks at run time.

A :class:`TaskGraph` is a DAG of tasks, each with a kind (what runs: e.g. ``"F2"``,
the forward of pipeline group 2), a work in seconds at speed 1, and input edges that
carry bytes. A graph may also name its data (:class:`Datum`: what each task reads and
writes, with sizes and kinds); the runtime then tracks where every datum lives, frees
it when its last reader ran, admits a task on a device only if what it needs fits
there and evicts under pressure (:mod:`schedir.pipeline.runtime`, docs/dynamic_training.md).
Without data, every edge is a datum read by one task.

:func:`simulate_dynamic` runs a graph on a Platform the way a StarPU-like runtime does
(Augonnet et al., "StarPU: a unified platform for task scheduling on heterogeneous
multicore architectures", CCPE 2011); the rules (placement, admission, eviction,
freeing) are those of :class:`schedir.pipeline.runtime.RuntimeState`, which the JAX
runtime drives as well. The simulator adds the clock:

- a transfer takes ``link.time(bytes)`` on its directed link, a serial resource
  (FIFO); moves to and from the host use ``platform.prefetch`` / ``platform.offload``,
  one engine per device and direction (untimed for the initial copy of parameters and
  inputs when the platform has no host link);
- an offload ends before the task that asked for the room begins; the task starts
  computing once its inputs are on its device;
- its compute time is ``work / speed`` times the task's noise factor times its
  device's factor (:func:`task_factors`, :class:`schedir.pipeline.simulate.Noise`);
  recomputing a dropped datum adds its producer's time, with the same factors.

Items (e.g. pipeline inputs) enter through a window: the tasks of item n are not
released before item n - ``window`` is complete (a bounded stream; None: all at once).
"""

from __future__ import annotations

import heapq
import itertools
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from schedir.errors import InvalidProblem
from schedir.pipeline.dataflow import HOST, SOURCES, DynamicTrace
from schedir.pipeline.model import working_set
from schedir.pipeline.problem import PipelineProblem
from schedir.pipeline.runtime import RuntimeState
from schedir.pipeline.simulate import Noise
from schedir.platform import Platform, check_bytes, check_number

# re-exported: a run's trace, the runtime's state, the kinds of data without a producer
__all__ = ["SOURCES", "Datum", "DynamicTrace", "GroupCosts", "RuntimeState", "Task", "TaskGraph",
           "pipeline_graph", "simulate_dynamic", "task_factors", "training_graph",
           "training_task_graph"]  # fmt: skip

DATA_KINDS = ("activation", "stash", "gradient", "input", "param", "accumulator", "output")


@dataclass(frozen=True)
class Datum:
    """One piece of data of a task graph.

    Attributes:
        name: display name, e.g. ``"s2[5]"`` (the stash of group 2, micro-batch 5).
        size: bytes it takes on a device.
        kind: ``"activation"`` (a_k), ``"stash"`` (what a backward needs from its
            forward besides the forward's own inputs), ``"gradient"`` (d_k),
            ``"input"`` (a model input or target) and ``"param"`` (a group's
            parameters), both on the host at the start and copied to every device
            that runs a task reading them; ``"accumulator"`` (a group's parameter
            gradients: each device that runs a task writing it holds its own partial
            sum, updated in place; a task reading it gathers every partial);
            ``"output"`` (read by no task, kept to the end).
        recompute: may be dropped under memory pressure and rebuilt by running its
            producer again (its readers read all of the producer's inputs too).
    """

    name: str
    size: int
    kind: str = "activation"
    recompute: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InvalidProblem(f"datum name = {self.name!r}: expected a string")
        object.__setattr__(self, "size", check_bytes(f"datum {self.name!r} size", self.size))
        if self.kind not in DATA_KINDS:
            raise InvalidProblem(f"datum {self.name!r} kind = {self.kind!r}: expected one of "
                                 f"{', '.join(DATA_KINDS)}")  # fmt: skip
        if not isinstance(self.recompute, bool):
            raise InvalidProblem(f"datum {self.name!r} recompute = {self.recompute!r}: "
                                 "expected a bool")  # fmt: skip


@dataclass(frozen=True)
class Task:
    """One task.

    Attributes:
        name: display name, e.g. ``"F2[5]"``.
        kind: what it runs (the performance model's key), e.g. ``"F2"``.
        work: seconds at speed 1.
        deps: (producer task index, bytes of the edge) pairs.
        item: the stream item it belongs to (None: not part of a stream).
        final: whether its end completes its item.
        reads, writes: indices of the data (``TaskGraph.data``) it reads and writes.
        temp: bytes it needs on its device only while it runs.
    """

    name: str
    kind: str
    work: float
    deps: tuple[tuple[int, int], ...] = ()
    item: int | None = None
    final: bool = False
    reads: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()
    temp: int = 0

    def __post_init__(self) -> None:
        for field_name in ("name", "kind"):
            if not isinstance(getattr(self, field_name), str):
                raise InvalidProblem(f"task {field_name} = {getattr(self, field_name)!r}: "
                                     "expected a string")  # fmt: skip
        label = f"task {self.name!r}"
        object.__setattr__(self, "work", check_number(f"{label} work", self.work, what="time (s)"))
        try:
            deps = tuple((p, n) for p, n in self.deps)
        except (TypeError, ValueError):
            raise InvalidProblem(
                f"{label} deps = {self.deps!r}: expected (task, bytes) pairs"
            ) from None
        for p, n in deps:
            if isinstance(p, bool) or not isinstance(p, numbers.Integral):
                raise InvalidProblem(f"{label}: dep on {p!r}: expected a task index")
            check_bytes(f"{label}: bytes of its dep on {p}", n)
        object.__setattr__(self, "deps", tuple((int(p), int(n)) for p, n in deps))
        item = self.item
        if item is not None and (isinstance(item, bool) or not isinstance(item, numbers.Integral)):
            raise InvalidProblem(f"{label} item = {item!r}: expected an integer or None")
        if not isinstance(self.final, bool):
            raise InvalidProblem(f"{label} final = {self.final!r}: expected a bool")
        for name in ("reads", "writes"):
            ids = getattr(self, name)
            if isinstance(ids, str) or not all(
                isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in ids
            ):
                raise InvalidProblem(f"{label} {name} = {ids!r}: expected datum indices")
            object.__setattr__(self, name, tuple(int(d) for d in ids))
        object.__setattr__(self, "temp", check_bytes(f"{label} temp", self.temp))


@dataclass(frozen=True)
class TaskGraph:
    """Tasks in a topological order (every dep points to an earlier task), optionally
    with their data.

    ``data``: when given, every datum but a source (``"input"``, ``"param"``) has its
    writers (one task, or for an accumulator the tasks adding to it), each before its
    readers and among their deps. ``groups``: the stage range [first, last) of each
    group (kinds ``F{g}``, ``B{g}``, ``W{g}``), when the graph is a pipeline's.
    """

    tasks: tuple[Task, ...]
    data: tuple[Datum, ...] = ()
    groups: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "data", tuple(self.data))
        object.__setattr__(self, "groups", tuple(tuple(g) for g in self.groups))
        for t, task in enumerate(self.tasks):
            if not isinstance(task, Task):
                raise InvalidProblem(f"tasks[{t}] = {task!r}: expected a Task")
            for p, _ in task.deps:
                if not 0 <= p < t:
                    raise InvalidProblem(
                        f"task {task.name!r} (index {t}) depends on task {p}: deps must "
                        "point to earlier tasks (a topological order)"
                    )
            if not self.data and (task.reads or task.writes):
                raise InvalidProblem(f"task {task.name!r} reads or writes data, but the "
                                     "graph lists none")  # fmt: skip
        if self.data:
            self._check_data()

    def _check_data(self) -> None:
        for k, d in enumerate(self.data):
            if not isinstance(d, Datum):
                raise InvalidProblem(f"data[{k}] = {d!r}: expected a Datum")
        writers, readers = self.writers(), self.readers()
        for k, d in enumerate(self.data):
            if d.kind in SOURCES and writers[k]:
                raise InvalidProblem(f"datum {d.name!r} is a {d.kind}: no task writes it")
            if d.kind not in SOURCES and not writers[k]:
                raise InvalidProblem(f"datum {d.name!r}: no task writes it")
            if d.kind != "accumulator" and len(writers[k]) > 1:
                raise InvalidProblem(f"datum {d.name!r} is written by several tasks (only an "
                                     "accumulator may be)")  # fmt: skip
            for r in readers[k]:
                deps = {p for p, _ in self.tasks[r].deps}
                missing = [w for w in writers[k] if w not in deps]
                if missing:
                    raise InvalidProblem(f"task {self.tasks[r].name!r} reads {d.name!r} but does "
                                         f"not depend on its writer "
                                         f"{self.tasks[missing[0]].name!r}")  # fmt: skip
            if d.recompute:
                if d.kind in SOURCES or d.kind == "accumulator":
                    raise InvalidProblem(f"datum {d.name!r}: a {d.kind} cannot be recomputed")
                inputs = set(self.tasks[writers[k][0]].reads)
                for r in readers[k]:
                    lost = inputs - set(self.tasks[r].reads)
                    if lost:
                        raise InvalidProblem(
                            f"datum {d.name!r} may be recomputed, so its reader "
                            f"{self.tasks[r].name!r} must read its producer's inputs too "
                            f"(it does not read {self.data[min(lost)].name!r})"
                        )

    def writers(self) -> list[list[int]]:
        """Tasks writing each datum."""
        out: list[list[int]] = [[] for _ in self.data]
        for t, task in enumerate(self.tasks):
            for d in task.writes:
                self._datum(d, task)
                out[d].append(t)
        return out

    def readers(self) -> list[list[int]]:
        """Tasks reading each datum (each once)."""
        out: list[list[int]] = [[] for _ in self.data]
        for t, task in enumerate(self.tasks):
            for d in dict.fromkeys(task.reads):
                self._datum(d, task)
                out[d].append(t)
        return out

    def _datum(self, d: int, task: Task) -> None:
        if not 0 <= d < len(self.data):
            raise InvalidProblem(f"task {task.name!r} uses datum {d}: out of range "
                                 f"0..{len(self.data) - 1}")  # fmt: skip

    def successors(self) -> list[list[int]]:
        succ: list[list[int]] = [[] for _ in self.tasks]
        for t, task in enumerate(self.tasks):
            for p in dict.fromkeys(p for p, _ in task.deps):
                succ[p].append(t)
        return succ


@dataclass(frozen=True)
class GroupCosts:
    """What one group of stages costs in a training step (per micro-batch but ``update``).

    Attributes:
        first, last: its stages [first, last).
        forward, backward, update: seconds at speed 1 of its forward and backward of
            one micro-batch (the loss in the last group's backward) and of its
            parameter update (once per step).
        input_bytes: a_first, and its gradient d_first (0 for group 0: the model's
            input is a source of ``input_bytes`` and its gradient is not computed).
        stash_bytes: what the backward needs from the forward besides its inputs.
        param_bytes, grad_bytes: its parameters, and one partial gradient sum.
        forward_temp, backward_temp: bytes live only inside the forward / backward.
        update_bytes: what the update writes (kept to the end of the step).
    """

    first: int
    last: int
    forward: float
    backward: float
    update: float
    input_bytes: int
    stash_bytes: int
    param_bytes: int
    grad_bytes: int
    forward_temp: int = 0
    backward_temp: int = 0
    update_bytes: int = 0


def training_task_graph(
    groups: Sequence[GroupCosts], microbatches: int, target_bytes: int = 0
) -> TaskGraph:
    """The training step of a pipeline as a task graph with its data.

    Per micro-batch n and group g: ``F{g}[n]`` reads a_g[n] (``x[n]`` for g = 0, a
    source) and the group's parameters ``w{g}``, writes a_{g+1}[n] (nothing for the
    last group: its forward ends with the loss, which also reads the target ``y[n]``
    when ``target_bytes`` > 0) and the stash ``s{g}[n]`` (recomputable);
    ``B{g}[n]`` reads what ``F{g}[n]`` read, the stash and d_{g+1}[n] (not for the
    last group), writes d_g[n] (not for g = 0) and adds the parameter gradients to
    the accumulator ``acc{g}``. Per group, ``W{g}`` (after every ``B{g}``) reads the
    parameters and the accumulator (all partials) and writes ``u{g}`` (an output).
    Items are micro-batches; ``B0[n]`` completes item n.
    """
    m = microbatches
    if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
        raise InvalidProblem(f"microbatches = {m!r}: expected an integer >= 1")
    G = len(groups)
    if not G:
        raise InvalidProblem("training graph: no groups")
    data: list[Datum] = []

    def datum(name: str, size: int, kind: str, recompute: bool = False) -> int:
        data.append(Datum(name, size, kind, recompute))
        return len(data) - 1

    params = [datum(f"w{g}", c.param_bytes, "param") for g, c in enumerate(groups)]
    accs = [datum(f"acc{g}", c.grad_bytes, "accumulator") for g, c in enumerate(groups)]
    tasks: list[Task] = []
    bwd_ids: list[list[int]] = [[] for _ in groups]
    for n in range(m):
        a = datum(f"x[{n}]", groups[0].input_bytes, "input")
        y = datum(f"y[{n}]", target_bytes, "input") if target_bytes else None
        f_reads, f_ids, stash = [], [], []
        for g, c in enumerate(groups):
            reads = [a, params[g]] + ([y] if y is not None and g == G - 1 else [])
            s = datum(f"s{g}[{n}]", c.stash_bytes, "stash", recompute=True)
            writes = [s]
            nxt = None
            if g + 1 < G:
                nxt = datum(f"a{g + 1}[{n}]", groups[g + 1].input_bytes, "activation")
                writes.append(nxt)
            deps = ((len(tasks) - 1, c.input_bytes),) if g else ()
            tasks.append(Task(f"F{g}[{n}]", f"F{g}", c.forward, deps, n, False,
                              tuple(reads), tuple(writes), c.forward_temp))  # fmt: skip
            f_reads.append(reads)
            f_ids.append(len(tasks) - 1)
            stash.append(s)
            a = nxt
        d_in = None
        for g in reversed(range(G)):
            c = groups[g]
            reads = [*f_reads[g], stash[g]]
            deps = [(f_ids[g], c.stash_bytes)] + ([(f_ids[g - 1], c.input_bytes)] if g else [])
            if d_in is not None:
                reads.append(d_in)
                deps.append((len(tasks) - 1, groups[g + 1].input_bytes))
            writes = [accs[g]]
            d_in = None
            if g > 0:
                d_in = datum(f"d{g}[{n}]", c.input_bytes, "gradient")
                writes.append(d_in)
            tasks.append(Task(f"B{g}[{n}]", f"B{g}", c.backward, tuple(deps), n, g == 0,
                              tuple(reads), tuple(writes), c.backward_temp))  # fmt: skip
            bwd_ids[g].append(len(tasks) - 1)
    for g, c in enumerate(groups):
        out = datum(f"u{g}", c.update_bytes, "output")
        deps = tuple((b, c.grad_bytes) for b in bwd_ids[g])
        tasks.append(Task(f"W{g}", f"W{g}", c.update, deps, None, False,
                          (params[g], accs[g]), (out,)))  # fmt: skip
    return TaskGraph(tuple(tasks), tuple(data), tuple((c.first, c.last) for c in groups))


def training_graph(
    problem: PipelineProblem,
    microbatches: int | None = None,
    cuts: Sequence[int] | None = None,
    update_time: float = 0.0,
) -> TaskGraph:
    """:func:`training_task_graph` of a training problem's chain, one group per
    interval [cuts[g], cuts[g+1]) (default: one per stage): forward and backward times
    from the chain (the loss in the last backward), input sizes ``in_size``, stash
    ``sum(saved_size)``, temporaries :func:`schedir.pipeline.working_set`, parameters
    ``weights`` (which count their gradients and optimizer state: the accumulators
    and the updates take no extra bytes), updates ``update_time`` seconds per group."""
    c, L = problem.chain, problem.length
    cuts = tuple(cuts or range(L + 1))
    if cuts[0] != 0 or cuts[-1] != L or any(a >= b for a, b in itertools.pairwise(cuts)):
        raise InvalidProblem(f"cuts = {cuts}: expected increasing stage indices from 0 to {L}")
    groups = []
    for i, j in itertools.pairwise(cuts):
        bwd = sum(c.bwd_time[i:j]) + (c.fwd_time[L] + c.bwd_time[L] if j == L else 0.0)
        groups.append(GroupCosts(
            i, j, sum(c.fwd_time[i:j]), bwd, update_time, c.in_size[i], sum(c.saved_size[i:j]),
            sum(problem.weights[i:j]), 0, working_set(problem, i, j),
            working_set(problem, i, j, backward=True)))  # fmt: skip
    return training_task_graph(groups, microbatches or problem.microbatches)


def pipeline_graph(problem: PipelineProblem, items: int, cuts: tuple[int, ...] | None = None):
    """The task graph of ``items`` items (micro-batches) through the chain, one task
    per group of stages [cuts[g], cuts[g+1]) (default: one per stage), without data
    (each edge is what one task reads). Inference: forwards ``F{g}`` chained by a_cut;
    training adds backwards ``B{g}`` that need d from the next group and the stash
    (sum of saved_size) of their own forward; :func:`training_graph` gives the whole
    training step with its data."""
    L, c = problem.length, problem.chain
    cuts = tuple(cuts or range(L + 1))
    G = len(cuts) - 1
    tasks: list[Task] = []
    for n in range(items):
        f_ids = []
        for g in range(G):
            i, j = cuts[g], cuts[g + 1]
            deps = ((len(tasks) - 1, c.in_size[i]),) if g else ()
            w = sum(c.fwd_time[i:j])
            final = not problem.training and g == G - 1
            tasks.append(Task(f"F{g}[{n}]", f"F{g}", w, deps, n, final))
            f_ids.append(len(tasks) - 1)
        if problem.training:
            for g in reversed(range(G)):
                i, j = cuts[g], cuts[g + 1]
                deps = [(f_ids[g], sum(c.saved_size[i:j]))]
                w = sum(c.bwd_time[i:j])
                if g < G - 1:
                    deps.append((len(tasks) - 1, c.in_size[j]))
                else:
                    w += c.fwd_time[L] + c.bwd_time[L]
                tasks.append(Task(f"B{g}[{n}]", f"B{g}", w, tuple(deps), n, g == 0))
    groups = tuple(itertools.pairwise(cuts))
    return TaskGraph(tuple(tasks), groups=groups)


def task_factors(noise: Noise | None, count: int) -> list[float]:
    """The noise factor of each of ``count`` tasks, drawn in task order from the
    noise's generator (so a run's factors do not depend on the order tasks start in,
    and the simulator and the JAX runtime draw the same ones)."""
    noise = noise or Noise()
    rng = noise.generator()
    return [noise.factor(rng) for _ in range(count)]


def simulate_dynamic(
    graph: TaskGraph,
    platform: Platform,
    policy,
    *,
    noise: Noise | None = None,
    window: int | None = None,
    memory: dict | None = None,
    prefetch: bool = True,
) -> DynamicTrace:
    """Run ``graph`` under ``policy`` (see the module docstring); deterministic per seed.

    ``memory``: device name -> bytes it may hold, in place of the devices' own
    ``memory``. ``prefetch``: move a task's inputs when it is placed (if they fit),
    not only when its device admits it (the JAX runtime moves them at admission).
    """
    now = [0.0]
    state = RuntimeState(graph, platform, policy, clock=lambda: now[0], window=window,
                         memory=memory, prefetch=prefetch)  # fmt: skip
    factors = task_factors(noise, len(graph.tasks))
    dev_factor = (noise or Noise()).device_factors(state.names)
    events: list = []
    seq = itertools.count()
    waiting: dict = {u: None for u in state.names}  # plan's data not yet on the device
    offloads: dict = dict.fromkeys(state.names, 0)
    plans: dict = {}

    def transfer(d: int, src: str, dst: str) -> None:
        key = (src, dst)
        s = max(now[0], state.link_free.get(key, 0.0))
        e = s + state.transfer_time(src, dst, state.size[d], d)
        if e > s:
            state.link_free[key] = e
        state.expect(d, dst, e)
        state.transfers.append((src, dst, state.size[d], s, e))
        heapq.heappush(events, (e, next(seq), "arrive", (d, src, dst)))

    def drain() -> None:
        for d, src, dst in state.take_transfers():
            transfer(d, src, dst)

    def compute(u: str) -> None:
        plan = plans[u]
        t = plan.task
        waiting[u] = None
        state.started(t)
        f = factors[t] * dev_factor[u]
        seconds = state.nominal(t, u) * f
        extra = sum(state.nominal(state.producer[d], u) for d in plan.recompute) * f
        heapq.heappush(events, (now[0] + extra + seconds, next(seq), "end", (t, seconds, extra)))

    def begin(u: str) -> None:
        plan = plans[u]
        state.begin(plan)
        waiting[u] = {("fetch", d, src) for d, src in plan.fetch}
        waiting[u].update(("wait", d) for d in plan.wait if state.copies[d].get(u) != "present")
        for d, src in plan.fetch:
            transfer(d, src, u)
        if not waiting[u]:
            compute(u)

    def admit(u: str) -> None:
        plan = state.next_plan(u)
        if plan is None:
            return
        plans[u] = plan
        for d, mode in plan.evict:
            if mode == "offload":
                key = (u, HOST)
                s = max(now[0], state.link_free.get(key, 0.0))
                e = s + state.transfer_time(u, HOST, state.size[d])
                state.link_free[key] = e
                state.transfers.append((u, HOST, state.size[d], s, e))
                offloads[u] += 1
                heapq.heappush(events, (e, next(seq), "offloaded", (d, u)))
        if not offloads[u]:
            begin(u)

    state.start_run()
    drain()
    while True:
        for u in state.names:
            if state.busy[u] is None:
                admit(u)
        drain()
        if not events:
            break
        now[0], _, kind, what = heapq.heappop(events)
        if kind == "offloaded":
            d, u = what
            state.offloaded(d, u)
            offloads[u] -= 1
            if not offloads[u]:
                begin(u)
        elif kind == "arrive":
            d, src, dst = what
            state.arrived(d, dst, src)
            w = waiting[dst]
            if w is not None:
                w.discard(("fetch", d, src))
                if state.copies[d].get(dst) == "present":
                    w.discard(("wait", d))
                if not w:
                    compute(dst)
        else:
            t, seconds, extra = what
            state.finished(t, seconds, extra)
        drain()
    state.check_done()
    return state.trace()

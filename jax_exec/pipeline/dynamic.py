"""Dynamic mode: the tasks of a pipeline placed and started at run time, in JAX.

One worker thread per device carries out what :class:`schedir.dynamic.RuntimeState`
decides under the policy (``solvers.pipeline.dynamic``: the same objects, the same
rules as in the simulator): which task a device starts, what it evicts first (to the
host with ``jax.device_get``, or dropped and recomputed), what it moves in
(``jax.device_put`` from the copy the state names), and what is freed when its last
reader ran. Every task's duration is measured (``block_until_ready``) and fed to the
policy; the memory the runtime holds on each device (the bytes of the distinct arrays
it keeps there: data, stashes, i.e. the leaves of ``jax.vjp`` closures, parameter
copies, gradient accumulators, updates) is measured after every task.

- :func:`run_dynamic`: inference, the forwards of groups of stages;
- :func:`jax_exec.pipeline.dynamic_training.run_dynamic_training`: a training step.

Experiment knobs (docs/dynamic_training.md): ``speeds`` (a speed factor per device) and
``noise`` (:class:`schedir.pipeline.simulate.Noise`: seeded per-task factors and
per-device factors, the simulator's law and draws) make task ``t`` on device ``u``
last ``work_t / speed_u * factor_t * factor_u`` seconds, ``work_t`` its calibrated
time times ``time_scale``: the worker sleeps for what the kernel did not take (a task
whose kernel is slower than that lasts as long as the kernel).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.execute.result import RunResult
from jax_exec.pipeline.mpmd import interval_kernels, split_microbatches
from jax_exec.stages.split import as_stages
from schedir import CopyEngine, Device, Link, Platform
from schedir.dynamic import HOST, RuntimeState, Task, TaskGraph, simulate_dynamic, task_factors
from schedir.pipeline.simulate import Noise
from solvers.pipeline.dynamic import Dmda, make_policy


def move(tree: Any, to: Any) -> Any:
    """``tree`` on device ``to`` (None: to the host, as numpy), each distinct leaf once."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    uniq = {id(a): a for a in leaves}
    keys = list(uniq)
    moved = jax.device_get([uniq[k] for k in keys]) if to is None else jax.device_put(
        [uniq[k] for k in keys], to)  # fmt: skip
    new = dict(zip(keys, moved, strict=True))
    return jax.tree_util.tree_unflatten(treedef, [new[id(a)] for a in leaves])


tree_add = jax.jit(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b))


@dataclass(frozen=True)
class TaskOutput:
    """What one task made on its device: ``values`` (datum -> new value), its compute
    ``seconds`` and the ``recompute_seconds`` spent rebuilding dropped inputs first."""

    values: dict
    seconds: float
    recompute_seconds: float = 0.0


class Workers:
    """Worker threads carrying out a RuntimeState's plans on real arrays.

    ``compute(t, u, values, rebuilt)``: runs task ``t`` on device ``u`` with
    ``values`` (datum -> array on u, accumulators: the list of partial sums) and the
    rebuilt stashes; returns a :class:`TaskOutput`. ``sources``: the host values of
    the graph's sources (datum -> value).
    """

    def __init__(self, state: RuntimeState, jdev: dict, sources: dict, compute: Callable):
        self.state, self.jdev, self.compute = state, jdev, compute
        self.dev_name = {d: u for u, d in jdev.items()}
        self.store: dict = {}  # (datum, device) -> value on that device
        self.host: dict = dict(sources)  # datum -> value on the host
        self.lock = threading.Condition()
        self.todo: dict = dict.fromkeys(jdev)  # device -> the plan its worker carries out
        self.error: BaseException | None = None
        self.stalled = False
        self.measured: list = []  # per finished task: device -> bytes held there
        self.peaks = dict.fromkeys(jdev, 0)

    def run(self) -> None:
        with self.lock:
            self.state.start_run()
            self._dispatch()
        threads = [threading.Thread(target=self._worker, args=(u,), daemon=True)
                   for u in self.jdev]  # fmt: skip
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if self.error is not None:
            raise self.error
        self.state.check_done()

    def _dispatch(self) -> None:
        """Admit a task on every idle device, as the simulator does (called locked)."""
        state = self.state
        for u in state.names:
            if state.idle(u):
                plan = state.next_plan(u)
                if plan is not None:
                    self.todo[u] = plan
        self._drop_freed()
        if state.stalled:
            self.stalled = True  # nothing can start anywhere: check_done says why
        self.lock.notify_all()

    def _drop_freed(self) -> None:
        for d, where in self.state.take_freed():
            if where == HOST:
                self.host.pop(d, None)
            else:
                self.store.pop((d, where), None)

    def _worker(self, u: str) -> None:
        try:
            while self._step(u):
                pass
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            with self.lock:
                self.error = self.error or err
                self.lock.notify_all()

    def _step(self, u: str) -> bool:
        """Carry out the next plan of device ``u``; False when the run is over."""
        state, lay = self.state, self.state.layout
        with self.lock:
            while self.todo[u] is None:
                if self.error is not None or self.stalled or state.finished_all:
                    return False
                self.lock.wait()
            plan, self.todo[u] = self.todo[u], None
            offload = [(d, self.store[d, u]) for d, mode in plan.evict if mode == "offload"]
        for d, value in offload:
            host = move(value, None)
            with self.lock:
                self.host[d] = host
                state.offloaded(d, u)
                self._drop_freed()
        with self.lock:
            state.begin(plan)
            moves = [(d, src, self.host[d] if src == HOST else self.store[d, src])
                     for d, src in plan.fetch]  # fmt: skip
        partials = []
        for d, src, value in moves:
            moved = move(value, self.jdev[u])
            with self.lock:
                if lay.kind[d] == "accumulator":
                    partials.append(moved)
                else:
                    self.store[d, u] = moved
                state.arrived(d, u, src)
        t = plan.task
        with self.lock:
            state.started(t)
            values = {}
            for d in lay.reads[t]:
                if lay.kind[d] == "accumulator":
                    values[d] = ([self.store[d, u]] if (d, u) in self.store else []) + partials
                elif d not in plan.recompute:
                    values[d] = self.store[d, u]
            for d in lay.writes[t]:
                if lay.kind[d] == "accumulator" and (d, u) in self.store:
                    values[d] = [self.store[d, u]]
        out = self.compute(t, u, values, plan.recompute)
        with self.lock:
            for d, value in out.values.items():
                self.store[d, u] = value
            del partials, values
            state.finished(t, out.seconds, out.recompute_seconds)
            self._drop_freed()
            self._measure()
            self._dispatch()
        return True

    def _measure(self) -> None:
        """Bytes of the distinct arrays the runtime holds per device (called locked)."""
        seen: dict = {}
        for value in self.store.values():
            for leaf in jax.tree_util.tree_leaves(value):
                if isinstance(leaf, jax.Array):
                    seen[id(leaf)] = leaf
        held = dict.fromkeys(self.jdev, 0)
        for leaf in seen.values():
            for dev in leaf.devices():
                held[self.dev_name[dev]] += int(leaf.nbytes)
        self.measured.append(held)
        for u, b in held.items():
            self.peaks[u] = max(self.peaks[u], b)


def device_platform(names, speeds, caps, bandwidth, host_bandwidth) -> Platform:
    devices = [Device(u, float(speeds.get(u, 1.0)), caps.get(u)) for u in names]
    links = tuple(Link(a, b, bandwidth) for a in names for b in names if a != b)
    if host_bandwidth:
        engine = CopyEngine(host_bandwidth)
        return Platform(offload=engine, prefetch=engine, devices=tuple(devices), links=links)
    return Platform(devices=tuple(devices), links=links)


def per_device(value, names: list[str], what: str) -> dict:
    """A per-device knob: one value for all, a list in device order, or a dict."""
    if value is None:
        return {}
    if isinstance(value, dict):
        unknown = set(value) - set(names)
        if unknown:
            raise ValueError(f"{what}: unknown devices {sorted(unknown)}; known: {names}")
        return dict(value)
    if isinstance(value, list | tuple):
        if len(value) != len(names):
            raise ValueError(f"{what}: {len(value)} values for {len(names)} devices")
        return dict(zip(names, value, strict=True))
    return dict.fromkeys(names, value)


def emulation(graph: TaskGraph, state: RuntimeState, noise: Noise | None, on: bool):
    """``(task, device, seconds, recomputed) -> seconds``: the knob's duration of a task
    whose kernels took ``seconds`` (sleeps for the rest), or None when off."""
    if not on:
        return None
    noise = noise or Noise()
    factors = task_factors(noise, len(graph.tasks))
    dev_factor = noise.device_factors(state.names)

    def emulate(t: int, u: str, work: float, began: float) -> float:
        target = work / state.speed[u] * factors[t] * dev_factor[u]
        left = target - (time.perf_counter() - began)
        if left > 0:
            time.sleep(left)
        return time.perf_counter() - began

    return emulate


def _timed(fn, *args):
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter()


def run_dynamic(
    layers: Sequence[Any],
    x: Any,
    *,
    policy: str = "dmda",
    microbatches: int = 8,
    cuts: Sequence[int] | None = None,
    devices: Sequence | None = None,
    bandwidth: float = 10e9,
) -> RunResult:
    """Run the forward pipeline of ``layers`` on ``x`` with tasks placed by ``policy``
    (any of ``solvers.pipeline.dynamic.POLICIES``; ``static`` and ``guided`` follow
    HEFT's lists). The tasks are (micro-batch n, group g): the forward of stages
    [cuts[g], cuts[g+1]) on micro-batch n, which needs (n, g - 1). The model is
    calibrated first (every group timed once on every device); the same policy is
    then run in the simulator on the same graph (``predicted``).

    ``devices``: JAX devices (default ``jax.devices()``); ``bandwidth``: bytes/s the
    policy assumes for every link.
    """
    stages = as_stages(layers)
    L = len(stages)
    cuts = tuple(cuts or range(L + 1))
    G = len(cuts) - 1
    devs = list(devices if devices is not None else jax.devices())
    names = [f"dev{k}" for k in range(len(devs))]
    jdev = dict(zip(names, devs, strict=True))
    platform = device_platform(names, {}, {}, bandwidth, None)
    xs = split_microbatches(jnp.asarray(x), microbatches)
    kernels = [interval_kernels(stages, cuts[g], cuts[g + 1]).fwd for g in range(G)]
    host_params = [group_state(stages, cuts[g], cuts[g + 1]) for g in range(G)]
    params = {(u, g): move(host_params[g], jdev[u]) for u in names for g in range(G)}
    calib: dict = {}
    a, sizes = xs[0], []
    for g in range(G):
        sizes.append(int(a.nbytes))
        outs = {}
        for u in names:
            inp = jax.device_put(a, jdev[u])
            jax.block_until_ready(kernels[g](*params[u, g], inp))
            t = time.perf_counter()
            outs[u], end = _timed(kernels[g], *params[u, g], inp)
            calib[f"F{g}", u] = end - t
        a = outs[names[0]]
    tasks = []
    for n in range(microbatches):
        for g in range(G):
            deps = ((len(tasks) - 1, sizes[g]),) if g else ()
            mean = sum(calib[f"F{g}", u] for u in names) / len(names)
            tasks.append(Task(f"F{g}[{n}]", f"F{g}", mean, deps, n, g == G - 1))
    graph = TaskGraph(tuple(tasks), groups=tuple(zip(cuts, cuts[1:], strict=False)))

    def fresh():
        pol = make_policy(policy, graph, platform)
        if isinstance(pol, Dmda):
            for (kind, u), sec in calib.items():
                pol.model.record(next(t for t, tk in enumerate(tasks) if tk.kind == kind), u, sec)
        return pol

    predicted = simulate_dynamic(graph, platform, fresh(), prefetch=False)
    pol = fresh()
    t0 = time.perf_counter()
    state = RuntimeState(graph, platform, pol, clock=lambda: time.perf_counter() - t0,
                         prefetch=False)  # fmt: skip
    results: dict = {}

    def compute(t, u, values, rebuilt):
        n, g = divmod(t, G)
        inp = jax.device_put(xs[n], jdev[u]) if g == 0 else next(iter(values.values()))
        began = time.perf_counter()
        out, end = _timed(kernels[g], *params[u, g], inp)
        if g == G - 1:
            results[n] = out
            return TaskOutput({}, end - began)
        return TaskOutput({state.layout.writes[t][0]: out}, end - began)

    workers = Workers(state, jdev, {}, compute)
    workers.run()
    first = jdev[names[0]]
    outputs = jnp.concatenate([jax.device_put(results[n], first) for n in range(microbatches)])
    return dynamic_result(state, graph, pol, predicted, jdev, workers, outputs=outputs)


def group_state(stages, i: int, j: int) -> tuple[list, list]:
    """(params, rests) of stages i..j-1, as the kernels take them."""
    return [s.params for s in stages[i:j]], [s.rest for s in stages[i:j]]


def dynamic_result(state, graph, pol, predicted, jdev, workers, **fields) -> RunResult:
    trace = state.trace()
    start = min(trace.start)
    same = sum(a == b for a, b in zip(trace.device, predicted.device, strict=True))
    model = {}
    if isinstance(pol, Dmda):
        m = pol.model
        model = {f"{k}@{u}": m.total[k, u] / m.count[k, u] for (k, u) in m.count if m.count[k, u]}
    rows = zip(trace.device, graph.tasks, trace.start, trace.end, strict=True)
    return RunResult(
        makespan=trace.makespan - start,
        total_time=trace.makespan - start,
        op_log=tuple((dev, task.name, s - start, e - start) for dev, task, s, e in rows),
        placement=jdev,
        predicted=predicted,
        same_device=same / len(graph.tasks),
        counts=dict(Counter(trace.device)),
        predicted_counts=dict(Counter(predicted.device)),
        perf_model=model,
        device_peaks=dict(workers.peaks),
        trace=trace,
        measured_bytes=tuple(workers.measured),
        **fields,
    )

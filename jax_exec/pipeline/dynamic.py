"""Dynamic mode: the tasks of a pipeline placed at run time by ``dmda`` or ``eager``.

The tasks are (micro-batch n, group g): the forward of stages [cuts[g], cuts[g+1]) on
micro-batch n, which needs (n, g - 1). One worker thread per device runs its queue
(``dmda``) or takes the oldest ready task from a shared pool when idle (``eager``);
inputs are moved with ``jax.device_put``; every task's duration is measured
(``block_until_ready``) and fed to a history-based performance model, the mean per
(task kind, device), as StarPU does (Augonnet et al., CCPE 2011). The model is
calibrated first: every group is run once (compiled on the first call only: the
kernels are cached across calls) and then timed once on every device.

The same policy is then run in the simulator (:func:`schedir.simulate_dynamic`) on the
same task graph with the calibrated times: the result compares the realized
placement and makespan with that prediction. Inference only (forward tasks).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.pipeline.mpmd import interval_kernels, split_microbatches
from jax_exec.result import RunResult
from jax_exec.stages import as_stages
from schedir import Device, Platform
from schedir.pipeline.dag import Task, TaskGraph, simulate_dynamic
from solvers.pipeline.dynamic import Dmda, Eager, HistoryModel

# The one result type (kept importable under its old name): ``outputs``, ``makespan``,
# ``op_log`` (device, task, start, end per task, in task order n * G + g),
# ``predicted``, ``same_device``, ``counts``, ``predicted_counts``, ``perf_model``.
DynamicRunResult = RunResult


class _RealState:
    """What the policies read (the interface of ``schedir.pipeline.dag.DynamicSim``)."""

    def __init__(self, graph: TaskGraph, platform: Platform, t0: float):
        self.graph, self.platform, self.t0 = graph, platform, t0
        self.names = [d.name for d in platform.devices]
        self.links = {(lk.src, lk.dst): lk for lk in platform.links}
        n = len(graph.tasks)
        self.device: list = [None] * n
        self.start, self.end = [float("nan")] * n, [float("nan")] * n
        self.predicted_end: list = [None] * n
        self.queue = {u: deque() for u in self.names}
        self.running: dict = {u: None for u in self.names}

    @property
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def data_ready_estimate(self, task: int, dev: str) -> float:
        ready = self.now
        for p, nbytes in self.graph.tasks[task].deps:
            src = self.device[p]
            if src != dev:
                ready = max(ready, self.now + self.links[src, dev].time(nbytes))
        return ready

    def queue_end(self, dev: str, predict) -> float:
        t = self.now
        run = self.running[dev]
        if run is not None:
            t = max(t, self.start[run] + predict(run, dev))
        for q in self.queue[dev]:
            t += predict(q, dev)
        return t


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
    """Run the forward pipeline of ``layers`` on ``x`` with tasks placed by ``policy``.

    ``devices``: JAX devices (default ``jax.devices()``); ``bandwidth``: bytes/s the
    policy assumes for every link (the platform handed to the policy and simulator).
    """
    if policy not in ("dmda", "eager"):
        raise ValueError(f"policy = {policy!r}: expected 'dmda' or 'eager'")
    stages = as_stages(layers)
    L = len(stages)
    cuts = tuple(cuts or range(L + 1))
    G = len(cuts) - 1
    devs = list(devices if devices is not None else jax.devices())
    names = [f"dev{k}" for k in range(len(devs))]
    jdev = dict(zip(names, devs, strict=True))
    platform = Platform.fully_connected([Device(n) for n in names], bandwidth)
    xs = split_microbatches(jnp.asarray(x), microbatches)
    # compiled once across calls (jax_exec.pipeline's kernel cache); the parameters and
    # state are arguments, read now
    kernels = [interval_kernels(stages, cuts[g], cuts[g + 1]).fwd for g in range(G)]
    fns = [partial(_call, kernels[g]) for g in range(G)]
    params = {
        (u, g): jax.device_put(
            ([s.params for s in stages[cuts[g] : cuts[g + 1]]],
             [s.rest for s in stages[cuts[g] : cuts[g + 1]]]),
            jdev[u],
        )
        for u in names
        for g in range(G)
    }  # fmt: skip
    # calibration: compile, then time each group once on each device
    calib: dict = {}
    a = xs[0]
    for g in range(G):
        outs = {}
        for u in names:
            inp = jax.device_put(a, jdev[u])
            jax.block_until_ready(fns[g](params[u, g], inp))
            t = time.perf_counter()
            outs[u] = jax.block_until_ready(fns[g](params[u, g], inp))
            calib[f"F{g}", u] = time.perf_counter() - t
        a = outs[names[0]]
    sizes = [int(a.nbytes) for a in _activations(fns, params, names[0], xs[0], G)]
    tasks = []
    for n in range(microbatches):
        for g in range(G):
            deps = ((len(tasks) - 1, sizes[g]),) if g else ()
            mean = sum(calib[f"F{g}", u] for u in names) / len(names)
            tasks.append(Task(f"F{g}[{n}]", f"F{g}", mean, deps, n, g == G - 1))
    graph = TaskGraph(tuple(tasks))

    def make_policy():
        if policy == "eager":
            return Eager(graph, platform)
        model = HistoryModel(graph, {u: 1.0 for u in names})
        for (kind, u), sec in calib.items():
            model.record(next(t for t, tk in enumerate(graph.tasks) if tk.kind == kind), u, sec)
        return Dmda(graph, platform, model)

    predicted = simulate_dynamic(graph, platform, make_policy())
    pol = make_policy()
    state = _RealState(graph, platform, time.perf_counter())
    lock = threading.Condition()
    pool: deque = deque()
    values: dict = {}
    missing = [len(t.deps) for t in graph.tasks]
    succ = graph.successors()
    left = [len(graph.tasks)]

    def push(t: int) -> None:  # called with the lock held
        dev = pol.push(t, state)
        if dev is None:
            pool.append(t)
        else:
            state.device[t] = dev
            state.queue[dev].append(t)
        lock.notify_all()

    def worker(u: str) -> None:
        while True:
            with lock:
                while not state.queue[u] and not (policy == "eager" and pool) and left[0]:
                    lock.wait()
                if not left[0]:
                    return
                if state.queue[u]:
                    t = state.queue[u].popleft()
                else:
                    t = pol.pull(u, pool, state)
                    pool.remove(t)
                    state.device[t] = u
                state.running[u] = t
                state.start[t] = state.now
                n, g = divmod(t, G)
                inp = xs[n] if g == 0 else values[t - 1]
            out = jax.block_until_ready(fns[g](params[u, g], jax.device_put(inp, jdev[u])))
            with lock:
                state.end[t] = state.now
                state.running[u] = None
                values[t] = out
                pol.complete(t, u, state.end[t] - state.start[t], state)
                left[0] -= 1
                for s in succ[t]:
                    missing[s] -= 1
                    if missing[s] == 0:
                        push(s)
                lock.notify_all()

    with lock:
        for t in range(len(graph.tasks)):
            if missing[t] == 0:
                push(t)
    threads = [threading.Thread(target=worker, args=(u,), daemon=True) for u in names]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    first = jdev[names[0]]
    outputs = jnp.concatenate(
        [jax.device_put(values[n * G + G - 1], first) for n in range(microbatches)]
    )
    same = sum(a == b for a, b in zip(state.device, predicted.device, strict=True))
    model = {}
    if isinstance(pol, Dmda):
        m = pol.model
        model = {f"{k}@{u}": m.total[k, u] / m.count[k, u] for (k, u) in m.count if m.count[k, u]}
    tasks = zip(state.device, graph.tasks, state.start, state.end, strict=True)
    return RunResult(
        outputs=outputs,
        makespan=max(state.end) - min(state.start),
        total_time=max(state.end) - min(state.start),
        op_log=tuple((dev, task.name, start, end) for dev, task, start, end in tasks),
        placement=jdev,
        predicted=predicted,
        same_device=same / len(graph.tasks),
        counts=dict(Counter(state.device)),
        predicted_counts=dict(Counter(predicted.device)),
        perf_model=model,
    )


def _call(kernel, held, a):
    """``kernel(params, rests, a)`` with ``held`` = (params, rests) of its stages."""
    return kernel(held[0], held[1], a)


def _activations(fns, params, u, x, G) -> list:
    """a_{cuts[g]} of one micro-batch for g = 0..G-1 (their sizes weigh the edges)."""
    acts, a = [], x
    for g in range(G):
        acts.append(a)
        a = fns[g](params[u, g], a)
    return acts

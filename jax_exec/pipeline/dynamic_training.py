"""Dynamic training in JAX: one training step whose tasks the policy places and
starts at run time (:func:`run_dynamic_training`; the runtime of
:mod:`jax_exec.pipeline.dynamic`, docs/dynamic_training.md).

The step is the graph of :func:`schedir.dynamic.training_task_graph`: per group
of stages and micro-batch a forward (``jax.vjp`` of the group's kernel: the residuals
of its closure, parameters left out, are the stash) and a backward (the closure
rebuilt from the parameters and the stash, applied to the incoming gradient), per
group an update task. Sizes and times are calibrated on the devices first (every
kernel compiled and timed once per device; the kernels are cached across calls).
Parameters start on the host (the layers' arrays) and are copied to every device that
runs a task of their group; each device sums the parameter gradients of the backwards
it ran (its partial accumulator), and the update task gathers the partial sums on its
device. A dropped stash is rebuilt by running the forward again on the same inputs,
which gives the same closure; loss and gradients equal those of the single-device
model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.execute.result import RunResult, distinct_bytes
from jax_exec.pipeline.chunks import ChunkKernels, given_stages
from jax_exec.pipeline.dynamic import (
    TaskOutput,
    Workers,
    device_platform,
    dynamic_result,
    emulation,
    group_state,
    move,
    per_device,
    tree_add,
)
from jax_exec.pipeline.mpmd import interval_kernels, split_microbatches
from schedir.dynamic import GroupCosts, RuntimeState, simulate_dynamic, training_task_graph
from schedir.pipeline.simulate import Noise
from solvers.pipeline.dynamic import Dmda, make_policy

_sgd = jax.jit(lambda p, g, lr: jax.tree_util.tree_map(lambda x, y: x - lr * y, p, g))


@jax.tree_util.register_pytree_node_class
class _Stash:
    """A forward's residuals (arrays: moved, measured, evicted like any datum) and the
    layout that rebuilds its ``jax.vjp`` closure (static: it never moves)."""

    def __init__(self, res: list, layout: tuple):
        self.res, self.layout = res, layout

    def tree_flatten(self):
        return (self.res,), self.layout

    @classmethod
    def tree_unflatten(cls, layout, children):
        return cls(children[0], layout)


def _record(k: ChunkKernels, p, r, a, *tail) -> tuple[Any, _Stash]:
    """(output or scaled loss, stash) of one forward."""
    out, res = k.vjp(p, r, a, *tail)
    return out, _Stash(res, k.layout(p, r, a, tail))


def _backward(k: ChunkKernels, p, stash: _Stash, d) -> tuple[Any, Any]:
    """(parameter gradients, input gradient) from a stash."""
    return k.full(p, stash.res, d, stash.layout)


def run_dynamic_training(
    layers: Sequence[Any],
    x: Any,
    y: Any,
    loss_fn: Callable,
    *,
    policy: str = "dmda",
    microbatches: int = 8,
    cuts: Sequence[int] | None = None,
    devices: Sequence | None = None,
    memory: int | Sequence | dict | None = None,
    bandwidth: float = 10e9,
    host_bandwidth: float | None = None,
    speeds: Sequence | dict | None = None,
    noise: Noise | None = None,
    time_scale: float = 1.0,
    plan=None,
    lr: float | None = None,
    **options,
) -> RunResult:
    """One training step of ``layers`` (loss ``loss_fn(out, y)``, the mean of the
    micro-batch losses; ``layers`` may also be a list of
    :class:`~jax_exec.stages.split.Stage` objects taken as they are, e.g. a traced
    model's, whose activations ``x`` are tuples of arrays: every leaf is split into
    micro-batches; :meth:`jax_exec.pipeline.pipeline_plan.PipelinePlan.run_dynamic`) with its
    tasks placed and started by ``policy`` (any of
    ``solvers.pipeline.dynamic.POLICIES``; ``plan``: the static plan of ``static`` and
    ``guided``, device -> tasks or a PipelineSchedule of the groups, devices named
    ``dev0``, ``dev1``, ...; ``options``: the guided policy's ``tol``, ``min_samples``).

    ``cuts``: the groups (default: one per stage); ``devices``: JAX devices (default
    ``jax.devices()``); ``memory``: bytes the runtime may hold per device (one number,
    a list in device order or a dict; None: unlimited); ``bandwidth``: bytes/s the
    policies assume between devices; ``host_bandwidth``: bytes/s of each device's
    host link, which lets the runtime offload (None: evictions drop and recompute
    stashes only); ``speeds``, ``noise``, ``time_scale``: the experiment knobs of the
    module docstring; ``lr``: the update tasks also apply SGD (``outputs``: the new
    parameters per stage).

    The result has ``loss``, ``grads`` (one pytree per stage), ``device_peaks`` (the
    most bytes measured on each device after a task), ``measured_bytes`` (device ->
    bytes after every task), ``trace`` (the runtime's own account: placement,
    durations, memory, evictions), ``predicted`` (the simulator, same policy and
    graph, and with the knobs the same noise), ``op_log``, ``makespan``.
    """
    stages = given_stages(layers)
    L = len(stages)
    cuts = tuple(cuts or range(L + 1))
    G = len(cuts) - 1
    m = microbatches
    devs = list(devices if devices is not None else jax.devices())
    names = [f"dev{k}" for k in range(len(devs))]
    jdev = dict(zip(names, devs, strict=True))
    xs = split_microbatches(jax.tree_util.tree_map(jnp.asarray, x), m)
    ys = split_microbatches(y, m)
    kern = [interval_kernels(stages, cuts[g], cuts[g + 1], loss_fn) for g in range(G)]
    host_params = [group_state(stages, cuts[g], cuts[g + 1]) for g in range(G)]
    cal = _calibrate(kern, host_params, xs[0], ys[0], jdev, 1.0 / m, lr)
    emulate_on = speeds is not None or noise is not None
    scale = time_scale if emulate_on else 1.0

    def mean(kind: str) -> float:
        return scale * sum(cal.seconds[kind, u] for u in names) / len(names)

    groups = [GroupCosts(cuts[g], cuts[g + 1], mean(f"F{g}"), mean(f"B{g}"), mean(f"W{g}"),
                         cal.input[g], cal.stash[g], cal.param[g], cal.grad[g], 0, cal.grad[g],
                         cal.update[g])
              for g in range(G)]  # fmt: skip
    graph = training_task_graph(groups, m, target_bytes=cal.target)
    caps = per_device(memory, names, "memory")
    platform = device_platform(names, per_device(speeds, names, "speeds"), caps, bandwidth,
                         host_bandwidth)  # fmt: skip

    def fresh():
        pol = make_policy(policy, graph, platform, plan=plan, **options)
        if isinstance(pol, Dmda) and not emulate_on:
            for (kind, u), sec in cal.seconds.items():
                pol.model.record(next(t for t, tk in enumerate(graph.tasks) if tk.kind == kind),
                                 u, sec)  # fmt: skip
        return pol

    predicted = simulate_dynamic(graph, platform, fresh(), noise=noise if emulate_on else None,
                                 prefetch=False)  # fmt: skip
    pol = fresh()
    t0 = time.perf_counter()
    state = RuntimeState(graph, platform, pol, clock=lambda: time.perf_counter() - t0,
                         prefetch=False)  # fmt: skip
    ids = {d.name: k for k, d in enumerate(graph.data)}
    sources = {ids[f"w{g}"]: host_params[g] for g in range(G)}
    sources.update({ids[f"x[{n}]"]: xs[n] for n in range(m)})
    # no target bytes (a traced model's last stage computes the loss): no y data
    sources.update({ids[f"y[{n}]"]: ys[n] for n in range(m) if f"y[{n}]" in ids})
    emulate = emulation(graph, state, noise, emulate_on)
    losses: dict = {}

    def timed(t, u, work, fn, *args):
        began = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        seconds = time.perf_counter() - began
        return out, (emulate(t, u, work, began) if emulate else seconds)

    def forward(g, n, u, values, t):
        p, r = values[ids[f"w{g}"]]
        a = values[ids[f"x[{n}]"] if g == 0 else ids[f"a{g}[{n}]"]]
        work = graph.tasks[t].work
        if g == G - 1:
            yv = values[ids[f"y[{n}]"]] if f"y[{n}]" in ids else ys[n]
            return timed(t, u, work, _record, kern[g], p, r, a, yv, 1.0 / m)
        return timed(t, u, work, _record, kern[g], p, r, a)

    def compute(t, u, values, rebuilt):
        task = graph.tasks[t]
        phase, g, n = task.kind[0], int(task.kind[1:]), task.item
        if phase == "F":
            (out, vjp), seconds = forward(g, n, u, values, t)
            if g == G - 1:
                losses[n] = jax.device_get(out)
                return TaskOutput({ids[f"s{g}[{n}]"]: vjp}, seconds)
            return TaskOutput({ids[f"s{g}[{n}]"]: vjp, ids[f"a{g + 1}[{n}]"]: out}, seconds)
        if phase == "B":
            stash, rebuild = ids[f"s{g}[{n}]"], 0.0
            if stash in rebuilt:
                producer = state.layout.producer[stash]
                (_, vjp), rebuild = forward(g, n, u, values, producer)
            else:
                vjp = values[stash]
            if g == G - 1:
                seed = jax.device_put(jnp.ones((), cal.loss_dtype), jdev[u])
            else:
                seed = values[ids[f"d{g + 1}[{n}]"]]
            acc = ids[f"acc{g}"]
            p = values[ids[f"w{g}"]][0]
            (gp, d), seconds = timed(t, u, task.work, _backward, kern[g], p, vjp, seed)
            if acc in values:
                gp = jax.block_until_ready(tree_add(values[acc][0], gp))
            outs = {acc: gp}
            if g > 0:
                outs[ids[f"d{g}[{n}]"]] = d
            return TaskOutput(outs, seconds, rebuild)
        partials = values[ids[f"acc{g}"]]
        began = time.perf_counter()
        total = partials[0]
        for part in partials[1:]:
            total = tree_add(total, part)
        out = (total, _sgd(values[ids[f"w{g}"]][0], total, lr)) if lr is not None else (total,)
        jax.block_until_ready(out)
        seconds = emulate(t, u, task.work, began) if emulate else time.perf_counter() - began
        return TaskOutput({ids[f"u{g}"]: out}, seconds)

    workers = Workers(state, jdev, sources, compute)
    workers.run()
    loss = None
    for n in range(m):
        value = jnp.asarray(losses[n])
        loss = value if loss is None else loss + value
    grads: list = [None] * L
    new: list = [None] * L
    for g in range(G):
        d = ids[f"u{g}"]
        value = next(v for (k, _), v in workers.store.items() if k == d)
        for k, gk in zip(range(cuts[g], cuts[g + 1]), value[0], strict=True):
            grads[k] = gk
        if lr is not None:
            for k, pk in zip(range(cuts[g], cuts[g + 1]), value[1], strict=True):
                new[k] = pk
    return dynamic_result(state, graph, pol, predicted, jdev, workers, loss=loss, grads=grads,
                   outputs=new if lr is not None else None)  # fmt: skip


@dataclass(frozen=True)
class Calibration:
    """What calibrating a step's kernels measured: ``seconds[kind, device]`` of every
    kernel (compiled first; kinds ``F{g}``, ``B{g}``, ``W{g}``); per group, for one
    micro-batch run on the first device, the bytes of its ``input``, ``stash``,
    parameters (``param``), parameter gradients (``grad``) and ``update``; the bytes
    of a micro-batch's ``target``; the loss's dtype."""

    seconds: dict
    input: list[int]
    stash: list[int]
    param: list[int]
    grad: list[int]
    update: list[int]
    target: int
    loss_dtype: Any


def _calibrate(kern, host_params, x0, y0, jdev, scale, lr) -> Calibration:
    """Time every kernel on every device and size what it makes (:class:`Calibration`)."""
    names = list(jdev)
    G = len(kern)
    acts, vjps = [], []
    a = jax.device_put(x0, jdev[names[0]])
    params0 = [move(p, jdev[names[0]]) for p in host_params]
    for g in range(G):
        acts.append(a)
        if g == G - 1:
            value, vjp = _record(kern[g], *params0[g], a, jax.device_put(y0, jdev[names[0]]),
                                 scale)  # fmt: skip
            loss_dtype = value.dtype
        else:
            a, vjp = _record(kern[g], *params0[g], a)
        vjps.append(vjp)
    seeds = [None] * G
    seed = jnp.ones((), loss_dtype)
    grads = [None] * G
    for g in reversed(range(G)):
        seeds[g] = seed
        grads[g], seed = _backward(kern[g], params0[g][0], vjps[g], seed)
    grad_bytes = [distinct_bytes(gp) for gp in grads]
    calib = {}
    for u in names:
        dev = jdev[u]
        for g in range(G):
            p = move(params0[g], dev)
            args = (*p, jax.device_put(acts[g], dev))
            if g == G - 1:
                args = (*args, jax.device_put(y0, dev), scale)
            for _ in range(2):  # the first call compiles
                began = time.perf_counter()
                _, vjp = jax.block_until_ready(_record(kern[g], *args))
                calib[f"F{g}", u] = time.perf_counter() - began
            seed = jax.device_put(seeds[g], dev)
            for _ in range(2):
                began = time.perf_counter()
                gp, _ = jax.block_until_ready(_backward(kern[g], p[0], vjp, seed))
                calib[f"B{g}", u] = time.perf_counter() - began
            for _ in range(2):
                began = time.perf_counter()
                total = jax.block_until_ready(tree_add(gp, gp))
                if lr is not None:
                    jax.block_until_ready(_sgd(p[0], total, lr))
                calib[f"W{g}", u] = time.perf_counter() - began
    update = [b + (distinct_bytes(params0[g][0]) if lr is not None else 0)
              for g, b in enumerate(grad_bytes)]  # fmt: skip
    return Calibration(calib, [distinct_bytes(v) for v in acts], [distinct_bytes(v) for v in vjps],
                       [distinct_bytes(p) for p in params0], grad_bytes, update, distinct_bytes(y0),
                       loss_dtype)  # fmt: skip

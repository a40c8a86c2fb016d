"""MPMD pipelines: run per-device op lists (:class:`schedir.PipelineSchedule`) in JAX.

Every chunk [i, j) of stages (a device may run several: the virtual stages of
interleaved and V-shaped schedules) runs on the device holding its parameters (placed
once with ``jax.device_put``):

- inference ``Fwd``: ``a_j = f_ij(params, a_i)``, one jitted function;
- training: the chunk runs as a chain schedule of its sub-chain
  (:class:`~jax_exec.pipeline.chunks.ChunkProgram`, split at its ``Loss``): store-all
  by default, a rotor plan's chain ops when the chunk's plan carries them, the chunk
  checkpointed whole when its backward has ``recompute > 0`` and no plan ops
  (:func:`chunk_chain_ops`); its residuals in its plan's low-bit ``storage`` if it
  has one. ``Fwd`` runs the chain ops before the loss and keeps
  their buffers (the stash: exactly what the chain schedule holds there), and on the
  last chunk the micro-batch's target; ``Bwd(part="full")`` runs the loss (the mean
  over micro-batches: scaled by 1/m) or takes d_j, then the ops after it (the
  recomputations included), adds the parameter gradients, makes d_i;
- ``Bwd(part="input")``: the same with each stage's input part only; without the
  problem's ``wgrad_bytes`` it frees nothing and ``Wgt`` reruns the backward for the
  parameter gradients; with them it keeps per stage what its weight part reads and
  ``Wgt`` runs the weight parts;
- ``Send``: ``jax.device_put`` of the array (or tuple of arrays) to the peer's device
  (another process's device: :func:`jax_exec.distributed.transfer_tree`).

What every op waits for, makes, allocates and releases is read from
:func:`schedir.pipeline.ops.effect` (the rules, written once; the simulator reads the
same): the runtime keeps each array under the effect's data key (``a``, ``d``, ``s``
for a stash, ``w`` for weight-gradient data) and drops it when the last op that
releases it has run. Ops are dispatched from one Python thread in a round robin over
the devices that keeps each device's list order and runs an op once the data its
effect reads was made; JAX's asynchronous dispatch lets the devices overlap. The loop
depends on the schedule only, so under ``jax.distributed`` every process runs the
same loop, executes the ops of its own devices and meets its peers at the cross-host
sends in the same order.

After every op the bytes held on its device are measured (the distinct arrays under
the device's keys, parameters excluded) and, next to them, what the effect's sizes
say the same live buffers weigh (the *model* bytes; with ``problem=`` a profiled
problem, else unit sizes): with the profiled problem they are equal (docs/pipelines.md
says where they are not). Gradients equal ``jax.grad`` of the single-device model
(tests: rtol 1e-5 on 4 CPU devices and on 2 processes of 4).

The jitted kernels are cached across calls (:mod:`jax_exec.pipeline.chunks`): a training
loop compiles once, and every call reads the layers' current parameters and state
(they are arguments of the kernels, never constants baked into them).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.distributed import is_local, transfer_tree
from jax_exec.execute.buffers import in_host
from jax_exec.execute.result import RunResult
from jax_exec.execute.tree import check_schedule, unit_chain
from jax_exec.pipeline.chunks import (  # the dynamic runtime imports these two from here too
    ChunkKernels,
    ChunkProgram,
    given_stages,
    interval_kernels,
    recompute_ops,
    split_microbatches,
)
from jax_exec.stages.split import Stage
from schedir import Chain, CopyEngine, OffloadProblem, simulate_offload
from schedir.chain.ops import store_all_ops
from schedir.errors import InvalidSchedule
from schedir.offload.ops import COPY_OP_TYPES
from schedir.pipeline.ops import Bwd, Fwd, Send, Wgt, effect
from schedir.pipeline.problem import PipelineProblem
from schedir.pipeline.schedule import PipelineSchedule
from schedir.platform import Device, Platform

_HOST_NAME = re.compile(r"^h(\d+)/d(\d+)$")


def _devices_for(schedule: PipelineSchedule, devices) -> dict:
    """Schedule device name -> JAX device: ``devices`` as a dict, or a list in the
    order of ``schedule.ops``; by default names ``h{p}/d{k}`` (``Platform.hosts``)
    go to process p's k-th device and other names to ``jax.devices()`` in order."""
    names = [dev for dev, _ in schedule.ops]
    if devices is None:
        matches = [_HOST_NAME.match(n) for n in names]
        if all(matches):
            by_host: dict[int, list] = {}
            for d in jax.devices():
                by_host.setdefault(d.process_index, []).append(d)
            place = {}
            for name, mt in zip(names, matches, strict=True):
                p, k = int(mt.group(1)), int(mt.group(2))
                if k >= len(by_host.get(p, [])):
                    raise ValueError(f"device {name}: process {p} has no device {k}")
                place[name] = by_host[p][k]
            return place
        devices = jax.devices()
    if isinstance(devices, dict):
        missing = [n for n in names if n not in devices]
        if missing:
            raise ValueError(f"devices: no JAX device given for {missing}")
        return {n: devices[n] for n in names}
    if len(devices) < len(names):
        raise ValueError(f"schedule uses {len(names)} devices, only {len(devices)} given")
    return dict(zip(names, devices, strict=False))


def unit_problem(schedule: PipelineSchedule, L: int, m: int, training: bool) -> PipelineProblem:
    """A problem with L stages of unit sizes and times on the schedule's devices: what
    :func:`run_pipeline` gives :func:`~schedir.pipeline.ops.effect` when no
    ``problem`` is given (the lifetimes do not depend on the sizes; the model bytes
    of the result then count buffers, not bytes)."""
    chain = Chain.from_rotor([1.0] * L, [1.0] * (L + 1), [1] * (L + 1), [1] * (L + 1),
                             [0] * L, [0] * (L + 1))  # fmt: skip
    devs = [Device(name) for name, _ in schedule.ops]
    return PipelineProblem(chain, [0] * L, Platform.fully_connected(devs, 1.0), m, training)


def chunk_chain_ops(schedule: PipelineSchedule, i: int, j: int) -> tuple:
    """The chain schedule chunk [i, j) runs (local stages 0..j-i-1, its ``Loss`` the
    arrival of d_j or the real loss): its plan's ``ops`` (a rotor plan's), store-all
    for a store-all plan (whose extra seconds are a low-bit codec's, not
    recomputation), else :func:`~jax_exec.pipeline.chunks.recompute_ops` when a
    backward of the chunk recomputes (``Bwd.recompute > 0`` without plan ops: the
    chunk checkpointed whole), else :func:`schedir.chain.ops.store_all_ops`."""
    plan = schedule.plan(i, j)
    if plan is not None and plan.ops:
        try:
            if any(type(op) in COPY_OP_TYPES.values() for op in plan.ops):  # offload
                link = CopyEngine(1.0)
                problem = OffloadProblem(unit_chain(j - i), Platform(offload=link, prefetch=link))
                simulate_offload(problem, plan.ops)
                return plan.ops
            return check_schedule(plan.ops, j - i)
        except InvalidSchedule as err:
            raise InvalidSchedule(f"plan of chunk {i}:{j}: {err}") from None
    if plan is not None and plan.kind == "store_all":
        return store_all_ops(j - i)
    recomputes = any(isinstance(o, Bwd) and (o.first, o.last) == (i, j) and o.recompute > 0
                     for _, lst in schedule.ops for o in lst)  # fmt: skip
    return recompute_ops(j - i) if recomputes else store_all_ops(j - i)


def _op_effects(problem: PipelineProblem, schedule: PipelineSchedule, training: bool) -> dict:
    """(device, position) -> Effect, with the footprints of the chunks' plans, as the
    simulator reads them."""
    whole = schedule.footprints() if training else {}
    held = schedule.held_bytes() if training else {}
    out = {}
    for dev, ops in schedule.ops:
        for k, op in enumerate(ops):
            chunk = (op.first, op.last) if isinstance(op, Fwd | Bwd | Wgt) else None
            try:
                out[dev, k] = effect(problem, dev, op, training=training,
                                     footprint=whole.get(chunk), held=held.get(chunk))  # fmt: skip
            except InvalidSchedule as err:
                raise InvalidSchedule(f"device {dev}: {op}: {err}") from None
    return out


def run_pipeline(
    layers: Sequence[Any],
    schedule: PipelineSchedule,
    x: Any,
    y: Any = None,
    loss_fn: Callable | None = None,
    *,
    devices: Sequence | dict | None = None,
    block: bool = False,
    problem: PipelineProblem | None = None,
) -> RunResult:
    """Execute ``schedule`` (GPipe, 1F1B, interleaved, zero-bubble, V-shape, a
    periodic inference pattern expanded, or any valid per-device lists) on ``layers``.
    Training iff the schedule has ``Bwd`` ops (then ``y`` and ``loss_fn`` are
    required). The micro-batch count is the number of distinct micro-batches in the
    schedule; ``x`` (and ``y``) are split along axis 0 (every leaf of a tuple; an empty
    ``y`` holds nothing). ``layers`` may also be a list of
    :class:`~jax_exec.stages.split.Stage` objects, taken as they are (a traced model's
    stages, :mod:`jax_exec.pipeline.traced`, whose activations are tuples of arrays).

    ``devices``: JAX devices in the order of ``schedule.ops``, or a dict name ->
    device (default: see :func:`_devices_for`). ``block``: wait for every op (the
    op-by-op mode: exact per-op times, no overlap). ``problem``: the problem whose
    sizes give the model bytes (a profiled one compares with the simulator); it must
    have the layers' stage count.

    The result has ``loss`` and ``grads`` (training) or ``outputs``; ``op_log``
    ``(device, op, start, end)``; ``op_device_bytes`` (measured on the op's device
    after it) and ``op_model_bytes`` (the effect's sizes of the same live buffers),
    one per ``op_log`` entry; ``device_peaks``: per device the most measured bytes
    after an op. Under ``jax.distributed`` each process returns the gradients of the
    stages it ran (None for the others), the loss where the last stage ran (else
    None), the outputs (inference) where every item's last stage ran, and log
    entries and peaks for its own devices only.
    """
    stages = given_stages(layers)
    L = len(stages)
    place = _devices_for(schedule, devices)
    ops = {dev: list(lst) for dev, lst in schedule.ops}
    training = any(isinstance(o, Bwd) for lst in ops.values() for o in lst)
    mbs = sorted({o.mb for lst in ops.values() for o in lst if isinstance(o, Fwd)})
    m = len(mbs)
    if training and (loss_fn is None or y is None):
        raise ValueError("a training schedule needs y and loss_fn")
    if problem is None:
        problem = unit_problem(schedule, L, m, training)
    elif problem.length != L:
        raise ValueError(f"problem has {problem.length} stages, the layers {L}")
    effects = _op_effects(problem, schedule, training)
    # how many ops release each buffer: it is dropped when the last of them has run
    releasers = Counter(key for e in effects.values() for key in (*e.releases,
                                                                  *e.releases_start))  # fmt: skip
    allocated = {id(e): {key for key, _ in (*e.allocs, *e.allocs_end)} for e in effects.values()}
    backward_of = {(dev, o.first, o.last, o.mb): o
                   for dev, lst in ops.items() for o in lst if isinstance(o, Bwd)}  # fmt: skip
    local = {dev for dev in ops if is_local(place[dev])}
    xs = split_microbatches(jax.tree_util.tree_map(jnp.asarray, x), m)
    ys = split_microbatches(y, m) if training else [None] * m
    avals = _activation_avals(stages, xs[0])
    slot = {mb: k for k, mb in enumerate(mbs)}
    params_on: dict = {}  # (device name, stage) -> (params, rest) on that device
    programs: dict = {}  # (i, j) -> the chunk's ChunkProgram
    per_stage = problem.wgrad_bytes is not None  # a split backward frees early (see W)
    store: dict = {}  # effect data key -> what the runtime holds for it
    sizes: dict = {}  # effect data key -> its model bytes
    left = dict(releasers)
    grads: list = [None] * L
    ran = [False] * L
    loss = None
    outputs: dict = {}
    log, measured, modelled, host_measured, host_modelled = [], [], [], [], []
    # host bytes a chunk's plan keeps per micro-batch (offloaded buffers), with its
    # stash or, for a split backward that frees nothing early, its weight data
    host_of = {(p.first, p.last): p.host for p in schedule.plans if p.host}
    kept = ("s",) if per_stage else ("s", "w")
    peaks = dict.fromkeys(sorted(local, key=list(ops).index), 0)
    t0 = time.perf_counter()

    def params(dev: str, i: int, j: int) -> tuple[list, list]:
        for k in range(i, j):
            if (dev, k) not in params_on:
                params_on[dev, k] = jax.device_put((stages[k].params, stages[k].rest), place[dev])
        held = [params_on[dev, k] for k in range(i, j)]
        return [p for p, _ in held], [r for _, r in held]

    def kern(i: int, j: int) -> ChunkKernels:
        return interval_kernels(stages, i, j)  # the forward only: inference

    def program(i: int, j: int) -> ChunkProgram:
        if (i, j) not in programs:
            ops = chunk_chain_ops(schedule, i, j)
            plan = schedule.plan(i, j)
            storage = plan.storage if plan is not None else None
            programs[i, j] = ChunkProgram(stages, i, j, avals, loss_fn if j == L else None, ops,
                                          (storage,) * (j - i))  # fmt: skip
        return programs[i, j]

    def add_grads(i: int, gp) -> None:
        for k, g in zip(range(i, i + len(gp)), gp, strict=True):
            grads[k] = g if grads[k] is None else _add(grads[k], g)
            ran[k] = True

    def add_loss(value) -> None:
        nonlocal loss
        if value is not None:
            loss = value if loss is None else _add(loss, jax.device_put(value, loss.device))

    def compute(dev: str, op) -> dict:
        """Run a compute op on ``dev``; returns what it made, by the effect's data keys."""
        i, j, mb = op.first, op.last, op.mb
        a_in, a_out = (dev, "a", i, mb), (dev, "a", j, mb)
        d_out, stash_key, w_key = (dev, "d", i, mb), (dev, "s", (i, j), mb), (dev, "w", (i, j), mb)
        p, r = params(dev, i, j)
        if isinstance(op, Wgt):
            add_grads(i, program(i, j).weight(p, r, store[w_key]))
            return {}
        if isinstance(op, Fwd):
            a = jax.device_put(xs[slot[mb]], place[dev]) if i == 0 else store[a_in]
            made = {a_in: a} if i == 0 else {}
            if not training:
                out = kern(i, j).fwd(p, r, a)
                if j == L:
                    outputs[mb] = out
                return {**made, a_out: out}
            if (dev, i, j, mb) not in backward_of:
                raise InvalidSchedule(f"device {dev}: {op} has no backward on this device")
            table, out = program(i, j).forward(p, r, a)
            # the last chunk also holds the micro-batch's target until its backward
            target = jax.device_put(ys[slot[mb]], place[dev]) if j == L else None
            made[stash_key] = (table, target)
            return made if out is None else {**made, a_out: out}
        table, target = store[stash_key]
        seed = (target, 1.0 / m) if j == L else store[dev, "d", j, mb]
        if op.part == "input":
            got = program(i, j).backward(p, r, table, seed, "input", per_stage)
            add_loss(got.loss)
            return {d_out: got.d_in, w_key: got.weight}
        got = program(i, j).backward(p, r, table, seed)
        add_loss(got.loss)
        add_grads(i, got.grads)
        return {d_out: got.d_in}

    def execute(dev: str, op, eff) -> None:
        if isinstance(op, Send):
            (held,), (sent,) = eff.reads, eff.adds
            src, dst = place[dev], place[op.peer]
            if dev in local or op.peer in local:
                moved = transfer_tree(store.get(held), src, dst, avals[op.index])
                if op.peer in local:
                    store[sent] = moved
            return
        if dev not in local or not eff.resource:
            return
        made = compute(dev, op)
        # held under the effect's keys: what it adds and what it allocates
        for key, value in made.items():
            if value is not None and (key in eff.adds or key in allocated[id(eff)]):
                store[key] = value
        if block:
            jax.block_until_ready([made, loss])

    def account(eff) -> None:
        """The effect's memory rule on the runtime's store and on the model sizes."""
        for key, size in (*eff.allocs, *eff.allocs_end):
            sizes[key] = size
        for key in (*eff.releases_start, *eff.releases):
            left[key] -= 1
            if left[key] == 0:
                store.pop(key, None)
                sizes.pop(key, None)
        for key in (*allocated[id(eff)], *eff.adds):
            if releasers[key] == 0:  # released by no op: freed when the op ends
                store.pop(key, None)
                sizes.pop(key, None)

    have: set = set()  # data made so far (the same in every process)
    heads = dict.fromkeys(ops, 0)
    remaining = sum(len(v) for v in ops.values())
    while remaining:
        progressed = False
        for dev, lst in ops.items():
            while heads[dev] < len(lst):
                op, eff = lst[heads[dev]], effects[dev, heads[dev]]
                if not all(key in have for key in eff.reads):
                    break
                start = time.perf_counter() - t0
                execute(dev, op, eff)
                account(eff)
                have.update(eff.adds)
                heads[dev] += 1
                remaining -= 1
                progressed = True
                if dev in local:
                    log.append((dev, str(op), start, time.perf_counter() - t0))
                    device_bytes, host_bytes = _held_bytes(dev, store, params_on)
                    measured.append(device_bytes)
                    modelled.append(sum(v for key, v in sizes.items() if key[0] == dev))
                    host_measured.append(host_bytes)
                    host_modelled.append(sum(host_of.get(key[2], 0) for key in sizes
                                             if key[0] == dev and key[1] in kept))  # fmt: skip
                    peaks[dev] = max(peaks[dev], measured[-1])
        if not progressed:
            stuck = {d: str(ops[d][heads[d]]) for d in ops if heads[d] < len(ops[d])}
            raise RuntimeError(f"pipeline schedule deadlocks at {stuck}")
    result_grads = None
    if training:
        result_grads = [g if ran[k] else None for k, g in enumerate(grads)]
    out = None
    if outputs and len(outputs) == m:
        first = place[next(d for d in ops if d in local)]
        out = jnp.concatenate([jax.device_put(outputs[mb], first) for mb in mbs])
    jax.block_until_ready((loss, result_grads, out))
    return RunResult(
        loss=loss,
        grads=result_grads,
        outputs=out,
        op_log=tuple(log),
        op_device_bytes=tuple(measured),
        op_model_bytes=tuple(modelled),
        op_host_bytes=tuple(host_measured),
        op_model_host_bytes=tuple(host_modelled),
        total_time=time.perf_counter() - t0,
        placement=place,
        device_peaks=peaks,
    )


# one compiled sum per (gradient structure, device), not one per leaf shape
_add = jax.jit(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b))


def _activation_avals(stages: Sequence[Stage], x0: Any) -> list:
    """Shape and dtype of a_0 .. a_L for one micro-batch (what a receiver allocates)."""
    avals = [jax.tree_util.tree_map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), x0)]
    for s in stages:
        avals.append(jax.eval_shape(s.apply, s.params, s.rest, avals[-1]))
    return avals


def _held_bytes(dev: str, store: dict, params_on: dict) -> tuple[int, int]:
    """Bytes of the distinct arrays held under ``dev``'s keys (activations, gradients,
    vjp closures' residuals, weight-gradient data), minus its parameters and state:
    (in the device's memory, in its host memory)."""
    params = {id(leaf) for (d, _), held in params_on.items() if d == dev
              for leaf in jax.tree_util.tree_leaves(held)}  # fmt: skip
    seen = {}
    for key, value in store.items():
        if key[0] == dev:
            for a in jax.tree_util.tree_leaves(value):
                if hasattr(a, "nbytes") and id(a) not in params:
                    seen[id(a)] = a
    host = sum(int(a.nbytes) for a in seen.values() if in_host(a))
    return sum(int(a.nbytes) for a in seen.values()) - host, host

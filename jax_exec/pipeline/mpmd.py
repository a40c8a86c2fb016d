"""MPMD pipelines: run per-device op lists (:class:`schedir.PipelineSchedule`) in JAX.

Every interval [i, j) of stages gets jitted functions that run on the device holding
its parameters (placed once with ``jax.device_put``):

- inference ``Fwd``: ``a_j = f_ij(params, a_i)``;
- training ``Fwd``: ``(a_j, vjp) = jax.vjp(f_ij, params, a_i)``, the closure (its
  residuals) kept on the device until the ``Bwd``; on the last interval the loss is
  part of the function, ``loss(f(params, a), y_mb) / m``, so the mean over micro-batches
  of the micro-batch losses is the step's loss (the full-batch loss when ``loss_fn`` is
  a mean over equal micro-batches);
- ``Bwd``: applies the closure to d_j (or to 1 for the loss), returns the parameter
  gradients (summed over micro-batches) and d_i;
- ``Send``: ``jax.device_put`` of the array to the peer's device into a mailbox that
  the matching ``Recv`` reads.

Ops are dispatched from one Python thread in a dependency-respecting round robin over
the devices (each device's list order is kept); JAX's asynchronous dispatch lets the
devices overlap. Gradients equal ``jax.grad`` of the single-device model (the tests
check rtol 1e-5 on 4 CPU devices).

The jitted kernels are cached across calls (:func:`interval_kernels`): a training
loop compiles once, and every call reads the layers' current parameters and state
(they are arguments of the kernels, never constants baked into them).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.result import RunResult
from jax_exec.stages import Stage, as_stages
from schedir.pipeline.ops import Bwd, Fwd, PipelineSchedule, Recv, Send

# The one result type (kept importable under its old name): ``loss``/``grads``
# (training) or ``outputs`` (inference), ``op_log``, ``total_time``, ``placement`` and
# ``device_peaks``.
PipelineRunResult = RunResult


def split_microbatches(tree: Any, m: int) -> list:
    """``m`` equal slices along axis 0 of every leaf (the batch must divide)."""
    leaves = jax.tree_util.tree_leaves(tree)
    n = leaves[0].shape[0]
    if n % m:
        raise ValueError(f"batch of {n} is not divisible into {m} micro-batches")
    size = n // m
    return [jax.tree_util.tree_map(lambda a, k=k: a[k * size : (k + 1) * size], tree)
            for k in range(m)]  # fmt: skip


def interval_fn(stages: Sequence[Stage], i: int, j: int) -> Callable:
    """``f(params_list, rests_list, a)`` applying stages i..j-1 to ``a``: their
    parameters and other state are arguments, so a compiled ``f`` reads the values
    current at each call."""
    applies = [s.apply for s in stages[i:j]]

    def f(params: list, rests: list, a: jax.Array) -> jax.Array:
        for apply, p, r in zip(applies, params, rests, strict=True):
            a = apply(p, r, a)
        return a

    return f


class _Kernels:
    """Jitted functions of one interval (``last``: it ends with the loss)."""

    def __init__(self, stages: Sequence[Stage], i: int, j: int, last: bool, loss_fn):
        f = interval_fn(stages, i, j)
        self.fwd = jax.jit(f)
        if last:

            def with_loss(params, rests, a, y, scale):
                return loss_fn(f(params, rests, a), y) * scale

            self.rec = jax.jit(
                lambda p, r, a, y, scale: jax.vjp(lambda p, a: with_loss(p, r, a, y, scale), p, a)
            )
        else:
            self.rec = jax.jit(lambda p, r, a: jax.vjp(lambda p, a: f(p, r, a), p, a))
        self.bwd = jax.jit(lambda vjp, d: vjp(d))


# Compiled kernels live across calls (an LRU of this many intervals): keyed by the
# stages' computations (``Stage.key``: the NNX graph definition, or the Linen module)
# and the loss function; jax.jit's own cache then separates shapes, dtypes and devices.
KERNEL_CACHE_SIZE = 256
_KERNELS: OrderedDict = OrderedDict()


def interval_kernels(
    stages: Sequence[Stage], i: int, j: int, loss_fn: Callable | None = None
) -> _Kernels:
    """The (cached) jitted kernels of stages i..j-1; with the loss when j == L.

    A key that cannot be hashed (or a new ``loss_fn`` object at every call) builds
    fresh kernels, which compile again: pass the same loss function each step.
    """
    last = j == len(stages)
    key = (tuple(s.key for s in stages[i:j]), last, loss_fn if last else None)
    try:
        hash(key)
    except TypeError:
        return _Kernels(stages, i, j, last, loss_fn)
    if key in _KERNELS:
        _KERNELS.move_to_end(key)
        return _KERNELS[key]
    kern = _KERNELS[key] = _Kernels(stages, i, j, last, loss_fn)
    while len(_KERNELS) > KERNEL_CACHE_SIZE:
        _KERNELS.popitem(last=False)
    return kern


def _devices_for(schedule: PipelineSchedule, devices) -> dict:
    names = [dev for dev, _ in schedule.ops]
    if devices is None:
        devices = jax.devices()
    if isinstance(devices, dict):
        return {n: devices[n] for n in names}
    if len(devices) < len(names):
        raise ValueError(f"schedule uses {len(names)} devices, only {len(devices)} given")
    return dict(zip(names, devices, strict=False))


def run_pipeline(
    layers: Sequence[Any],
    schedule: PipelineSchedule,
    x: Any,
    y: Any = None,
    loss_fn: Callable | None = None,
    *,
    devices: Sequence | dict | None = None,
    block: bool = False,
) -> RunResult:
    """Execute ``schedule`` (GPipe, 1F1B, a periodic inference pattern expanded, or any
    valid per-device lists) on ``layers``. Training iff the schedule has ``Bwd`` ops
    (then ``y`` and ``loss_fn`` are required). The micro-batch count is the number of
    distinct micro-batches in the schedule; ``x`` (and ``y``) are split along axis 0.
    ``devices``: JAX devices in the order of ``schedule.ops`` (default ``jax.devices()``)
    or a dict name -> device. ``block``: wait for every op (exact per-op times, no overlap).
    ``device_peaks`` of the result: per device, the most activation bytes held there
    after an op (arrays in its mailbox and the residuals of its ``jax.vjp`` closures,
    parameters excluded), counted from the arrays' shapes.
    """
    stages = as_stages(layers)
    L = len(stages)
    place = _devices_for(schedule, devices)
    ops = {dev: list(lst) for dev, lst in schedule.ops}
    training = any(isinstance(o, Bwd) for lst in ops.values() for o in lst)
    mbs = sorted({o.mb for lst in ops.values() for o in lst if isinstance(o, Fwd)})
    m = len(mbs)
    if training and (loss_fn is None or y is None):
        raise ValueError("a training schedule needs y and loss_fn")
    xs = split_microbatches(jnp.asarray(x), m)
    ys = split_microbatches(y, m) if training else [None] * m
    slot = {mb: k for k, mb in enumerate(mbs)}
    params_on: dict = {}  # (device name, stage) -> (params, rest) on that device
    box: dict = {}  # (device, kind, index, mb) -> array on that device
    saved: dict = {}  # (device, i, j, mb) -> vjp closure
    grads: list = [None] * L
    loss = None
    outputs: dict = {}
    log = []
    peaks = dict.fromkeys(ops, 0)
    t0 = time.perf_counter()

    def params(dev: str, i: int, j: int) -> tuple[list, list]:
        """The current parameters and other state of stages i..j-1, on ``dev``."""
        for k in range(i, j):
            if (dev, k) not in params_on:
                params_on[dev, k] = jax.device_put((stages[k].params, stages[k].rest), place[dev])
        held = [params_on[dev, k] for k in range(i, j)]
        return [p for p, _ in held], [r for _, r in held]

    def kern(i: int, j: int) -> _Kernels:
        return interval_kernels(stages, i, j, loss_fn if training else None)

    def ready(dev: str, op) -> bool:
        if isinstance(op, Fwd):
            return op.first == 0 or (dev, "a", op.first, op.mb) in box
        if isinstance(op, Bwd):
            return op.last == L or (dev, "d", op.last, op.mb) in box
        if isinstance(op, Send):
            return (dev, op.kind, op.index, op.mb) in box
        return True  # Recv: the data arrives with the Send

    def execute(dev: str, op) -> None:
        nonlocal loss
        if isinstance(op, Recv):
            return
        if isinstance(op, Send):
            arr = box[dev, op.kind, op.index, op.mb]
            box[op.peer, op.kind, op.index, op.mb] = jax.device_put(arr, place[op.peer])
            return
        i, j, mb = op.first, op.last, op.mb
        if isinstance(op, Fwd):
            a = (jax.device_put(xs[slot[mb]], place[dev]) if i == 0
                 else box.pop((dev, "a", i, mb)))  # fmt: skip
            p, r = params(dev, i, j)
            if not training:
                out = kern(i, j).fwd(p, r, a)
                if j == L:
                    outputs[mb] = out
                else:
                    box[dev, "a", j, mb] = out
            elif j == L:
                yy = jax.device_put(ys[slot[mb]], place[dev])
                value, vjp = kern(i, j).rec(p, r, a, yy, 1.0 / m)
                loss = value if loss is None else loss + jax.device_put(value, loss.device)
                saved[dev, i, j, mb] = vjp
            else:
                out, vjp = kern(i, j).rec(p, r, a)
                box[dev, "a", j, mb] = out
                saved[dev, i, j, mb] = vjp
            if block:
                jax.block_until_ready((outputs, box.get((dev, "a", j, mb))))
            return
        vjp = saved.pop((dev, i, j, mb))
        seed = jnp.ones((), jnp.float32) if j == L else box.pop((dev, "d", j, mb))
        if j == L:
            seed = jax.device_put(seed.astype(_loss_dtype(loss)), place[dev])
        gp, d = kern(i, j).bwd(vjp, seed)
        for k, g in zip(range(i, j), gp, strict=True):
            grads[k] = g if grads[k] is None else jax.tree_util.tree_map(jnp.add, grads[k], g)
        if i > 0:
            box[dev, "d", i, mb] = d
        if block:
            jax.block_until_ready((gp, d))

    heads = {dev: 0 for dev in ops}
    remaining = sum(len(v) for v in ops.values())
    while remaining:
        progressed = False
        for dev, lst in ops.items():
            while heads[dev] < len(lst) and ready(dev, lst[heads[dev]]):
                op = lst[heads[dev]]
                start = time.perf_counter() - t0
                execute(dev, op)
                log.append((dev, str(op), start, time.perf_counter() - t0))
                peaks[dev] = max(peaks[dev], _held_bytes(dev, box, saved, params_on))
                heads[dev] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {d: str(ops[d][heads[d]]) for d in ops if heads[d] < len(ops[d])}
            raise RuntimeError(f"pipeline schedule deadlocks at {stuck}")
    result_grads = grads if training else None
    out = None
    if outputs:
        first = place[schedule.ops[0][0]]
        out = jnp.concatenate([jax.device_put(outputs[mb], first) for mb in mbs])
    jax.block_until_ready((loss, result_grads, out))
    return RunResult(
        loss=loss,
        grads=result_grads,
        outputs=out,
        op_log=tuple(log),
        total_time=time.perf_counter() - t0,
        placement=place,
        device_peaks=peaks,
    )


def _held_bytes(dev: str, box: dict, saved: dict, params_on: dict) -> int:
    """Bytes of the distinct arrays on ``dev``: its mailbox and its vjp closures'
    leaves, minus its parameters and state."""
    params = {id(leaf) for (d, _), held in params_on.items() if d == dev
              for leaf in jax.tree_util.tree_leaves(held)}  # fmt: skip
    arrays = [a for key, a in box.items() if key[0] == dev]
    for key, vjp in saved.items():
        if key[0] == dev:
            arrays += jax.tree_util.tree_leaves(vjp)
    seen = {id(a): a for a in arrays if hasattr(a, "nbytes") and id(a) not in params}
    return sum(int(a.nbytes) for a in seen.values())


def _loss_dtype(loss) -> Any:
    return loss.dtype if loss is not None else jnp.float32

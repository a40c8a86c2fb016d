"""SPMD pipeline of identical blocks: ``shard_map`` over a ``stage`` mesh axis, ``ppermute``.

The blocks' parameters are stacked along a leading axis (one slice per block) and
sharded over the ``stage`` axis of a ``jax.sharding.Mesh``, so stage s holds blocks
s * B / S .. (s + 1) * B / S - 1. The batch is split into m micro-batches. A GPipe
forward runs m + S - 1 ticks under ``lax.scan``: at every tick each stage applies its
blocks to what it holds (stage 0 takes the next micro-batch), then ``ppermute`` shifts
every activation to the next stage; the last stage collects the outputs, which a
``psum`` over the axis returns to every stage. Reverse-mode autodiff turns the scan and
the ``ppermute`` into the GPipe backward (the transposed shifts), so ``jax.grad`` of a
loss of :func:`spmd_pipeline` gives the gradients of the sequential model.

Only ``jax.sharding`` meshes and collectives are used: under ``jax.distributed`` the
same code runs over the global device list of several hosts (build the mesh from
``jax.devices()``). The jitted pipeline is cached across calls per (block function,
mesh, micro-batches): pass the same ``block_apply`` each step and it compiles once.
References: GPipe (Huang et al., NeurIPS 2019); the JAX
``shard_map`` pipelining notes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def stage_mesh(n_stages: int, devices: Sequence | None = None, axis: str = "stage") -> Mesh:
    """A 1-D mesh of ``n_stages`` devices (default: the first of ``jax.devices()``)."""
    devs = list(devices if devices is not None else jax.devices())[:n_stages]
    if len(devs) < n_stages:
        raise ValueError(f"{n_stages} stages need {n_stages} devices, found {len(devs)}")
    return Mesh(np.array(devs), (axis,))


def stack_blocks(params: Sequence[Any]) -> Any:
    """Stack per-block parameter pytrees (same structure) along a new leading axis."""
    return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *params)


def shard_stacked(stacked: Any, mesh: Mesh, axis: str = "stage") -> Any:
    """Place stacked parameters so that each stage holds its own blocks."""
    return jax.device_put(stacked, NamedSharding(mesh, P(axis)))


def spmd_pipeline(
    block_apply: Callable[[Any, jax.Array], jax.Array],
    stacked: Any,
    x: jax.Array,
    mesh: Mesh,
    microbatches: int,
    axis: str = "stage",
) -> jax.Array:
    """Apply the B stacked blocks to ``x`` (batch on axis 0) as an S-stage GPipe pipeline.

    ``block_apply(params_of_one_block, a) -> a`` must keep the shape of ``a``; B must
    be a multiple of S = ``mesh.shape[axis]`` and the batch a multiple of
    ``microbatches``. Returns the outputs, equal to applying the blocks in sequence.
    """
    S = mesh.shape[axis]
    nblocks = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    if nblocks % S:
        raise ValueError(f"{nblocks} blocks do not split evenly over {S} stages")
    m = microbatches
    if x.shape[0] % m:
        raise ValueError(f"batch of {x.shape[0]} is not divisible into {m} micro-batches")
    xs = x.reshape(m, x.shape[0] // m, *x.shape[1:])
    ys = _runner(block_apply, mesh, m, axis)(stacked, xs)
    return ys.reshape(x.shape[0], *ys.shape[2:])


# Jitted runners live across calls (an LRU of this many): keyed by the block function
# (pass the same one each step), the mesh, the micro-batch count and the axis;
# jax.jit's own cache separates shapes and dtypes.
RUNNER_CACHE_SIZE = 64
_RUNNERS: OrderedDict = OrderedDict()


def _runner(block_apply: Callable, mesh: Mesh, m: int, axis: str) -> Callable:
    key = (block_apply, mesh, m, axis)
    if key in _RUNNERS:
        _RUNNERS.move_to_end(key)
        return _RUNNERS[key]
    S = mesh.shape[axis]
    shift = [(s, (s + 1) % S) for s in range(S)]

    def local(params: Any, xs: jax.Array) -> jax.Array:
        me = jax.lax.axis_index(axis)

        def blocks(a: jax.Array) -> jax.Array:
            def one(a, p):
                return block_apply(p, a), None

            return jax.lax.scan(one, a, params)[0]

        def tick(carry, t):
            held, outs = carry
            fresh = xs[jnp.minimum(t, m - 1)]
            a = blocks(jnp.where(me == 0, fresh, held))
            k = t - (S - 1)
            write = (me == S - 1) & (k >= 0)
            outs = jnp.where(write, outs.at[jnp.clip(k, 0, m - 1)].set(a), outs)
            return (jax.lax.ppermute(a, axis, shift), outs), None

        # the carry varies across stages: mark it so (shard_map's varying-axis types)
        init = jax.lax.pcast((jnp.zeros_like(xs[0]), jnp.zeros_like(xs)), (axis,), to="varying")
        (_, outs), _ = jax.lax.scan(tick, init, jnp.arange(m + S - 1))
        return jax.lax.psum(jnp.where(me == S - 1, outs, jnp.zeros_like(outs)), axis)

    run = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(axis), P()), out_specs=P()))
    _RUNNERS[key] = run
    while len(_RUNNERS) > RUNNER_CACHE_SIZE:
        _RUNNERS.popitem(last=False)
    return run


def sequential(block_apply: Callable, stacked: Any, x: jax.Array) -> jax.Array:
    """The reference: the blocks applied one after the other on one device."""

    def one(a, p):
        return block_apply(p, a), None

    return jax.lax.scan(one, x, stacked)[0]


def nnx_blocks(blocks: Sequence[Any]) -> tuple[Callable, Any]:
    """(block_apply, stacked params) for identical Flax NNX blocks.

    Every block must have the same graph definition; only ``nnx.Param`` leaves are
    stacked (and differentiated); the other state is taken from the first block.
    """
    from flax import nnx

    splits = [nnx.split(b, nnx.Param, ...) for b in blocks]
    graphdef, _, rest = splits[0]
    if any(g != graphdef for g, _, _ in splits[1:]):
        raise ValueError("nnx_blocks: the blocks do not share one graph definition")

    def block_apply(params: Any, a: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, params, rest)(a)

    return block_apply, stack_blocks([p for _, p, _ in splits])


# Explicit schedules with split backwards (kept importable from here).
from jax_exec.pipeline.spmd_train import (  # noqa: E402
    KINDS,
    Timetable,
    spmd_value_and_grad,
    stage_orders,
    timetable,
)

__all__ = [
    "KINDS",
    "Timetable",
    "nnx_blocks",
    "sequential",
    "shard_stacked",
    "spmd_pipeline",
    "spmd_value_and_grad",
    "stack_blocks",
    "stage_mesh",
    "stage_orders",
    "timetable",
]

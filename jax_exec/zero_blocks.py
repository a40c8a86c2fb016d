"""A planned activation schedule run on every device of a ``data`` axis, with ZeRO's
collectives at block granularity (docs/device_memory.md, "Executing the plan").

The automatic planner's compiled path (:func:`jax_exec.execute.lowering.lower`) runs each
block as a ``custom_vjp`` of its functions. Here those functions are wrapped, per block:

- sharded parameters (ZeRO-3): the block's forward, recording and backward all-gather
  its parameter shards first (``all_gather`` over ``data``), so a block holds its full
  parameters only while it runs, recomputations gather again, and the residuals JAX
  keeps are the shards;
- every backward reduces the parameter gradients it made right away, divided by N (the
  mean of the N devices' equal shares' mean losses): reduce-scattered into the local
  shard when the parameters are sharded (ZeRO-3; tensors the sharding rule keeps whole
  are all-reduced), all-reduced otherwise. A ``custom_vjp`` returns a cotangent of its
  input's shape, so with replicated parameters (ZeRO-0 to 2) the block's gradient is
  whole; ZeRO-2's shard is then kept by the step's sharding constraint
  (:class:`jax_exec.zero.ZeroStep`), XLA turning all-reduce and slice into its
  reduce-scatter or not.

Inside ``shard_map`` (one program per device, its share of the batch) the result is the
loss and the gradients placed as the strategy keeps them. A model sharded by its
authors (traced under another mesh) runs instead as one program of the global batch
that GSPMD partitions (:func:`gspmd_value_and_grad`). XLA schedules the collectives
and decides when buffers are freed; on CPU the memory of this compiled step is not
measurable (docs/auto.md, "Calibration"), its numerics are (tests/jax_exec/test_zero_jax.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jax_exec.execute.lowering import lower
from jax_exec.program.kernels import BlockFunctions
from jax_exec.zero import AXIS
from schedir.training_state import Placement, shard_axis


def _spec(axis: int | None, rank: int) -> P:
    spec = [None] * rank
    if axis is not None:
        spec[axis] = AXIS
    return P(*spec)


def collective(fns: BlockFunctions, axes: tuple, sharded: bool, devices: int) -> BlockFunctions:
    """``fns`` with its parameters (``p``, shard axis of each in ``axes``) gathered
    before use and their gradients reduce-scattered after the backward when
    ``sharded``, else all-reduced; divided by ``devices`` (module docstring)."""

    def full(p: tuple) -> tuple:
        if not sharded:
            return p
        return tuple(
            x if a is None else jax.lax.all_gather(x, AXIS, axis=a, tiled=True)
            for x, a in zip(p, axes, strict=True)
        )

    def reduce(d: Any, a: int | None) -> Any:
        if sharded and a is not None:
            d = jax.lax.psum_scatter(d, AXIS, scatter_dimension=a, tiled=True)
        else:
            d = jax.lax.psum(d, AXIS)
        return d / devices

    def forward(p: tuple, g: tuple, x: tuple) -> tuple:
        return fns.forward(full(p), g, x)

    def record(p: tuple, g: tuple, x: tuple) -> tuple:
        return fns.record(full(p), g, x)

    def backward(p, g, x, outs, results, new, d_outs, d_through) -> tuple:
        d_p, d_x = fns.backward(full(p), g, x, outs, results, new, d_outs, d_through)
        return tuple(reduce(d, a) for d, a in zip(d_p, axes, strict=True)), d_x

    return BlockFunctions(forward, record, backward, fns.recipe, fns.layout, fns.recomputes)


class CollectiveBlocks:
    """A view of a :class:`jax_exec.program.model.BlockModel` whose block functions are
    :func:`collective` ones (everything else is the model's)."""

    def __init__(self, model: Any, placement: Placement, devices: int) -> None:
        program = model.program
        if program.derived and placement.params == "sharded":
            raise ValueError(
                "a scanned stack (nnx.scan / lax.scan) under sharded parameters: the "
                "executed step cannot gather a stacked parameter's per-iteration slices "
                "(planning works; run it with ZeRO-0 to 2)"
            )
        self._model = model
        self._placement = placement
        self._devices = devices
        # the step receives each device's shard of a sharded parameter (gathered inside
        # the blocks): global_values checks dtypes, not the parameters' shapes
        self.param_shards = placement.params == "sharded"
        self._axes = {
            v: shard_axis(tuple(program.avals[v].shape), devices) for v in program.param_ids
        }
        self._cache: dict = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def functions(self, k: int, o: int) -> BlockFunctions:
        key = (k, o)
        if key not in self._cache:
            lay = self._model.layouts[k]
            axes = tuple(self._axes.get(v) for v in lay.params)
            p = self._placement
            self._cache[key] = collective(
                self._model.functions(k, o), axes, p.params == "sharded", self._devices
            )
        return self._cache[key]

    def param_specs(self, sharded: bool) -> Any:
        """PartitionSpecs of the parameters (or their gradients), as a tree."""
        program = self._model.program
        leaves = [
            _spec(self._axes[v] if sharded else None, len(program.avals[v].shape))
            for v in program.param_ids
        ]
        return jax.tree_util.tree_unflatten(program.treedefs[0], leaves)


def planned_value_and_grad(
    plan: Any, mesh: Mesh, placement: Placement
) -> Callable[[Any, tuple], tuple]:
    """``f(params, batch) -> (loss, grads)`` on ``mesh``: each device runs ``plan``'s
    schedule (a :class:`jax_exec.auto.Plan` of one device's share) on its share of
    ``batch`` with :func:`collective` blocks; ``params`` and ``grads`` placed as
    ``placement`` says (the sharding rule's axes)."""
    n = mesh.shape[AXIS]
    view = CollectiveBlocks(plan.model, placement, n)
    fn = lower(view, plan.schedule)
    rest = jax.tree_util.tree_unflatten(plan.model.program.treedefs[1], [])

    def local(params: Any, batch: tuple) -> tuple:
        (loss, _), grads = jax.value_and_grad(fn, has_aux=True)(params, rest, tuple(batch))
        return jax.lax.pmean(loss, AXIS), grads

    # check_vma=False: the blocks bind primitives directly (no automatic pvary); every
    # collective is explicit above
    specs = view.param_specs(placement.params == "sharded")  # gradients: alike
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, P(AXIS)),
                         out_specs=(P(), specs), check_vma=False)  # fmt: skip


def gspmd_value_and_grad(plan: Any) -> Callable[[Any, tuple], tuple]:
    """``f(params, batch) -> (loss, grads)``: ``plan``'s compiled schedule (a
    :class:`jax_exec.auto.Plan` of the global batch) as one program, which GSPMD
    partitions over the mesh of its arguments' and results' shardings under
    :class:`jax_exec.zero.ZeroStep`'s ``jax.jit`` (XLA inserts the collectives; the
    blocks' ``custom_vjp`` residuals are whatever GSPMD makes of them)."""
    fn = plan.lowered()
    rest = jax.tree_util.tree_unflatten(plan.model.program.treedefs[1], [])

    def f(params: Any, batch: tuple) -> tuple:
        (loss, _), grads = jax.value_and_grad(fn, has_aux=True)(params, rest, tuple(batch))
        return loss, grads

    return f

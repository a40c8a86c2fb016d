"""ZeRO data parallelism of an NNX model's training step on a ``data`` mesh axis.

Stage 0 is plain data parallelism (everything replicated, the batch split over
``data``); stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also
the parameters (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models"). Sharded arrays follow :func:`schedir.training_state.shard_axis`
(the first axis N divides; none: replicated), laid out with ``NamedSharding``; the step
is one ``jax.jit`` whose ``out_shardings`` and a ``with_sharding_constraint`` on the
gradients say where each array lives, and XLA inserts the all-gathers and
reduce-scatters. What the step holds is measured from each array's addressable shards
(:func:`measured_bytes`) and predicted by :func:`schedir.training_state.device_bytes`.

With ``offload=True`` the optimizer state lives in host memory (ZeRO-Offload, Ren et al.
2021): sharded over ``data`` like stage 1's, with the ``pinned_host`` memory kind; each
step copies the gradient and parameter shards to host memory, runs the optimizer update
there (``compute_on("device_host")``) and copies the updated shard back to the device.
On the CPU backend host and device memory are the same RAM: the arrays carry their
memory kind (``sharding.memory_kind``, which :func:`measured_bytes` can select) and
XLA's ``memory_analysis()`` counts host arrays with the device's (its ``host_*`` fields
stay 0).

``value_and_grad`` replaces the step's ``jax.value_and_grad`` of the loss: e.g. a
rematerialization schedule run per device (:mod:`jax_exec.device_plan`). With
``keep_shardings`` a model sharded by its authors keeps its shardings, ZeRO adding the
``data`` axis as the stage says (:mod:`jax_exec.zero_layout`).

    step = zero_step(loss_fn, optax.adamw(1e-3), mesh, stage=2)   # loss_fn(model, batch)
    state = step.init(model)
    for batch in batches:
        state, loss = step(state, batch)
    nnx.update(model, state.params)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental.compute_on import compute_on
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_exec.program.placement import device_bytes
from jax_exec.zero_layout import (
    AXIS,
    data_sharded,
    model_mesh,
    model_specs,
    opt_state_specs,
    own_specs,
    placed_spec,
    tensors,
)
from schedir.training_state import Placement, Tensor

HOST = "pinned_host"  # the memory kind of host-resident optimizer state


def split_params(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, parameters) of ``model``; ValueError naming any other state variable
    (batch statistics, RNG counters): the ZeRO step updates parameters only."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    others = [
        "/".join(str(k) for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(rest)
    ]
    if others:
        raise ValueError(
            f"model state {others[:5]}: not an nnx.Param; the ZeRO step trains parameters "
            "only (no batch statistics or RNG state)"
        )
    return graphdef, params


def state_bytes(
    model: nnx.Module, optimizer: optax.GradientTransformation, *, keep_shardings: bool = False
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """(parameters, optimizer state) of ``model`` as per-tensor ``(shape, itemsize)``, the
    optimizer state exactly from ``jax.eval_shape(optimizer.init, params)`` (nothing is
    allocated). Gradients have the parameters' shapes and dtypes. ``keep_shardings``:
    as the model's own shardings leave them to ZeRO (:func:`jax_exec.zero_layout.tensors`:
    each tensor's piece over the mesh axes other than ``data``, and the axis the model
    splits over ``data``)."""
    _, params = split_params(model)
    opt_state = jax.eval_shape(optimizer.init, params)
    if not keep_shardings:
        return tensors(params, own_specs(params), {}), tensors(opt_state, own_specs(opt_state), {})
    mesh = model_mesh(params)
    p_specs = model_specs(params, mesh)
    o_specs = opt_state_specs(opt_state, params, p_specs)
    mesh_shape = dict(mesh.shape) if mesh is not None else {}
    return tensors(params, p_specs, mesh_shape), tensors(opt_state, o_specs, mesh_shape)


def shardings(
    mesh: Mesh,
    tree: object,
    sharded: bool,
    memory_kind: str | None = None,
    specs: list[P] | None = None,
) -> object:
    """A tree of NamedShardings for ``tree``: each leaf's own spec (``specs``, in leaf
    order; None: none) with the ``data`` axis the sharding rule adds when ``sharded``
    (:func:`jax_exec.zero_layout.placed_spec`); in ``memory_kind`` (e.g.
    ``"pinned_host"``; None: the device's default)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    specs = own_specs(tree) if specs is None else specs
    shape = dict(mesh.shape)
    return jax.tree_util.tree_unflatten(treedef, [
        NamedSharding(mesh, placed_spec(spec, tuple(x.shape), shape, sharded),
                      memory_kind=memory_kind)
        for x, spec in zip(leaves, specs, strict=True)
    ])  # fmt: skip


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ZeroState:
    """What the step carries: the parameters and the optimizer state, placed as the
    stage says. ``graphdef`` is static (the model's structure)."""

    params: nnx.State
    opt_state: optax.OptState
    graphdef: nnx.GraphDef = field(metadata=dict(static=True))


@dataclass(frozen=True)
class ZeroStep:
    """A jitted training step under ZeRO ``stage`` on ``mesh``'s ``data`` axis.

    Attributes:
        loss_fn: ``loss_fn(model, batch) -> scalar``; ``batch`` is a pytree whose leaves
            are split over ``data`` along their leading axis.
        optimizer: an optax transformation (e.g. ``optax.adamw(1e-3)``).
        mesh: a ``jax.sharding.Mesh`` with a ``data`` axis.
        stage: 0 (data parallelism), 1, 2 or 3.
        offload: the optimizer state and its update on the host (module docstring).
        value_and_grad: ``f(params, batch) -> (loss, grads)`` called inside the step
            (default: ``jax.value_and_grad`` of ``loss_fn`` on the merged model).
        keep_shardings: each array keeps the sharding the model gives its parameter
            (a model sharded by its authors on ``mesh``), ZeRO adding the ``data`` axis
            as the stage says (:mod:`jax_exec.zero_layout`); False: the rule alone.
    """

    loss_fn: Callable
    optimizer: optax.GradientTransformation
    mesh: Mesh
    stage: int
    offload: bool = False
    value_and_grad: Callable | None = None
    keep_shardings: bool = False

    def __post_init__(self) -> None:
        if self.stage not in (0, 1, 2, 3) or isinstance(self.stage, bool):
            raise ValueError(f"stage = {self.stage!r}: expected 0, 1, 2 or 3")
        for name in ("offload", "keep_shardings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} = {getattr(self, name)!r}: expected a bool")
        if AXIS not in self.mesh.shape:
            raise ValueError(f"mesh axes {tuple(self.mesh.shape)}: no {AXIS!r} axis")

    @property
    def placement(self) -> Placement:
        return Placement.zero(self.stage, offload=self.offload)

    def _specs(self, params: object, opt_state: object) -> tuple[list[P], list[P]]:
        """The own specs of the parameters and the optimizer state: the parameters'
        shardings and the optimizer state following them (``keep_shardings``; the
        placed state's give the same placement again), or none."""
        if not self.keep_shardings:
            return own_specs(params), own_specs(opt_state)
        p_specs = model_specs(params, self.mesh)
        return p_specs, opt_state_specs(opt_state, params, p_specs)

    def _place(self, params: object, opt_state: object, specs: tuple) -> tuple[object, object]:
        p, (p_specs, o_specs) = self.placement, specs
        if p.opt_state == "host":  # partitioned over the data axis, in host memory
            o_sh = shardings(self.mesh, opt_state, True, HOST, o_specs)
        else:
            o_sh = shardings(self.mesh, opt_state, p.opt_state == "sharded", specs=o_specs)
        return shardings(self.mesh, params, p.params == "sharded", specs=p_specs), o_sh

    def init(self, model: nnx.Module) -> ZeroState:
        """The model's parameters and a fresh optimizer state, placed on the mesh (a
        warning names the parameters the model shards over ``data`` itself where the
        stage keeps parameters replicated: they stay sharded)."""
        graphdef, params = split_params(model)
        opt_state = jax.eval_shape(self.optimizer.init, params)
        specs = self._specs(params, opt_state)
        own = data_sharded(params, specs[0])
        if own and self.placement.params == "replicated":
            warnings.warn(
                f"ZeRO-{self.stage} keeps parameters replicated over {AXIS!r}, but the model "
                f"shards {len(own)} over it itself ({', '.join(own[:4])}"
                f"{', ...' if len(own) > 4 else ''}): they, their gradients and their "
                f"optimizer state stay sharded",
                stacklevel=2,
            )
        p_sh, o_sh = self._place(params, opt_state, specs)
        # a copy: the step donates its state, the model keeps its own arrays (device_put
        # to a replicated sharding reuses the source's buffer, even with may_alias=False)
        params = jax.device_put(jax.tree_util.tree_map(jnp.copy, params), p_sh)
        opt_state = jax.jit(self.optimizer.init, out_shardings=o_sh)(params)
        return ZeroState(params, opt_state, graphdef)

    def _batch(self, batch: object) -> object:
        n = self.mesh.shape[AXIS]
        for path, x in jax.tree_util.tree_leaves_with_path(batch):
            if not np.ndim(x) or np.shape(x)[0] % n:
                raise ValueError(
                    f"batch{jax.tree_util.keystr(path)} shape {np.shape(x)}: the leading "
                    f"axis must be a multiple of the {n} devices of {AXIS!r}"
                )
        return jax.device_put(batch, NamedSharding(self.mesh, P(AXIS)))

    def _step(self, state: ZeroState, keep_grads: bool, specs: tuple):
        p_sh, o_sh = self._place(state.params, state.opt_state, specs)
        g_sh = shardings(self.mesh, state.params, self.placement.grads == "sharded",
                         specs=specs[0])  # fmt: skip
        host = self.placement.opt_state == "host"

        def update(grads: object, opt_state: object, params: object) -> tuple[object, object]:
            if not host:
                updates, opt_state = self.optimizer.update(grads, opt_state, params)
                return optax.apply_updates(params, updates), opt_state
            # each device's shard of the gradients and parameters to host memory, the
            # update there, the new parameter shard back (ZeRO-Offload)
            to_host = shardings(self.mesh, params, True, HOST, specs[0])
            grads, params = jax.device_put((grads, params), (to_host, to_host))
            with compute_on("device_host"):
                updates, opt_state = self.optimizer.update(grads, opt_state, params)
                params = optax.apply_updates(params, updates)
            return jax.device_put(params, p_sh), opt_state

        def step(state: ZeroState, batch: object):
            if self.value_and_grad is None:

                def loss(params):
                    return self.loss_fn(nnx.merge(state.graphdef, params), batch)

                value, grads = jax.value_and_grad(loss)(state.params)
            else:
                value, grads = self.value_and_grad(state.params, batch)
            grads = jax.lax.with_sharding_constraint(grads, g_sh)
            params, opt_state = update(grads, state.opt_state, state.params)
            new = ZeroState(params, opt_state, state.graphdef)
            return (new, value, grads) if keep_grads else (new, value)

        placed = ZeroState(p_sh, o_sh, state.graphdef)
        out = (placed, NamedSharding(self.mesh, P()))
        out_shardings = (*out, g_sh) if keep_grads else out
        # explicit input shardings: host-resident arguments must be declared as such
        in_shardings = (placed, NamedSharding(self.mesh, P(AXIS)))
        return jax.jit(step, in_shardings=in_shardings, out_shardings=out_shardings,
                       donate_argnums=0)  # fmt: skip

    def __call__(self, state: ZeroState, batch: object) -> tuple[ZeroState, jax.Array]:
        """One step: (new state, loss). ``state`` is donated (do not reuse it)."""
        return self._jitted(False, state)(state, self._batch(batch))

    def with_grads(self, state: ZeroState, batch: object) -> tuple[ZeroState, jax.Array, object]:
        """One step that also returns the gradients, placed as the stage keeps them (to
        measure their bytes: inside :meth:`__call__` XLA may free them early)."""
        return self._jitted(True, state)(state, self._batch(batch))

    def _jitted(self, keep_grads: bool, state: ZeroState):
        cache = self.__dict__.setdefault("_cache", {})
        specs = self._specs(state.params, state.opt_state)
        key = (keep_grads, state.graphdef, jax.tree_util.tree_structure(state),
               *map(tuple, specs))  # fmt: skip
        if key not in cache:
            cache[key] = self._step(state, keep_grads, specs)
        return cache[key]


def zero_step(
    loss_fn: Callable,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    stage: int,
    *,
    offload: bool = False,
    value_and_grad: Callable | None = None,
    keep_shardings: bool = False,
) -> ZeroStep:
    """A training step of ZeRO ``stage`` (0-3) over ``mesh``'s ``data`` axis, the
    optimizer state on the host with ``offload``, the model's own shardings kept with
    ``keep_shardings``; see :class:`ZeroStep` (``init(model)``, then ``state, loss =
    step(state, batch)``)."""
    return ZeroStep(loss_fn, optimizer, mesh, stage, offload, value_and_grad, keep_shardings)


def measured_bytes(tree: object, memory_kind: str | None = None) -> dict[int, int]:
    """Bytes of ``tree``'s arrays on each device, measured from their addressable shards
    (:func:`jax_exec.program.placement.device_bytes`), keyed by device id (every device
    of every array). ``memory_kind``: count only the arrays in that memory
    (``"device"``, ``"pinned_host"``); devices holding none of them have 0."""
    arrays = jax.tree_util.tree_leaves(tree)
    kept = [x for x in arrays if memory_kind is None or x.sharding.memory_kind == memory_kind]
    out = {shard.device.id: 0 for x in arrays for shard in x.addressable_shards}
    out.update((device.id, nbytes) for device, nbytes in device_bytes(kept).items())
    return out

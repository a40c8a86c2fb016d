"""Where each array of a ZeRO step lives on the mesh: the sharding rule of
:mod:`jax_exec.zero`, combined with the shardings a model's authors gave its
parameters (docs/device_memory.md, "Models sharded by their authors (GSPMD)").

A leaf's own sharding is its ``NamedSharding``'s ``PartitionSpec`` (``P()`` for an
array on one device or replicated; ``nnx.with_partitioning`` under ``jax.set_mesh``
gives such specs). ZeRO only adds the ``data`` axis to it, never removes an axis:

- a leaf the model already splits over ``data`` (FSDP) keeps its sharding under every
  placement: what ZeRO-3 would add to it, the model has done, and ZeRO 0-2's
  replicated parameters cannot hold for it (:func:`data_sharded` names such leaves);
- any other leaf, under a ``sharded`` placement, is split over ``data`` along the first
  axis of its piece (its shape divided by the model's other mesh axes there) that N
  divides (:func:`schedir.training_state.shard_axis`), next to the model's own axes on
  that dimension; none: it stays as the model has it. ``replicated``: as the model has
  it. For a model without shardings this is the rule alone.

The optimizer state's leaves follow the parameter whose tree path ends theirs and has
their shape (optax's ``mu`` and ``nu`` of each parameter); the others (a step count)
have no sharding of their own. :func:`tensors` gives the accounting's view
(:class:`schedir.training_state.Tensor`: the piece, and the axis the model splits over
``data``), so the predicted bytes per device are those of the shardings, exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from schedir.training_state import Tensor, shard_axis

AXIS = "data"


def _axes(entry: object) -> tuple[str, ...]:
    """The mesh axes of one ``PartitionSpec`` entry (None, a name or a tuple of names)."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _entries(spec: P, rank: int) -> list:
    return list(spec) + [None] * (rank - len(spec))


def _spread(x: object) -> bool:
    """Whether ``x`` is a concrete array split over several devices."""
    sharding = getattr(x, "sharding", None)
    return (
        isinstance(x, jax.Array)
        and not isinstance(x, jax.core.Tracer)
        and len(sharding.device_set) > 1
        and not sharding.is_fully_replicated
    )


def _named(tree: object) -> list[tuple[str, NamedSharding]]:
    """(path, sharding) of ``tree``'s arrays split over several devices; ValueError
    naming one whose sharding is not a ``NamedSharding``."""
    out = []
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        if not _spread(x):
            continue
        if not isinstance(x.sharding, NamedSharding):
            raise ValueError(
                f"{jax.tree_util.keystr(path)}: sharded by a {type(x.sharding).__name__}; "
                f"ZeRO combines NamedShardings (jax.sharding.NamedSharding on a Mesh, as "
                f"nnx.with_partitioning under jax.set_mesh gives)"
            )
        out.append((jax.tree_util.keystr(path), x.sharding))
    return out


def model_mesh(tree: object) -> Mesh | None:
    """The mesh ``tree``'s sharded arrays lie on (None: none is sharded); ValueError
    naming a leaf on another mesh than the first one's."""
    named = _named(tree)
    if not named:
        return None
    first, mesh = named[0][0], named[0][1].mesh
    for where, sharding in named[1:]:
        if sharding.mesh != mesh:
            raise ValueError(
                f"{where}: sharded on a mesh {dict(sharding.mesh.shape)} other than "
                f"{first}'s {dict(mesh.shape)}; the step places everything on one mesh"
            )
    return mesh


def own_specs(tree: object) -> list[P]:
    """``P()`` for every leaf: no sharding of its own (the rule alone)."""
    return [P()] * len(jax.tree_util.tree_leaves(tree))


def model_specs(tree: object, mesh: Mesh | None = None) -> list[P]:
    """Each leaf's own ``PartitionSpec`` (``P()``: on one device or replicated), in leaf
    order; ValueError naming a sharded leaf whose mesh is not ``mesh`` (when given)."""
    named = dict(_named(tree))
    out = []
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        sharding = named.get(jax.tree_util.keystr(path))
        if sharding is None:
            out.append(P())
            continue
        if mesh is not None and sharding.mesh != mesh:
            raise ValueError(
                f"{jax.tree_util.keystr(path)}: sharded on a mesh {dict(sharding.mesh.shape)} "
                f"(devices {[d.id for d in sharding.mesh.devices.flat]}), not the step's "
                f"{dict(mesh.shape)} (devices {[d.id for d in mesh.devices.flat]}): pass "
                f"the mesh the model is sharded on"
            )
        out.append(P(*_entries(sharding.spec, np.ndim(x))))
    return out


def opt_state_specs(opt_state: object, params: object, param_specs: list[P]) -> list[P]:
    """The optimizer state's leaves' specs: the spec of the parameter whose tree path
    ends the leaf's (the longest such) and whose shape it has, else ``P()``."""
    found = {}
    for (path, x), spec in zip(jax.tree_util.tree_leaves_with_path(params), param_specs,
                               strict=True):  # fmt: skip
        found[tuple(path)] = (tuple(np.shape(x)), spec)
    longest = sorted(found, key=len, reverse=True)
    out = []
    for path, x in jax.tree_util.tree_leaves_with_path(opt_state):
        path = tuple(path)
        match = next(
            (p for p in longest
             if path[len(path) - len(p):] == p and found[p][0] == tuple(np.shape(x))),
            None,
        )  # fmt: skip
        out.append(found[match][1] if match is not None else P())
    return out


def piece(spec: P, shape: tuple[int, ...], mesh_shape: Mapping[str, int]) -> tuple[int, ...]:
    """``shape`` divided by the mesh axes other than ``data`` that ``spec`` splits it
    over: what one data-parallel ring sees."""
    return tuple(
        d // math.prod(mesh_shape[a] for a in _axes(e) if a != AXIS)
        for d, e in zip(shape, _entries(spec, len(shape)), strict=True)
    )


def placed_spec(spec: P, shape: tuple[int, ...], mesh_shape: Mapping[str, int],
                sharded: bool) -> P:  # fmt: skip
    """``spec`` (a leaf's own) with ZeRO's ``data`` axis added where a ``sharded``
    placement splits the leaf (module docstring)."""
    entries = _entries(spec, len(shape))
    if not sharded or any(AXIS in _axes(e) for e in entries):
        return P(*entries)
    axis = shard_axis(piece(spec, shape, mesh_shape), mesh_shape[AXIS])
    if axis is not None:
        axes = (*_axes(entries[axis]), AXIS)
        entries[axis] = axes[0] if len(axes) == 1 else axes
    return P(*entries)


def data_sharded(tree: object, specs: list[P]) -> list[str]:
    """The paths of the leaves whose own spec splits them over ``data``."""
    return [
        jax.tree_util.keystr(path)
        for (path, _), spec in zip(jax.tree_util.tree_leaves_with_path(tree), specs, strict=True)
        if any(AXIS in _axes(e) for e in spec)
    ]


def tensors(tree: object, specs: list[P], mesh_shape: Mapping[str, int]) -> tuple[Tensor, ...]:
    """The accounting's view of ``tree``'s leaves (arrays or ShapeDtypeStructs) under
    their own ``specs``: each leaf's :func:`piece` and the axis it splits over ``data``."""
    out = []
    for x, spec in zip(jax.tree_util.tree_leaves(tree), specs, strict=True):
        shape = tuple(np.shape(x))
        entries = _entries(spec, len(shape))
        data = next((i for i, e in enumerate(entries) if AXIS in _axes(e)), None)
        out.append(Tensor(piece(spec, shape, mesh_shape), np.dtype(x.dtype).itemsize, data))
    return tuple(out)

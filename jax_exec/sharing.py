"""Parameters read by several layers (tied weights): held once, gradients summed.

One ``nnx.Param`` object read by several layers (an embedding reused as the output
projection, a block applied twice) belongs to the first layer that reads it, its
*owner*. The parameter list the API hands out (``Lowered.params()``, the gradients of
``run`` and ``value_and_grad``) holds, per layer, only the parameters that layer owns,
so an optimizer updates a shared parameter once. Inside a step,
:meth:`Sharing.expand` rebuilds every layer's full parameter pytree from that list (a
shared leaf is the owner's, the same traced value), so ``jax.grad`` of the compiled
path sums the gradient of every use; the op-by-op runtime gets one partial gradient
per layer and :meth:`Sharing.fold` sums them into the owner's entry. The result is
the gradient of the plain model, as ``nnx.value_and_grad`` gives it.

Linen layers (``(module, variables)`` pairs) hold plain arrays, whose identity does
not survive an optimizer step: the same array in two Linen layers is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from flax import nnx


@dataclass(frozen=True)
class SharedParam:
    """One parameter read by layer ``layer`` (as ``path``) and owned by layer ``owner``."""

    layer: str
    path: str
    owner: str
    owner_path: str


@dataclass(frozen=True)
class _Unit:
    """One parameter object in a layer's full parameters: where its leaves come from."""

    owner: int  # the layer that holds it in the handed-out parameter list
    index: int  # its position among the owner's owned units
    leaves: int  # how many array leaves it has (1 for an nnx.Param of one array)


@dataclass(frozen=True)
class Sharing:
    """How each layer's full parameters are built from the owned ones (module doc).

    Attributes:
        shared: every parameter read by a layer that does not own it.
        owned: per layer, its owned parameters (an ``nnx.State`` of the layer's own
            Variables), or None when it owns all it reads.
        units: per layer, its full parameters' units in flattening order.
        full_trees, owned_trees: per layer, tree structures of the full and owned
            parameter pytrees.
        owned_leaves: per layer, the leaf count of each owned unit.
    """

    shared: tuple[SharedParam, ...] = ()
    owned: tuple = ()
    units: tuple[tuple[_Unit, ...], ...] = ()
    full_trees: tuple = ()
    owned_trees: tuple = ()
    owned_leaves: tuple[tuple[int, ...], ...] = ()

    def describe(self) -> str:
        """The shared parameters in words."""
        return "; ".join(
            f"layer {s.layer} reads the parameter {s.path} of layer {s.owner} ({s.owner_path})"
            for s in self.shared
        )

    def own(self, full: Sequence[Any]) -> list:
        """Per layer, its owned parameters, from every layer's full parameters."""
        if not self.shared:
            return list(full)
        return [f if o is None else o for f, o in zip(full, self.owned, strict=True)]

    def expand(self, owned: Sequence[Any]) -> list:
        """Per layer, its full parameters from the owned ones (traceable)."""
        if not self.shared:
            return list(owned)
        if len(owned) != len(self.units):
            raise ValueError(f"params has {len(owned)} entries, the model {len(self.units)} layers")
        chunks = [
            _chunks(f"params[{s}]", jax.tree_util.tree_leaves(p), counts)
            for s, (p, counts) in enumerate(zip(owned, self.owned_leaves, strict=True))
        ]
        return [
            jax.tree_util.tree_unflatten(tree, [x for u in units for x in chunks[u.owner][u.index]])
            for tree, units in zip(self.full_trees, self.units, strict=True)
        ]

    def fold(self, grads: Sequence[Any]) -> list:
        """Per-layer gradients of the full parameters -> of the owned ones, summed over uses."""
        if not self.shared:
            return list(grads)
        total: list[list] = [[None] * len(counts) for counts in self.owned_leaves]
        for j, (g, units) in enumerate(zip(grads, self.units, strict=True)):
            leaves = jax.tree_util.tree_leaves(g)
            chunks = _chunks(f"grads[{j}]", leaves, tuple(u.leaves for u in units))
            for u, chunk in zip(units, chunks, strict=True):
                have = total[u.owner][u.index]
                if have is not None:
                    chunk = [a + b for a, b in zip(have, chunk, strict=True)]
                total[u.owner][u.index] = chunk
        return [
            jax.tree_util.tree_unflatten(tree, [x for chunk in per for x in chunk])
            for tree, per in zip(self.owned_trees, total, strict=True)
        ]


def _chunks(what: str, leaves: list, counts: Sequence[int]) -> list[list]:
    if len(leaves) != sum(counts):
        raise ValueError(f"{what} has {len(leaves)} arrays, expected {sum(counts)}")
    out, at = [], 0
    for n in counts:
        out.append(leaves[at : at + n])
        at += n
    return out


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _named_units(params: Any) -> list[tuple[str, Any]]:
    """(dotted path, unit) of a parameter pytree: Variables (NNX) or arrays (Linen)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_variable)
    return [(".".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path), unit)
            for path, unit in flat]  # fmt: skip


def find_sharing(stages: Sequence[Any]) -> Sharing:
    """Which parameter objects several stages read; a TypeError for shared Linen arrays."""
    first: dict[int, tuple[int, str]] = {}  # id(unit) -> (first stage, its path there)
    named = [_named_units(s.params) for s in stages]
    shared: list[SharedParam] = []
    for j, (stage, units) in enumerate(zip(stages, named, strict=True)):
        for path, unit in units:
            if id(unit) not in first:
                first[id(unit)] = (j, path)
                continue
            owner, owner_path = first[id(unit)]
            if stage.kind == "linen" or stages[owner].kind == "linen":
                raise TypeError(
                    f"layers {stages[owner].name} and {stage.name} hold the same parameter "
                    f"array ({owner_path}, {path}): Linen arrays cannot be tied across layers "
                    f"(an optimizer step would give two arrays); tie weights inside one Linen "
                    f"module, or use NNX modules (a shared nnx.Param is supported)"
                )
            if owner != j:
                shared.append(SharedParam(stage.name, path, stages[owner].name, owner_path))
    if not shared:
        return Sharing()
    owned, units, full_trees, owned_trees, owned_leaves = [], [], [], [], []
    index: dict[int, tuple[int, int]] = {}  # id(unit) -> (owner, index among owned units)
    for j, (stage, named_units) in enumerate(zip(stages, named, strict=True)):
        mine = {id(u) for _, u in named_units if first[id(u)][0] == j}
        drops = any(first[id(u)][0] != j for _, u in named_units)  # NNX only (Linen refused)
        keep = lambda _, v, mine=mine: id(v) in mine  # noqa: E731
        p = _filtered(stage.params, keep) if drops else stage.params
        owned.append(p if drops else None)
        own_units = jax.tree_util.tree_leaves(p, is_leaf=_is_variable)
        index.update({id(u): (j, m) for m, u in enumerate(own_units)})
        owned_leaves.append(tuple(len(jax.tree_util.tree_leaves(u)) for u in own_units))
        owned_trees.append(jax.tree_util.tree_structure(p))
        full_trees.append(jax.tree_util.tree_structure(stage.params))
        units.append(tuple(
            _Unit(*index[id(u)], len(jax.tree_util.tree_leaves(u)))
            for u in jax.tree_util.tree_leaves(stage.params, is_leaf=_is_variable)
        ))  # fmt: skip
    return Sharing(
        tuple(shared),
        tuple(owned),
        tuple(units),
        tuple(full_trees),
        tuple(owned_trees),
        tuple(owned_leaves),
    )


def _filtered(state: Any, keep: Any) -> Any:
    """``state``'s variables that ``keep`` (a Flax filter) selects: ``nnx.filter_state``
    where Flax has it (``State.filter`` is deprecated there), else ``State.filter``."""
    filter_state = getattr(nnx, "filter_state", None)
    return filter_state(state, keep) if filter_state is not None else state.filter(keep)

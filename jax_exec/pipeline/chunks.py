"""Jitted kernels of a chunk of stages, cached across calls (the MPMD and dynamic runtimes).

A chunk [i, j) of a stage list (:mod:`jax_exec.stages`) gets one set of jitted
functions (:class:`ChunkKernels`): its forward, its ``jax.vjp`` returned as residuals
without parameter copies, the full backward, the input and weight parts of a split
backward, and the recomputing backwards. :func:`interval_kernels` caches them per
computation, so a training loop compiles once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

from jax_exec.stages import Stage


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


def _signature(tree: Any) -> tuple:
    """Structure, shapes and dtypes of a pytree of arrays (or of tracers of them)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((tuple(v.shape), str(v.dtype)) for v in leaves)


def _used_leaves(fn: Callable, *args: Any) -> tuple[bool, ...]:
    """For every leaf of ``args``, whether ``fn``'s outputs depend on it (dead-code
    elimination on ``jax.make_jaxpr(fn)``: an equation is kept when one of its outputs
    is needed, and then all its inputs are)."""
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    need = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    for eqn in reversed(jaxpr.eqns):
        if eqn.effects or any(v in need for v in eqn.outvars):
            need.update(v for v in eqn.invars if not isinstance(v, Literal))
    return tuple(v in need for v in jaxpr.invars)


class ChunkKernels:
    """Jitted functions of one chunk (``last``: it ends with the loss). The forward
    kernels take ``(p, r, a, *tail)`` with ``tail = (y, scale)`` on the last chunk
    and ``()`` elsewhere.

    A ``jax.vjp`` closure returned by a jitted function would carry a copy of every
    parameter its backward reads (jit does not hand its inputs back as outputs), one
    per micro-batch in flight. So the forward returns the closure as its residuals
    without the parameters (``res``), and the backward kernels rebuild it from the
    parameters and a *layout* (the closure's structure, which leaves are which
    parameter, the residuals' shapes), recorded while the forward is traced
    (:meth:`layout`).

    A split backward applies the same closure twice, each time for one output: the
    input part computes d_i only, the weight part the parameter gradients only
    (separate computations: XLA drops what the other part needs). Between them only
    the residuals the weight part reads are kept (:meth:`weight_residuals`, by
    dead-code elimination of its jaxpr); the rest is freed with the input part.
    """

    def __init__(self, stages: Sequence[Stage], i: int, j: int, last: bool, loss_fn):
        f = interval_fn(stages, i, j)
        self.fwd = jax.jit(f)
        self.layouts: dict = {}
        self.masks: dict = {}
        if last:

            def g(p, r, a, y, scale):
                return loss_fn(f(p, r, a), y) * scale
        else:
            g = f  # noqa: E731 - same signature without the tail

        def vjp(p, r, a, tail):
            """(out, residuals without the parameters); records the layout."""
            out, fn = jax.vjp(lambda p, a: g(p, r, a, *tail), p, a)
            leaves, treedef = jax.tree_util.tree_flatten(fn)
            index = {id(q): k for k, q in enumerate(jax.tree_util.tree_leaves(p))}
            where, res = [], []
            for leaf in leaves:
                if id(leaf) in index:
                    where.append(("p", index[id(leaf)]))
                else:
                    where.append(("r", len(res)))
                    res.append(leaf)
            shapes = tuple((tuple(v.shape), str(v.dtype)) for v in res)
            # the first trace's layout stays: a retrace (another device) makes an equal
            # closure whose treedef holds a new function object, and the backward
            # kernels take the layout as a static argument (a new one would recompile)
            self.layouts.setdefault(
                _signature((p, r, a, tail[:1])), (treedef, tuple(where), shapes)
            )
            return out, res

        def apply(p, res, d, layout):
            """The closure rebuilt and applied to d: (parameter gradients, d_i); a
            residual given as None (not kept) reads as zeros (and must be unused)."""
            treedef, where, shapes = layout
            pl = jax.tree_util.tree_leaves(p)
            res = [jnp.zeros(*shapes[k]) if v is None else v for k, v in enumerate(res)]
            leaves = [pl[k] if kind == "p" else res[k] for kind, k in where]
            return jax.tree_util.tree_unflatten(treedef, leaves)(d)

        def recompute_full(p, r, a, tail, d):
            _, res = vjp(p, r, a, tail)
            return apply(p, res, d, self.layout(p, r, a, tail))

        def recompute_input(p, r, a, tail, d):
            """d_i (None when i == 0) and the residuals the weight part reads."""
            _, res = vjp(p, r, a, tail)
            layout = self.layout(p, r, a, tail)
            keep = self.weight_residuals(p, res, d, layout)
            da = apply(p, res, d, layout)[1]  # unused on the first chunk (d_0)
            return da, [v if k else None for v, k in zip(res, keep, strict=True)]

        self._apply = apply
        self.value = jax.jit(g)  # the output, or the scaled loss on the last chunk
        self.vjp = jax.jit(lambda p, r, a, *tail: vjp(p, r, a, tail))
        self.full = jax.jit(apply, static_argnums=3)
        self.input_part = jax.jit(lambda p, res, d, layout: apply(p, res, d, layout)[1],
                                  static_argnums=3)  # fmt: skip
        self.weight_part = jax.jit(lambda p, res, d, layout: apply(p, res, d, layout)[0],
                                   static_argnums=3)  # fmt: skip
        self.recompute_full = jax.jit(recompute_full)
        self.recompute_input = jax.jit(recompute_input)

    def layout(self, p, r, a, tail: tuple) -> tuple:
        """The closure layout recorded when the forward was traced for these inputs."""
        return self.layouts[_signature((p, r, a, tail[:1]))]

    def weight_residuals(self, p, res, d, layout) -> tuple[bool, ...]:
        """Which residuals the weight part reads (cached per layout)."""
        if layout not in self.masks:
            n = len(jax.tree_util.tree_leaves(p))
            used = _used_leaves(
                lambda p, res, d: self._apply(p, res, d, layout)[0], p, list(res), d
            )
            self.masks[layout] = used[n : n + len(res)]
        return self.masks[layout]


# Compiled kernels live across calls (an LRU of this many chunks): keyed by the
# stages' computations (``Stage.key``: the NNX graph definition, or the Linen module)
# and the loss function; jax.jit's own cache then separates shapes, dtypes and devices.
KERNEL_CACHE_SIZE = 256
_KERNELS: OrderedDict = OrderedDict()


def interval_kernels(
    stages: Sequence[Stage], i: int, j: int, loss_fn: Callable | None = None
) -> ChunkKernels:
    """The (cached) jitted kernels of stages i..j-1; with the loss when j == L.

    A key that cannot be hashed (or a new ``loss_fn`` object at every call) builds
    fresh kernels, which compile again: pass the same loss function each step.
    """
    last = j == len(stages)
    key = (tuple(s.key for s in stages[i:j]), last, loss_fn if last else None)
    try:
        hash(key)
    except TypeError:
        return ChunkKernels(stages, i, j, last, loss_fn)
    if key in _KERNELS:
        _KERNELS.move_to_end(key)
        return _KERNELS[key]
    kern = _KERNELS[key] = ChunkKernels(stages, i, j, last, loss_fn)
    while len(_KERNELS) > KERNEL_CACHE_SIZE:
        _KERNELS.popitem(last=False)
    return kern

"""What the MPMD (and dynamic) runtimes run for a chunk [i, j) of stages.

- inference, and the dynamic runtimes (inference and training): :class:`ChunkKernels`,
  the chunk's jitted forward and its ``jax.vjp`` returned as residuals without
  parameter copies, with the backward kernels that rebuild the closure, cached per
  computation by :func:`interval_kernels`;
- training: :class:`ChunkProgram`, the chunk as a chain schedule of its sub-chain
  (:func:`schedir.chain.ops.store_all_ops`, :func:`recompute_ops`, or a rotor plan's
  ops), each chain op one of the stage kernels of :mod:`jax_exec.kernels` (cached
  there per computation and shapes), so that a training loop compiles once and a chunk
  holds exactly the buffers its chain schedule names; :func:`weight_data_bytes`
  profiles what a split backward keeps per stage for its weight part
  (``wgrad_bytes``).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

from jax_exec.auto.lowbit import compressed_node
from jax_exec.execute.buffers import HOST
from jax_exec.execute.copies import carry_out
from jax_exec.kernels import stage_functions
from jax_exec.stages.split import Stage, as_stages, spec_bytes
from schedir import B, F_all, F_ck, F_n, Loss
from schedir.chain.ops import buffer_moves
from schedir.offload.effects import CopyEffect, CopyStates
from schedir.offload.ops import COPY_OP_TYPES


def split_microbatches(tree: Any, m: int) -> list:
    """``m`` equal slices along axis 0 of every leaf (the batch must divide); a tree
    without leaves (no target) is the same for every micro-batch."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return [tree] * m
    n = leaves[0].shape[0]
    if n % m:
        raise ValueError(f"batch of {n} is not divisible into {m} micro-batches")
    size = n // m
    return [jax.tree_util.tree_map(lambda a, k=k: a[k * size : (k + 1) * size], tree)
            for k in range(m)]  # fmt: skip


def given_stages(layers: Any) -> list[Stage]:
    """``layers`` as stages: a list of :class:`~jax_exec.stages.split.Stage` objects
    taken as they are (a traced model's, :mod:`jax_exec.pipeline.traced`, whose
    activations are tuples and whose maker sums the gradients of a parameter several
    of them read), anything else through :func:`~jax_exec.stages.split.as_stages`."""
    given = list(layers) if isinstance(layers, list | tuple) else []
    return given if given and all(isinstance(s, Stage) for s in given) else as_stages(layers)


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


_STORED: dict = {}


def stored_functions(stage: Stage, spec: Any, storage: str | None) -> Any:
    """The stage's kernels (:func:`jax_exec.kernels.stage_functions`) with its new
    residuals stored in ``storage`` (:func:`jax_exec.auto.lowbit.compressed_node`;
    None: themselves), cached per kernels and storage."""
    fns = stage_functions(stage, spec)
    if storage is None:
        return fns
    key = (id(fns), storage)
    if key not in _STORED:  # the plain kernels kept alive with their id
        _STORED[key] = (compressed_node(fns, storage), fns)
    return _STORED[key][0]


def recompute_ops(n: int) -> tuple:
    """The chunk checkpointed whole (``jax.checkpoint`` semantics): its forward keeps
    its input and output only, its backward recomputes it storing everything:
    ``F_ck(0) F_n(1..n-1) Loss F_all(0..n-1) B(n-1..0)``."""
    return (F_ck(0), *(F_n(k) for k in range(1, n)), Loss(), *(F_all(k) for k in range(n)),
            *(B(k) for k in reversed(range(n))))  # fmt: skip


class WeightData(NamedTuple):
    """What a split backward keeps for its weight part (a pytree: the runtime measures
    its arrays): the whole stash and d_j (``stash``, ``d``: the weight part reruns the
    chunk's backward), or per stage the arrays its weight gradient reads (``stages``:
    (k, leaves or None, cotangent))."""

    stash: Any = None
    d: Any = None
    stages: tuple = ()


@dataclass(frozen=True)
class ChunkBackward:
    """What a chunk's backward made: the input gradient ``d_in`` (None on the first
    chunk), the micro-batch's ``loss`` (the last chunk; else None) and either the
    parameter ``grads`` (a full backward) or the :class:`WeightData` its weight part
    reads (``weight``: an input part)."""

    d_in: Any
    loss: Any
    grads: list | None = None
    weight: WeightData | None = None


class ChunkProgram:
    """One chunk [i, j) of a training pipeline run as a chain schedule of its own
    sub-chain (stages i..j-1 as local stages 0..n-1; its ``Loss`` is the arrival of
    d_j, or the real loss when j == L), split at its ``Loss``: the forward op runs the
    ops before it, the backward op the loss and the ops after it (recomputations
    included). Each chain op runs one jitted stage kernel
    (:func:`jax_exec.kernels.stage_functions`: ``F_all`` records exactly the profiler's
    ``abar``, the stage output and the new residuals of its ``jax.vjp``; ``B`` rebuilds
    the vjp closure from them) on buffers named as the chain simulator names them and
    dropped when :func:`schedir.chain.ops.buffer_moves` frees them. So a chunk holds
    between its forward and its backward exactly what its chain schedule holds before
    its ``Loss`` (store-all: its input and every stage's ``abar``; a rotor plan: what
    rotor planned), and its backward recomputes what that schedule recomputes.

    ``storages``: per local stage, the low-bit storage of its new residuals (None:
    full precision; :func:`stored_functions`): its ``F_all`` keeps them compressed,
    its ``B`` decodes them. Default: every stage in full precision.

    A split backward (``Bi`` then ``W``): with ``per_stage`` False the input part
    computes d_i and frees nothing, the weight part reruns the backward for the
    parameter gradients (what the ops' model holds when the problem gives no
    ``wgrad_bytes``); with ``per_stage`` the input part keeps, for every stage, the
    arrays its weight gradient reads (dead-code elimination of the stage's backward)
    and the cotangent of its output, and frees the rest.
    """

    def __init__(self, stages: Sequence[Stage], i: int, j: int, specs: Sequence,
                 loss_fn: Callable | None, ops: Sequence,
                 storages: Sequence[str | None] = ()):  # fmt: skip
        self.n = j - i
        self.last = loss_fn is not None
        storages = tuple(storages) or (None,) * self.n
        self.fns = [stored_functions(stages[k], specs[k], s)
                    for k, s in zip(range(i, j), storages, strict=True)]  # fmt: skip
        ops = tuple(ops)
        self.copies = any(type(op) in COPY_OP_TYPES.values() for op in ops)
        at = next(k for k, op in enumerate(ops) if isinstance(op, Loss))
        self.forward_ops, self.backward_ops = ops[:at], ops[at + 1 :]
        self.loss_grad = _loss_grad(loss_fn) if self.last else None
        self.parts = [_parts(f) for f in self.fns]

    def forward(self, p: list, r: list, a: jax.Array) -> tuple[dict, jax.Array | None]:
        """(the stash: chain buffer name -> arrays, the chunk output a_j or None)."""
        table: dict = {("a", 0): (a,)}
        if self.copies:  # where each buffer is (schedir.offload.effects' rules)
            table[COPIES] = CopyStates({("a", 0): "dev"})
        for op in self.forward_ops:
            self._run(op, p, r, table, None)
        if self.last:
            return table, None
        held = table.get(("abar", self.n)) or table[("a", self.n)]
        return table, held[0]

    def backward(self, p, r, stash: dict, seed, part: str = "full", per_stage: bool = False):
        """Run the loss (``seed`` = (y, scale) on the last chunk, else d_j) and the ops
        after it (:class:`ChunkBackward`: with ``part`` "full" the parameter gradients,
        with "input" the weight part's data)."""
        table = dict(stash)  # the stash itself stays intact (a weight part may reread it)
        if self.copies:
            table[COPIES] = copy.deepcopy(stash[COPIES])
        reads, (out,), frees = buffer_moves(Loss(), self.n, table)
        self._moved(table, reads, out, frees)
        loss = None
        if self.last:
            y, scale = seed
            loss, d = self.loss_grad(table[reads[0]][0], y, scale)
        else:
            d = seed
        table[out] = (d,)
        for name in frees:
            del table[name]
        grads: list = [None] * self.n
        kept: list = []
        mode = "full" if part == "full" else ("keep" if per_stage else "input")
        for op in self.backward_ops:
            self._run(op, p, r, table, grads, mode, kept)
        d_i = table[("d", 0)][0] if table.get(("d", 0)) else None
        if part == "full":
            return ChunkBackward(d_i, loss, grads=grads)
        if per_stage:
            return ChunkBackward(d_i, loss, weight=WeightData(stages=tuple(kept)))
        return ChunkBackward(d_i, loss, weight=WeightData(stash=stash, d=seed))

    def weight(self, p, r, data: WeightData) -> list:
        """The parameter gradients of a split backward from its :class:`WeightData`."""
        if not data.stages:
            return self.backward(p, r, data.stash, data.d).grads
        grads: list = [None] * self.n
        for k, leaves, d in data.stages:
            grads[k] = self.parts[k].weight(p[k], r[k], leaves, d)
        return grads

    def _run(self, op, p, r, table, grads, mode="full", kept=None) -> None:
        if type(op) in COPY_OP_TYPES.values():
            _copy(table, table[COPIES].effect(op))
            return
        reads, (out,), frees = buffer_moves(op, self.n, table)
        self._moved(table, reads, out, frees)
        a = table[reads[-1]][0]  # the stage input: a[k], or abar[k] (which holds a_k)
        fns = self.fns[getattr(op, "index", 0)]
        if isinstance(op, B):
            k = op.index
            saved = table[("abar", k + 1)]
            (d_out,) = table[("d", k + 1)]
            args = (p[k], r[k], (a,), saved[0], saved[1:], (d_out,))
            if mode == "full":
                grads[k], (d_in,) = fns.bwd(*args)
            else:
                d_in = self.parts[k].input(*args)
                if mode == "keep":
                    kept.append((k, self.parts[k].keep(args), d_out))
            made = (d_in,)
        elif isinstance(op, F_all):
            o, new = fns.rec(p[op.index], r[op.index], (a,))
            made = (o, *new)
        else:
            made = (fns.fwd(p[op.index], r[op.index], (a,)),)
        # the gradient of an integer input (token ids) is float0: nothing to hold
        table[out] = tuple(v for v in made if getattr(v, "dtype", None) != jax.dtypes.float0)
        for name in frees:
            del table[name]

    def _moved(self, table: dict, reads: tuple, out: Any, frees: tuple) -> None:
        """A compute op's reads (settling the prefetches among them), output and frees
        in the chunk's copy states, when it has copy ops."""
        states = table.get(COPIES)
        if states is None:
            return
        for change in states.reads(reads):
            _copy(table, change)
        for name in frees:
            states.free(name)
        states.add(out)


# the stash key of a chunk's copy states (CopyStates), when its plan has copy ops
COPIES = ("copies",)


def _copy(table: dict, change: CopyEffect) -> None:
    """Carry out one copy effect on a chunk's buffers
    (:func:`~jax_exec.execute.copies.carry_out`): the host copy made by
    ``jax.device_put`` to the device's ``pinned_host`` memory, brought back to its
    default memory."""
    carry_out(
        change, table, lambda t: _moved_to(t, HOST), lambda t: _moved_to(t, "device"),
        table.pop,
    )  # fmt: skip


def _moved_to(tree: Any, kind: str) -> Any:
    """``tree``'s arrays copied to the memory ``kind`` of their device."""

    def move(a: jax.Array) -> jax.Array:
        device = next(iter(a.devices()))
        return jax.device_put(a, jax.sharding.SingleDeviceSharding(device, memory_kind=kind))

    return jax.tree_util.tree_map(move, tree)


class _StageParts:
    """The input and weight parts of one stage's backward (jitted apart: XLA computes
    only what each returns), and which saved arrays the weight part reads."""

    def __init__(self, fns):
        # traced unjitted for the dead-code elimination (a nested jit is one equation)
        bwd = getattr(fns.bwd, "__wrapped__", fns.bwd)

        def weight(p, r, saved, cots):
            return bwd(p, r, (saved[0],), saved[1], tuple(saved[2:]), cots)[0]

        self.input = jax.jit(lambda *args: fns.bwd(*args)[1][0])
        self._traced = weight
        self._weight = jax.jit(weight)
        self.mask: tuple | None = None
        self.specs: tuple = ()

    def keep(self, args: tuple) -> tuple:
        """The stage's (a, out, *new), None where the weight part does not read it."""
        p, r, ins, out, new, cots = args
        saved = (ins[0], out, *new)
        if self.mask is None:
            self.mask = self.used(p, r, saved, cots)
            self.specs = tuple(jax.ShapeDtypeStruct(v.shape, v.dtype) for v in saved)
        return tuple(v if use else None for v, use in zip(saved, self.mask, strict=True))

    def used(self, p, r, saved: tuple, cots: tuple) -> tuple[bool, ...]:
        """Which of ``saved`` (arrays or shapes) the weight part reads."""
        return _used_leaves(lambda s, d: self._traced(p, r, s, d), list(saved), cots)[: len(saved)]

    def weight(self, p, r, leaves: tuple, d) -> Any:
        """The parameter gradients from what :meth:`keep` kept (zeros where unread)."""
        full = [jnp.zeros(spec.shape, spec.dtype) if v is None else v
                for v, spec in zip(leaves, self.specs, strict=True)]  # fmt: skip
        return self._weight(p, r, full, (d,))


def weight_data_bytes(stages: Sequence[Stage], specs: Sequence) -> tuple[int, ...]:
    """Per stage, the bytes a split backward keeps for its weight part when it frees
    early (``wgrad_bytes`` of :class:`schedir.PipelineProblem`, what
    :meth:`ChunkProgram.backward` keeps with ``per_stage``): the saved arrays (input,
    output, new residuals) the stage's weight gradient reads, found by dead-code
    elimination, and the cotangent of its output; 0 for a stage without parameters.
    ``specs``: shapes of a_0 .. a_L for one micro-batch."""
    out = []
    for stage, spec in zip(stages, specs, strict=False):
        fns = stage_functions(stage, spec)
        if not jax.tree_util.tree_leaves(stage.params):
            out.append(0)
            continue
        saved = (spec, fns.out, *fns.recipe.new)
        parts = _parts(fns)
        used = parts.used(stage.params, stage.rest, saved, (fns.out,))
        out.append(sum(spec_bytes(v) for v, u in zip(saved, used, strict=False) if u)
                   + spec_bytes(fns.out))  # fmt: skip
    return tuple(out)


_PARTS: dict = {}


def _parts(fns) -> _StageParts:
    if id(fns) not in _PARTS:
        _PARTS[id(fns)] = (_StageParts(fns), fns)  # the functions kept alive with their id
    return _PARTS[id(fns)][0]


_LOSS_GRADS: dict = {}


def _loss_grad(loss_fn: Callable) -> Callable:
    """``(a_L, y, scale) -> (scale * loss, scale * d a_L)``, jitted once per loss."""
    if loss_fn not in _LOSS_GRADS:

        def loss_grad(a, y, scale):
            value, d = jax.value_and_grad(loss_fn)(a, y)
            return value * scale, d * scale

        _LOSS_GRADS[loss_fn] = jax.jit(loss_grad)
    return _LOSS_GRADS[loss_fn]


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

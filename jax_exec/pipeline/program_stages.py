"""A traced program's slices as pipeline stages (:mod:`jax_exec.pipeline.traced`).

A pipeline stage runs blocks ``[first, last)`` of a traced model's block chain
(:mod:`jax_exec.program`): :class:`StageSlice` says which equations, parameters and
other globals it reads and which values it receives and sends; :func:`program_stage`
makes it a :class:`~jax_exec.stages.split.Stage` of kind ``"program"``. The values
that travel are a tuple: those crossing the cut, then the call arguments the stages
from there on read; integers and booleans travel bit-cast to a float of their width
(:func:`encode`, :func:`decode`), so that every carried array has a float cotangent
(zeros) as the chain model counts it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_exec.program.blocks import Blocks
from jax_exec.program.flat import Lit, Program, evaluate, read, strongly_typed
from jax_exec.program.model import BlockModel
from jax_exec.stages.split import Stage


@dataclass(frozen=True)
class StageSlice:
    """What one pipeline stage runs of the traced program.

    Attributes:
        blocks: ``(first, last)``: the blocks it runs (the last stage: up to the loss
            block included).
        eqns: ``(start, stop)``: its equations.
        params: positions (in the model's flattened ``nnx.Param`` leaves) of the
            parameters it reads.
        others: value ids of the other globals it reads (model state, constants).
        derived: value ids of the slices of stacked globals it reads (a scan's).
        ins, outs: value ids of its input and output tuples (cut values, then call
            arguments); ``outs`` is empty on the last stage (it returns the loss).
    """

    blocks: tuple[int, int]
    eqns: tuple[int, int]
    params: tuple[int, ...]
    others: tuple[int, ...]
    derived: tuple[int, ...]
    ins: tuple[int, ...]
    outs: tuple[int, ...]


def param_positions(program: Program, ids: set[int]) -> tuple[int, ...]:
    """Positions among the parameter leaves of the parameters among ``ids``."""
    return tuple(program.param_ids.index(v) for v in sorted(ids & set(program.param_ids)))


def stage_slices(bm: BlockModel, cuts: Sequence[int]) -> list[StageSlice]:
    program, blocks = bm.program, bm.blocks
    n = len(program.eqns)
    starts = [blocks.blocks[c].start for c in cuts[:-1]] + [n]
    args = set(program.arg_ids)
    reads = [
        globals_read(program, starts[q], starts[q + 1], q == len(cuts) - 2)
        for q in range(len(cuts) - 1)
    ]
    # arguments each stage and the stages after it read: the input tuple carries them
    later: list[set] = [set() for _ in range(len(cuts))]
    for q in reversed(range(len(cuts) - 1)):
        later[q] = later[q + 1] | (reads[q] & args)
    out = []
    for q in range(len(cuts) - 1):
        ins = crossing(blocks, cuts[q]) + tuple(sorted(later[q]))
        last = q == len(cuts) - 2
        outs = () if last else crossing(blocks, cuts[q + 1]) + tuple(sorted(later[q + 1]))
        got = reads[q] - args
        derived = tuple(sorted(v for v in got if v in program.derived))
        params = param_positions(program, got)
        others = tuple(sorted(got - set(program.param_ids) - set(derived)))
        out.append(
            StageSlice(
                (cuts[q], cuts[q + 1] + int(last)),
                (starts[q], starts[q + 1]),
                params,
                others,
                derived,
                ins,
                outs,
            )
        )
    for s in out:
        check_carried(program, s.ins)
    return out


def crossing(blocks: Blocks, c: int) -> tuple[int, ...]:
    """The non-global values crossing the cut before block c (none before block 0)."""
    return tuple(blocks.cuts[c]) if c > 0 else ()


def globals_read(program: Program, start: int, stop: int, last: bool) -> set[int]:
    """The globals equations start..stop-1 read (the loss too on the last stage), with
    the sources of the stacked globals' slices they read, transitively."""
    globals_ = set(program.input_ids)
    found = {
        r
        for e in program.eqns[start:stop]
        for r in e.ins
        if not isinstance(r, Lit) and r in globals_
    }
    if last and program.loss in globals_:
        found.add(program.loss)
    todo = [v for v in found if v in program.derived]
    while todo:
        src = program.derived[todo.pop()][0]
        if src not in found:
            found.add(src)
            if src in program.derived:
                todo.append(src)
    return found


def check_carried(program: Program, ids: Sequence[int]) -> None:
    for v in ids:
        dtype = program.avals[v].dtype
        if wire_dtype(dtype) is None:
            where = (
                program.eqns[program.producer[v]].source
                if v in program.producer
                else (f"argument leaf {program.arg_ids.index(v)}")
            )
            raise TypeError(
                f"a value of dtype {dtype} made at {where} crosses a pipeline "
                f"stage boundary: only numbers and booleans can be carried"
            )


def wire_dtype(dtype: Any) -> Any:
    """The float dtype a carried value of ``dtype`` travels as (None: not carried)."""
    dtype = np.dtype(dtype) if not jax.dtypes.issubdtype(dtype, jax.dtypes.extended) else None
    if dtype is None:
        return None
    if jnp.issubdtype(dtype, jnp.inexact):
        return dtype
    if dtype == np.bool_ or jnp.issubdtype(dtype, jnp.integer):
        return np.dtype(np.float64) if dtype.itemsize == 8 else np.dtype(np.float32)
    return None


def encode(v: jax.Array) -> jax.Array:
    """A carried value as a float array: itself, or its bits (module docstring)."""
    if jnp.issubdtype(v.dtype, jnp.inexact):
        return strongly_typed(v)  # as the next stage was traced
    if v.dtype.itemsize < 4:
        v = v.astype(jnp.int32)
    return jax.lax.bitcast_convert_type(v, wire_dtype(v.dtype))


def decode(v: jax.Array, dtype: Any) -> jax.Array:
    """The value :func:`encode` made ``v`` from, of ``dtype``."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return v
    wide = dtype if dtype.itemsize >= 4 else np.dtype(np.int32)
    return jax.lax.bitcast_convert_type(v, wide).astype(dtype)


def stage_apply(program: Program, s: StageSlice, scale: float | None) -> Callable:
    """``apply(params, others, carried) -> carried'`` (or the loss, times ``scale``)."""
    eqns = program.eqns[s.eqns[0] : s.eqns[1]]
    param_ids = tuple(program.param_ids[j] for j in s.params)
    in_dtypes = tuple(program.avals[v].dtype for v in s.ins)

    def apply(params: tuple, others: tuple, carried: tuple) -> Any:
        env = dict(zip(param_ids, params, strict=True))
        env.update(zip(s.others, others, strict=True))
        env.update({v: decode(a, d) for v, a, d in zip(s.ins, carried, in_dtypes, strict=True)})
        for vid in s.derived:  # ascending ids: a slice's source is made before it
            src, i = program.derived[vid]
            env[vid] = env[src][i]
        evaluate(program, eqns, env)
        if scale is not None:
            return read(env, program.loss) * scale
        return tuple(encode(env[v]) for v in s.outs)

    return apply


def model_leaves(program: Program, model: nnx.Module) -> tuple[list, dict]:
    """The model's parameter leaves, and value id -> value of its other globals."""
    _, params, rest = nnx.split(model, nnx.Param, ...)
    p_leaves = jax.tree_util.tree_leaves(params)
    r_leaves = jax.tree_util.tree_leaves(rest)
    others = dict(zip(program.rest_ids, r_leaves, strict=True))
    others.update(program.consts)
    return p_leaves, others


def program_stage(
    program: Program, q: int, s: StageSlice, params: list, others: dict, scale: float | None
) -> Stage:
    return Stage(
        name=f"stage {q} (blocks {s.blocks[0]}..{s.blocks[1] - 1})",
        params=tuple(params[j] for j in s.params),
        rest=tuple(others[v] for v in s.others),
        apply=stage_apply(program, s, scale),
        key=("program", program, q, s, scale),
        kind="program",
    )


def carried_spec(program: Program, s: StageSlice) -> tuple:
    return tuple(
        jax.ShapeDtypeStruct(program.avals[v].shape, wire_dtype(program.avals[v].dtype))
        for v in s.ins
    )

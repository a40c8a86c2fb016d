"""A Segment of the compiled path as a ``custom_vjp`` whose first forward keeps repeated
blocks as loops (docs/auto.md, "Segments' forwards as loops";
:func:`jax_exec.execute.lowering.lower`).

A Segment (``F_ck(i) F_n(i+1..j-1)``) runs blocks i..j-1 forward, saving only its input,
and its backward recomputes them with the subtree's structure. Under
``jax.checkpoint`` the first forward is that same structure, unrolled: its nested
Segments and Records are separate copies in the HLO, one more per nesting level (a
least-budget schedule recomputes a stretch of blocks at every level). Here the Segment
is a ``jax.custom_vjp`` instead: its forward runs the blocks forward only, the scan runs
among them (:func:`~jax_exec.execute.loops.forward_runs`) as one ``lax.scan`` each (a
loop body is compiled once, whatever its trip count), and saves what
``jax.checkpoint`` saved: the Segment's input (its cut values, the globals and
stacked slice ranges its blocks read); its backward is ``jax.vjp`` of the subtree's
structure from that input (behind an optimization barrier, as
``jax.checkpoint(prevent_cse=True)``: XLA must not merge the recomputation with the
first forward; on CPU none, :mod:`jax_exec.execute.barriers`), so the gradients are those of the
checkpointed structure. A Segment without repeated stretches is one too, its first
forward the blocks' forwards in turn (saving :func:`blocks_globals`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.execute.barriers import behind_barrier
from jax_exec.execute.loop_vjp import (
    after_loop,
    loop_operands,
    loop_results,
    looped,
    run_stacks,
)
from jax_exec.execute.loops import ScanRun, Stack, boundary, members
from jax_exec.program.model import BlockModel


def forward_only(model: BlockModel, options: tuple, start: int, stop: int, runs: dict) -> Callable:
    """``f(gv, values) -> (values, results)``: blocks ``start .. stop - 1`` forward from
    the values of cut ``start`` (value id -> array, no stacks) to those of cut ``stop``,
    with the blocks' results; the scan runs among them (``runs``, by first block:
    :func:`~jax_exec.execute.loops.forward_runs`) as loops."""
    loops = {k: looped(model, r, options) for k, r in runs.items()}
    cuts = model.blocks.cuts

    def loop(r: ScanRun, gv: dict, state: dict, results: dict) -> dict:
        c0 = tuple(state[v] for v in boundary(model, r)[0])
        cn, ys, em = loops[r.start](*loop_operands(r, gv, run_stacks({r.start: r}, gv)), c0)
        results.update(loop_results(model, r, ys))
        rows = {v: e[i] for e, vids in zip(em, members(model, r), strict=True) for i, v in
                enumerate(vids)}  # fmt: skip
        return after_loop(model, r, state, cn, rows, cuts[r.blocks.stop])

    wanted = blocks_globals(model, start, stop)
    for r in runs.values():
        wanted += tuple(ln[1] for row in (*r.params, *r.others) for ln in row if ln[0] == "stack")

    def f(gv: dict, state: dict) -> tuple[dict, dict]:
        gv = _with_slices(model, gv, wanted)
        results: dict = {}
        k = start
        while k < stop:
            if k in runs:
                state = loop(runs[k], gv, state, results)
                k = runs[k].blocks.stop
                continue
            lay = model.layouts[k]
            p = tuple(gv[v] for v in lay.params)
            g = tuple(gv[v] for v in lay.others)
            x = tuple(state[v] for v in lay.ins)
            outs, res = model.functions(k, options[k]).forward(p, g, x)
            results.update(zip(lay.results, res, strict=True))
            state = {**state, **dict(zip(lay.outs, outs, strict=True))}
            state = {v: state[v] for v in cuts[k + 1]}
            k += 1
        return state, results

    return f


def blocks_globals(model: BlockModel, start: int, stop: int) -> tuple[int, ...]:
    """The globals blocks ``start .. stop - 1`` read (a Segment without loops saves
    these, as ``jax.checkpoint`` did)."""
    return tuple(dict.fromkeys(
        v for k in range(start, stop) for v in (*model.layouts[k].params, *model.layouts[k].others)
    ))  # fmt: skip


def _root(model: BlockModel, v: int) -> int:
    """The global a derived value (a slice of a stacked global) is sliced from."""
    while v in model.program.derived:
        v = model.program.derived[v][0]
    return v


def globals_read(model: BlockModel, start: int, stop: int, looped: frozenset) -> tuple[int, ...]:
    """The globals Segment ``start .. stop - 1`` saves, as ``jax.checkpoint`` did: those
    its blocks read, but a slice of a stacked global that only the blocks of scan runs
    (``looped``) read (they read the run's slice range instead), and the stacked
    globals themselves (arguments: the first forward slices them as it needs)."""
    found: dict[int, None] = {}
    derived = model.program.derived
    for k in range(start, stop):
        for v in (*model.layouts[k].params, *model.layouts[k].others):
            if v not in derived or k not in looped:
                found[v] = None
            if v in derived:
                found[_root(model, v)] = None
    return tuple(found)


def _with_slices(model: BlockModel, gv: dict, wanted: tuple) -> dict:
    """``gv`` with the slices of stacked globals among ``wanted`` it lacks (as
    :func:`~jax_exec.program.model.global_values` slices them)."""
    gv = dict(gv)

    def get(v: int) -> Any:
        if v not in gv:
            src, i = model.program.derived[v]
            gv[v] = jax.lax.index_in_dim(get(src), i, keepdims=False)
        return gv[v]

    for v in wanted:
        get(v)
    return gv


def segment(
    model: BlockModel, options: tuple, start: int, stop: int, runs: dict,
    stacked: dict[int, tuple[Stack, int]], out_keys: tuple, region: Callable,
) -> Callable:  # fmt: skip
    """``f(gv, stacks, state) -> (state, results)`` of Segment ``start .. stop - 1``
    (module docstring) whose first forward runs ``runs`` as loops: ``region`` is the
    subtree's structure with the same signature (its output restricted to
    ``out_keys``: the ids :func:`~jax_exec.execute.loops.held` gives for cut ``stop``);
    ``state`` holds stacks (``stacked``) in place of their values, as the structure
    does."""
    first = forward_only(model, options, start, stop, runs)
    stack_of = {st.id: st for st, _ in stacked.values()}

    def forward(gv: dict, stacks: dict, state: dict) -> tuple[dict, dict]:
        values = {}
        for key, a in state.items():
            if key in stack_of:
                values.update((v, a[i]) for i, v in enumerate(stack_of[key].values))
            else:
                values[key] = a
        values, results = first(gv, values)

        def held_value(key: int) -> Any:
            if key in state:  # a value (or a stack) passing through
                return state[key]
            if key in stack_of:  # made by a run inside: rows of its loop
                return jnp.stack([values[v] for v in stack_of[key].values])
            return values[key]

        return {key: held_value(key) for key in out_keys}, results

    def recomputed(gv: dict, stacks: dict, state: dict) -> tuple[dict, dict]:
        out, results = region(gv, stacks, state)
        return {key: out[key] for key in out_keys}, results

    @jax.custom_vjp
    def f(gv: dict, stacks: dict, state: dict) -> tuple[dict, dict]:
        return forward(gv, stacks, state)

    def f_fwd(gv: dict, stacks: dict, state: dict):
        return forward(gv, stacks, state), (gv, stacks, state)

    @jax.jit  # a fresh name stack: nested, each level's would hold its callers' twice
    def f_bwd(saved: tuple, cts: tuple) -> tuple:
        saved = behind_barrier(saved)
        _, vjp = jax.vjp(recomputed, *saved)
        return vjp(cts)

    f.defvjp(f_fwd, f_bwd)
    return f

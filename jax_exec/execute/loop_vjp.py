"""A scan run (:mod:`jax_exec.execute.loops`) as one ``lax.scan`` in a ``jax.custom_vjp``
whose residuals are the unrolled Records', stacked (docs/auto.md, "Scans stay loops";
called by :func:`jax_exec.execute.lowering.lower`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.execute.barriers import behind_barrier
from jax_exec.execute.loops import (
    ScanRun,
    boundary,
    carry_cut,
    emits,
    inner_values,
    stack_key,
)
from jax_exec.execute.rounding import unrounded
from jax_exec.program.model import BlockModel


def run_stacks(runs: dict, gv: dict) -> dict:
    """The stacked slice ranges the runs read (:func:`stack_key` -> array), sliced from
    the stacked globals once per step."""
    stacks = {}
    for r in runs.values():
        for row in (*r.params, *r.others):
            for ln in row:
                if ln[0] == "stack":
                    stacks[stack_key(ln, r.length)] = jax.lax.slice_in_dim(
                        gv[ln[1]], ln[2], ln[2] + r.length, axis=0
                    )
    return stacks


def loop_operands(run: ScanRun, gv: dict, stacks: dict) -> tuple[tuple, tuple]:
    """``(P, G)`` of :func:`looped`: per key of :meth:`ScanRun.keys` the global itself
    or its stacked slice range (from ``stacks``, :func:`run_stacks`)."""

    def operand(key: tuple) -> Any:
        return gv[key[1]] if key[0] == "same" else stacks[key[1]]

    p_keys, g_keys = run.keys()
    return tuple(map(operand, p_keys)), tuple(map(operand, g_keys))


def loop_results(model: BlockModel, run: ScanRun, ys: tuple) -> dict:
    """The blocks' results (value id -> array) from :func:`looped`'s ``ys``."""
    found = {}
    for t in range(run.length):
        i = run.time_of(t)  # the slice period t reads (time_of is its own inverse)
        for j, per_block in enumerate(ys):
            lay = model.layouts[run.start + t * run.period + j]
            found.update(zip(lay.results, (y[i] for y in per_block), strict=True))
    return found


def after_loop(
    model: BlockModel, run: ScanRun, state: dict, cn: tuple, made: dict, keys: tuple,
    stacked: dict | frozenset = frozenset(),
) -> dict:  # fmt: skip
    """The values of ``keys`` (cut ``run.blocks.stop``'s, or the stacks holding them)
    after :func:`looped`: what the loop emitted (``made``), else the carry leaving its
    last period (``cn``; but a carry held in a stack of ``stacked``, which ``made``
    has), else the value before the loop (passing by)."""
    _, leaving, changing = boundary(model, run)
    last = carry_cut(model, run.blocks.stop, run.scan)  # leaving the last period, alike
    moved = {
        v: c
        for v, c, u, ch in zip(last, cn, leaving, changing, strict=True)
        if ch and u not in stacked
    }
    return {v: made[v] if v in made else moved[v] if v in moved else state[v] for v in keys}


def _at(stack: Any, i: Any) -> Any:
    return jax.lax.dynamic_index_in_dim(stack, i, 0, keepdims=False)


def looped(model: BlockModel, run: ScanRun, options: tuple) -> Callable:
    """``f(P, G, c0) -> (cn, ys, em)``: the run as one ``lax.scan`` over the slice index
    (``reverse`` for a reverse scan) from ``c0``, the carried cut values entering it
    (:func:`boundary`), to ``cn``, those leaving it; ``ys`` per block of a period its
    results and ``em`` per emitted output (:func:`emits`) its values, stacked in slice
    order. ``P``/``G``: the operands of :meth:`ScanRun.keys` (a stacked slice range, or
    the global itself).

    A ``jax.custom_vjp`` whose residuals are the unrolled Records' (so memory is the
    plan's), stacked: ``c0`` and ``cn`` (held once with the neighbouring blocks), the
    cut values between periods as one ``(length - 1, ...)`` array per changing
    position, the outputs made and consumed inside a period and the options' new
    residuals as ``(length, ...)`` arrays, ``em`` (an emitted value carried to the next
    period is read back from it, not held twice), and ``P``/``G``. The backward is a
    reverse loop applying the blocks' backwards (``BlockFunctions.backward``), the
    cotangents of values read by several blocks or passing through summed.
    """
    n, m, k0 = run.length, run.period, run.start
    layouts = [model.layouts[k] for k in range(k0, k0 + m)]
    fns = [model.functions(k, options[k]) for k in range(k0, k0 + m)]
    entering, leaving, changing = boundary(model, run)
    emitted_values = [layouts[k - k0].outs[o] for k, o in emits(model, run)]
    # carry position -> the emitted output it is (read back from ``em``)
    carried = {j: emitted_values.index(v) for j, v in enumerate(leaving) if v in emitted_values}
    moving = [j for j, c in enumerate(changing) if c and j not in carried]
    inner = [layouts[k - k0].outs[o] for k, o in inner_values(model, run)]
    p_keys, g_keys = run.keys()
    active = model.analysis.active
    forward_reverse = run.step < 0

    def time_of(i: Any) -> Any:  # the period (0 .. n-1 in execution order) reading slice i
        return i if run.step > 0 else n - 1 - i

    def operands(P: tuple, G: tuple, r: int, i: Any) -> tuple:
        def pick(keys: list, values: tuple, row: tuple) -> tuple:
            out = []
            for ln in row:
                key = ln if ln[0] == "same" else ("stack", stack_key(ln, n))
                value = values[keys.index(key)]
                out.append(value if ln[0] == "same" else _at(value, i))
            return tuple(out)

        return pick(p_keys, P, run.params[r]), pick(g_keys, G, run.others[r])

    def period(P: tuple, G: tuple, c: tuple, i: Any, record: bool) -> tuple:
        state = dict(zip(entering, c, strict=True))
        results, news = [], []
        for r in range(m):
            p, g = operands(P, G, r, i)
            x = tuple(state[v] for v in layouts[r].ins)
            if record:
                outs, res, new = unrounded(fns[r].record)(p, g, x)
                news.append(new)
            else:
                outs, res = fns[r].forward(p, g, x)
            state.update(zip(layouts[r].outs, outs, strict=True))
            results.append(res)
        c_next = tuple(state[v] for v in leaving)
        made = tuple(state[v] for v in emitted_values)
        return c_next, tuple(results), made, tuple(news), tuple(state[v] for v in inner)

    @jax.custom_vjp
    def f(P: tuple, G: tuple, c0: tuple) -> tuple:
        def body(c: tuple, i: Any) -> tuple:
            c_next, results, made, _, _ = period(P, G, c, i, False)
            return c_next, (results, made)

        cn, (ys, em) = jax.lax.scan(body, c0, jnp.arange(n), reverse=forward_reverse)
        return cn, ys, em

    def f_fwd(P: tuple, G: tuple, c0: tuple):
        mids0 = tuple(jnp.broadcast_to(c0[j], (n - 1, *c0[j].shape)) for j in moving)

        def body(carry: tuple, i: Any) -> tuple:
            c, mids = carry
            # the carry entering period t goes to slot t - 1 (period 0's is overwritten)
            w = jnp.maximum(time_of(i) - 1, 0)
            mids = tuple(
                jax.lax.dynamic_update_index_in_dim(a, c[j], w, 0)
                for a, j in zip(mids, moving, strict=True)
            )
            c_next, results, made, news, inside = period(P, G, c, i, True)
            return (c_next, mids), (results, made, news, inside)

        (cn, mids), (ys, em, news, inside) = jax.lax.scan(
            body, (c0, mids0), jnp.arange(n), reverse=forward_reverse
        )
        kept = tuple(v if j in moving else None for j, v in enumerate(cn))  # em: carried
        return (cn, ys, em), (P, G, c0, kept, mids, em, news, inside)

    def f_bwd(residuals: tuple, cts: tuple):
        P, G, c0, cn, mids, em, news, inside = residuals
        d_cn, _, d_em = cts
        act_in = [j for j, v in enumerate(entering) if v in active]
        act_out = [j for j, v in enumerate(leaving) if v in active]
        same_p = [q for q, key in enumerate(p_keys) if key[0] == "same"]
        stack_p = [q for q, key in enumerate(p_keys) if key[0] == "stack"]

        def body(carry: tuple, i: Any) -> tuple:
            dc, d_same = carry
            t = time_of(i)
            before = jnp.clip(i - run.step, 0, n - 1)  # the slice of period t - 1
            c_in, c_out = list(c0), list(c0)
            for a, j in zip(mids, moving, strict=True):
                c_in[j] = jnp.where(t == 0, c0[j], _at(a, jnp.maximum(t - 1, 0)))
                c_out[j] = jnp.where(t == n - 1, cn[j], _at(a, jnp.minimum(t, n - 2)))
            for j, e in carried.items():
                c_in[j] = jnp.where(t == 0, c0[j], _at(em[e], before))
            state = dict(zip(entering, c_in, strict=True))
            state.update(zip(inner, (_at(a, i) for a in inside), strict=True))
            state.update(zip(emitted_values, (_at(a, i) for a in em), strict=True))
            state.update((v, c_out[j]) for j, v in enumerate(leaving) if j not in carried)
            d = dict(zip((leaving[j] for j in act_out), dc, strict=True))
            for v, de in zip(emitted_values, d_em, strict=True):
                if v in active:
                    d[v] = d[v] + _at(de, i) if v in d else _at(de, i)
            d_P: list = [None] * len(P)
            for r in reversed(range(m)):
                lay = layouts[r]
                p, g = operands(P, G, r, i)
                x = tuple(state[v] for v in lay.ins)
                outs = tuple(state[v] for v in lay.outs)
                d_outs = tuple(
                    d.pop(v) if v in d else jnp.zeros_like(state[v])
                    for v, a in zip(lay.outs, lay.act_out, strict=True)
                    if a
                )
                new = tuple(_at(a, i) for a in news[r])
                if fns[r].recomputes:  # (as lowering.recorded's backward)
                    p, g, x, outs, new = behind_barrier((p, g, x, outs, new))
                n_act = sum(lay.act_in)
                d_p, d_x = fns[r].backward(p, g, x, outs, (), new, d_outs, (None,) * n_act)
                it = iter(d_x)
                for v, a in zip(lay.ins, lay.act_in, strict=True):
                    if a:
                        dx = next(it)
                        d[v] = d[v] + dx if v in d else dx
                for ln, dp in zip(run.params[r], d_p, strict=True):
                    key = ln if ln[0] == "same" else ("stack", stack_key(ln, n))
                    q = p_keys.index(key)
                    d_P[q] = dp if d_P[q] is None else d_P[q] + dp
            d_P = [
                jnp.zeros_like(P[q]) if dp is None and q in same_p else dp
                for q, dp in enumerate(d_P)
            ]
            dc_next = tuple(
                d.get(entering[j], jnp.zeros_like(c_in[j])) for j in act_in
            )  # fmt: skip
            d_same = tuple(s + d_P[q] for s, q in zip(d_same, same_p, strict=True))
            ys = tuple(
                d_P[q] if d_P[q] is not None else jnp.zeros_like(_at(P[q], i)) for q in stack_p
            )
            return (dc_next, d_same), ys

        if act_in != act_out:  # pragma: no cover - the wiring check keeps them alike
            raise AssertionError(f"scan run at block {k0}: its differentiated carry changed")
        dc0 = tuple(d_cn[j] for j in act_out)
        d_same0 = tuple(jnp.zeros_like(P[q]) for q in same_p)
        (dc, d_same), d_stacked = jax.lax.scan(
            body, (dc0, d_same0), jnp.arange(n), reverse=not forward_reverse
        )
        same_it, stack_it = iter(d_same), iter(d_stacked)
        d_P = tuple(next(same_it) if key[0] == "same" else next(stack_it) for key in p_keys)
        dc = dict(zip(act_in, dc, strict=True))
        d_c0 = tuple(dc.get(j) for j in range(len(entering)))
        return d_P, None, d_c0

    f.defvjp(f_fwd, f_bwd)
    return f

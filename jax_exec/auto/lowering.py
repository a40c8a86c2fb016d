"""The compiled path: a block-chain schedule as one differentiable function
(docs/auto.md, "Compiled path").

The schedule's tree (:func:`jax_exec.chain.tree.parse_tree`) is lowered like a chain's
(:mod:`jax_exec.lowering`), with blocks in place of layers:

- a **Record** (``F_all(k) .. B(k)``) runs block k as a ``jax.custom_vjp`` whose
  forward is the option's ``record`` (``jax.vjp`` of the block under
  ``jax.checkpoint(policy=save_only_these_names(S))``, or plain autodiff) and whose
  residuals are exactly the chain model's: the block's inputs, its outputs and the new
  residuals of the option; the backward rebuilds the vjp closure and applies it, so
  the gradients are JAX's own and only what the option did not save is recomputed;
- a **Segment** (``F_ck(i) F_n(i+1..j-1)``) runs blocks i..j-1 under
  ``jax.checkpoint(prevent_cse=True)`` with the subtree's structure inside (only its
  input is saved; its backward recomputes the segment);
- the **loss stage** is a Record with plain autodiff.

So the residuals JAX saves at the top level are the values the schedule holds right
before its ``Loss`` op, plus the loss stage's own residuals
(:func:`expected_residuals`). The model state after the call comes out of the first
forward of each block (recomputations in the backward do not produce outputs), so
BatchNorm statistics are updated once; random bits are recomputed from the same keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from jax_exec.auto.kernels import BlockFunctions
from jax_exec.auto.model import BlockModel, global_values
from jax_exec.auto.trace import Lit
from jax_exec.chain.tree import Empty, LossNode, Record, Segment, parse_tree
from schedir import Loss, Schedule
from schedir.blocks.problem import schedule_options, simulate_blocks


def recorded(fns: BlockFunctions) -> Callable:
    """``f(p, g, x) -> (outs, results)`` of a block whose autodiff keeps exactly its
    inputs, outputs and the option's new residuals (module docstring)."""
    lay = fns.layout
    needs_results = any(kind == "result" for kind, _ in fns.recipe.sources)

    @jax.custom_vjp
    def f(p: tuple, g: tuple, x: tuple) -> tuple:
        return fns.forward(p, g, x)

    def f_fwd(p: tuple, g: tuple, x: tuple):
        outs, results, new = fns.record(p, g, x)
        kept = results if needs_results else ()
        return (outs, results), (p, g, x, outs, kept, new)

    def f_bwd(residuals: tuple, cts: tuple):
        p, g, x, outs, kept, new = residuals
        d_outs = tuple(d for d, a in zip(cts[0], lay.act_out, strict=True) if a)
        n_act = sum(lay.act_in)
        d_p, d_act = fns.backward(p, g, x, outs, kept, new, d_outs, (None,) * n_act)
        it = iter(d_act)
        d_x = tuple(next(it) if a else None for a in lay.act_in)
        return d_p, None, d_x

    f.defvjp(f_fwd, f_bwd)
    return f


def lower(model: BlockModel, schedule: Schedule, *, loops: bool = True) -> Callable:
    """``fn(params, rest, args) -> (loss, (aux, new_rest))``, differentiable, following
    ``schedule`` (module docstring). ``jax.value_and_grad(fn, has_aux=True)`` gives the
    loss and the parameters' gradients. With ``loops`` the schedule's scan runs
    (:func:`scan_runs`) are lowered as loops (:func:`looped`), else unrolled."""
    simulate_blocks(model.problem, schedule)
    options = schedule_options(model.problem, schedule)
    L = model.length
    tree = parse_tree(schedule, L)
    cuts = model.blocks.cuts
    blocks = {k: recorded(model.functions(k, options[k])) for k in range(L)}
    loss_block = recorded(model.functions(L, 0))
    runs = scan_runs(model, schedule) if loops else {}
    run_fns = {k: looped(r, model.functions(k, options[k])) for k, r in runs.items()}

    def args_of(k: int, gv: dict, state: dict) -> tuple:
        lay = model.layouts[k]
        return (
            tuple(gv[v] for v in lay.params),
            tuple(gv[v] for v in lay.others),
            tuple(state[v] for v in lay.ins),
        )

    def run_loop(r: ScanRun, gv: dict, stacks: dict, state: dict, results: dict) -> dict:
        def operands(links: tuple) -> tuple:
            return tuple(
                gv[ln[1]] if ln[0] == "same" else stacks[stack_key(ln, r.length)] for ln in links
            )

        c0 = tuple(state[v] for v in cuts[r.start])
        cn, ys = run_fns[r.start](operands(r.params), operands(r.others), c0)
        for t in range(r.length):
            i = t if r.step > 0 else r.length - 1 - t
            results.update(zip(model.layouts[r.start + t].results, (y[i] for y in ys), strict=True))
        return dict(zip(cuts[r.start + r.length], cn, strict=True))

    def run(node: Any, gv: dict, stacks: dict, state: dict, results: dict) -> Any:
        """Runs ``node`` from the cut values ``state``; returns the state after its
        stages (or the loss), adding the blocks' results to ``results``."""
        if isinstance(node, Empty):
            return state
        if isinstance(node, LossNode):
            lay = model.layouts[L]
            (loss,), res = loss_block(*args_of(L, gv, state))
            results.update(zip(lay.results, res, strict=True))
            return loss
        if isinstance(node, Record) and node.index in runs:
            r = runs[node.index]
            if all(v in state for v in cuts[r.start]):
                nxt = run_loop(r, gv, stacks, state, results)
                for _ in range(r.length):
                    node = node.rest
                return run(node, gv, stacks, nxt, results)
        if isinstance(node, Record):
            k = node.index
            lay = model.layouts[k]
            outs, res = blocks[k](*args_of(k, gv, state))
            results.update(zip(lay.results, res, strict=True))
            nxt = {v: state[v] for v in cuts[k + 1] if v in state}
            nxt.update(zip(lay.outs, outs, strict=True))
            return run(node.rest, gv, stacks, nxt, results)
        if isinstance(node, Segment):

            def region(gv: dict, stacks: dict, state: dict) -> tuple[dict, dict]:
                inner: dict = {}
                out = run(node.inside, gv, stacks, state, inner)
                return out, inner

            region_state = {v: state[v] for v in cuts[node.start]}
            checkpointed = jax.checkpoint(region, prevent_cse=True)
            after_state, res = checkpointed(gv, stacks, region_state)
            results.update(res)
            return run(node.after, gv, stacks, after_state, results)
        raise TypeError(f"not a schedule tree node: {node!r}")  # pragma: no cover

    program = model.program
    p_def, r_def, _, aux_def = program.treedefs

    def fn(params: Any, rest: Any, args: tuple) -> tuple:
        gv = global_values(model, params, rest, args)
        results: dict = {}
        loss = run(tree, gv, run_stacks(model, runs, gv), {}, results)

        def value(ref: Any) -> Any:
            if isinstance(ref, Lit):
                return ref.value
            return gv[ref] if ref in gv else results[ref]

        aux = jax.tree_util.tree_unflatten(aux_def, [value(r) for r in program.aux])
        new_rest = jax.tree_util.tree_unflatten(r_def, [value(r) for r in program.new_rest])
        return loss, (aux, new_rest)

    return fn


def expected_residuals(model: BlockModel, schedule: Schedule, *, loops: bool = True) -> Counter:
    """What the compiled step (:func:`lower` with the same ``loops``) saves at the top
    level, as a multiset of ``(shape, dtype)``: the values of the buffers resident right
    before ``Loss`` (each value once; ``abar`` adds the option's new residuals) and the
    loss stage's (the loss and its new residuals), and the slices of scanned stacks'
    parameters that the blocks read. A scan run (:func:`looped`) holds the same
    arrays stacked: its inner carries as one ``(length - 1, ...)`` array per changing
    carry position, its blocks' new residuals and parameter slices as ``(length, ...)``
    arrays. Compare with :func:`saved_residuals`."""
    trace = simulate_blocks(model.problem, schedule, record_buffers=True)
    options = schedule_options(model.problem, schedule)
    at = next(i for i, op in enumerate(schedule.ops) if isinstance(op, Loss))
    names = trace.buffers[at - 1] if at > 0 else frozenset({"a[0]"})
    avals = model.program.avals
    values: set = set()
    found: Counter = Counter()

    def key(spec: Any, n: int | None = None) -> tuple:
        shape = tuple(int(d) for d in spec.shape)
        return ((n, *shape) if n is not None else shape, str(spec.dtype))

    runs = scan_runs(model, schedule) if loops else {}
    looped_blocks = {r.start + t for r in runs.values() if r.top for t in range(r.length)}

    for name in names:
        kind, c = name.rstrip("]").split("[")
        c = int(c)
        if kind == "d":
            continue
        values.update(model.blocks.cuts[c])
        if kind == "abar" and c - 1 not in looped_blocks:
            for spec in model.functions(c - 1, options[c - 1]).recipe.new:
                found[key(spec)] += 1
    for r in runs.values():
        if not r.top:
            continue
        cuts = model.blocks.cuts
        for j in r.changing:
            inner = [cuts[r.start + t][j] for t in range(1, r.length)]
            values.difference_update(inner)
            found[key(avals[inner[0]], r.length - 1)] += 1
        for spec in model.functions(r.start, options[r.start]).recipe.new:
            found[key(spec, r.length)] += 1
    for v in values:
        found[key(avals[v])] += 1
    lay = model.layouts[model.length]  # the loss stage keeps its inputs, output, residuals
    found.update(key(avals[v]) for v in (*lay.ins, *lay.outs) if v not in values)
    for spec in model.functions(model.length, 0).recipe.new:
        found[key(spec)] += 1
    # A scanned stack's per-iteration parameter slices are computed once per step from
    # the stacked parameters (global_values) and held for the whole step, by both
    # executors: JAX saves each slice a block reads; like parameters, not activations.
    # A run reads them as stacked slice ranges (run_stacks), one per distinct range.
    read, stacks = set(), {}
    for k, lay in enumerate(model.layouts):
        r = next((r for r in runs.values() if r.start <= k < r.start + r.length), None)
        links = (*r.params, *r.others) if r is not None else ()
        for j, v in enumerate((*lay.params, *lay.others)):
            if r is not None and links[j][0] == "stack":
                stacks[stack_key(links[j], r.length)] = (v, r.length)
            else:
                read.add(v)
    found.update(key(avals[v]) for v in model.program.derived if v in read)
    found.update(key(avals[v], n) for v, n in stacks.values())
    return found


# ----------------------------------------------------------------------- scan runs


@dataclass(frozen=True)
class ScanRun:
    """Blocks ``start .. start + length - 1``: consecutive Records of iterations of one
    unrolled scan, identical blocks under one option, lowered as one loop.

    Attributes:
        start, length: the first block and the number of blocks (>= 2).
        carry: per carry position (``cuts[start]``'s order), how block k+1's cut value
            at that position comes out of block k's cut: ``("out", m)`` its m-th output
            or ``("keep",)`` the same value (passing through).
        ins: the positions of the block's ``x`` in the carry.
        active: per carry position, whether the value is differentiated.
        params, others: per position of the block's ``p`` / ``g``: ``("same", vid)``
            (one global for every block) or ``("stack", src, lo)``: the slices
            ``src[lo .. lo + length - 1]`` of a stacked global, one per block.
        step: +1 if block ``start + t`` reads slice ``lo + t``, -1 if ``lo + length
            - 1 - t`` (a reverse scan).
        top: whether the run is on the tree's top level (its residuals are the step's).
    """

    start: int
    length: int
    carry: tuple
    ins: tuple[int, ...]
    active: tuple[bool, ...]
    params: tuple
    others: tuple
    step: int
    top: bool

    @property
    def changing(self) -> tuple[int, ...]:
        """Carry positions whose value changes from block to block."""
        return tuple(j for j, c in enumerate(self.carry) if c[0] == "out")


def _scan_of(model: BlockModel, k: int) -> int | None:
    start = model.blocks.blocks[k].start
    for s, info in enumerate(model.program.scans):
        if info.starts[0] <= start < info.starts[-1]:
            return s
    return None


def _pair(model: BlockModel, options: tuple, k: int, j: int) -> tuple | None:
    """How block j repeats block k (same key, option, carry and argument pattern):
    ``(carry, ins, active, (p_links, g_links))`` where a link is ``("same", vid)`` or
    ``("stack", src, i_k, i_j)``; None if it does not."""
    blocks, cuts, avals = model.blocks.blocks, model.blocks.cuts, model.program.avals
    if blocks[k].key != blocks[j].key or options[k] != options[j]:
        return None
    if _scan_of(model, k) is None or _scan_of(model, k) != _scan_of(model, j):
        return None
    a, b = model.layouts[k], model.layouts[j]
    fns = model.functions(k, options[k])
    if fns is not model.functions(j, options[j]) or any(
        s == "result" for s, _ in fns.recipe.sources
    ):
        return None

    def pattern(i: int) -> tuple | None:
        lay, here, nxt = model.layouts[i], cuts[i], cuts[i + 1]
        if len(here) != len(nxt) or any(
            (avals[u].shape, avals[u].dtype) != (avals[v].shape, avals[v].dtype)
            for u, v in zip(here, nxt, strict=True)
        ):
            return None
        carry = []
        for pos, v in enumerate(nxt):
            if v in lay.outs:
                carry.append(("out", lay.outs.index(v)))
            elif here[pos] == v:
                carry.append(("keep",))
            else:
                return None
        if len({c for c in carry if c[0] == "out"}) != len(lay.outs):
            return None  # an output that the next cut does not carry
        if any(v not in here for v in lay.ins):
            return None
        ins = tuple(here.index(v) for v in lay.ins)
        active = tuple(v in model.analysis.active for v in here)
        return tuple(carry), ins, active

    pa, pb = pattern(k), pattern(j)
    if (
        pa is None
        or pa != pb
        or any(
            (avals[u].shape, avals[u].dtype) != (avals[v].shape, avals[v].dtype)
            for u, v in zip(cuts[k], cuts[j], strict=True)
        )
    ):
        return None
    links = []
    for us, vs in ((a.params, b.params), (a.others, b.others)):
        row = []
        for u, v in zip(us, vs, strict=True):
            du, dv = model.program.derived.get(u), model.program.derived.get(v)
            if u == v and du is None:
                row.append(("same", u))
            elif du is not None and dv is not None and du[0] == dv[0]:
                row.append(("stack", du[0], du[1], dv[1]))
            else:
                return None
        links.append(tuple(row))
    return (*pa, tuple(links))


def _grow(model: BlockModel, options: tuple, node: Record, top: bool) -> ScanRun | None:
    """The longest scan run starting at Record ``node`` (None if shorter than 2)."""
    k0, n, cur, first, step = node.index, 1, node, None, 0
    while isinstance(cur.rest, Record) and cur.rest.index == k0 + n < model.length:
        pair = _pair(model, options, k0, k0 + n)
        if pair is None:
            break
        diffs = {ln[3] - ln[2] for row in pair[3] for ln in row if ln[0] == "stack"}
        if len(diffs) != 1:  # one progression of slices over the stacked globals
            break
        d = diffs.pop()
        if first is None:
            if d not in (1, -1):
                break
            first, step = pair, d
        elif d != step * n:
            break
        n, cur = n + 1, cur.rest
    if first is None:
        return None
    carry, ins, active, links = first

    def stacked(row: tuple) -> tuple:
        lo = (lambda i: i) if step > 0 else (lambda i: i - (n - 1))
        return tuple(ln if ln[0] == "same" else ("stack", ln[1], lo(ln[2])) for ln in row)

    return ScanRun(k0, n, carry, ins, active, stacked(links[0]), stacked(links[1]), step, top)


def scan_runs(model: BlockModel, schedule: Schedule) -> dict[int, ScanRun]:
    """The scan runs of ``schedule``'s tree, by first block: maximal chains of Records
    ``Record(k) -> Record(k+1) -> ...`` (at any level: the top, inside Segments) whose
    blocks repeat one another (:class:`ScanRun`)."""
    options = schedule_options(model.problem, schedule)
    found: dict[int, ScanRun] = {}

    def walk(node: Any, top: bool) -> None:
        while isinstance(node, Record | Segment):
            if isinstance(node, Segment):
                walk(node.inside, False)
                node = node.after
                continue
            found_run = _grow(model, options, node, top)
            if found_run is None:
                node = node.rest
                continue
            found[node.index] = found_run
            for _ in range(found_run.length):
                node = node.rest

    walk(parse_tree(schedule, model.length), True)
    return found


def _at(stack: Any, i: Any) -> Any:
    return jax.lax.dynamic_index_in_dim(stack, i, 0, keepdims=False)


def looped(run: ScanRun, fns: BlockFunctions) -> Callable:
    """``f(P, G, c0) -> (cn, ys)``: the run's blocks as one ``lax.scan`` over the slice
    index (``reverse`` for a reverse scan), from the carry ``c0`` (the cut values
    entering block ``start``) to ``cn``; ``ys`` are the blocks' results stacked in
    slice order. ``P``/``G`` hold a stacked slice range per ``("stack", ...)``
    argument and the global itself per ``("same", ...)`` one.

    A ``jax.custom_vjp`` whose residuals are the unrolled Records' (so memory is the
    plan's): ``c0`` and ``cn`` (the neighbours' values, held once), the carries
    between the blocks stacked ``(length - 1, ...)`` per changing position, the
    option's new residuals stacked ``(length, ...)``, and ``P``/``G``; the backward is
    a reverse loop applying the block's backward (``fns.backward``), the cotangents
    of values passing through summed in its carry.
    """
    n, lay, changing = run.length, fns.layout, run.changing
    out_at = {c[1]: j for j, c in enumerate(run.carry) if c[0] == "out"}
    n_act = sum(lay.act_in)
    forward_reverse = run.step < 0

    def time_of(i: Any) -> Any:  # the block (0 .. n-1 in execution order) reading slice i
        return i if run.step > 0 else n - 1 - i

    def pick(stacks: tuple, links: tuple, i: Any) -> tuple:
        return tuple(
            _at(a, i) if ln[0] == "stack" else a for a, ln in zip(stacks, links, strict=True)
        )

    def args(P: tuple, G: tuple, c: tuple, i: Any) -> tuple:
        return pick(P, run.params, i), pick(G, run.others, i), tuple(c[j] for j in run.ins)

    def advance(c: tuple, outs: tuple) -> tuple:
        return tuple(
            outs[ln[1]] if ln[0] == "out" else v for v, ln in zip(c, run.carry, strict=True)
        )

    @jax.custom_vjp
    def f(P: tuple, G: tuple, c0: tuple) -> tuple:
        def body(c: tuple, i: Any) -> tuple:
            outs, results = fns.forward(*args(P, G, c, i))
            return advance(c, outs), results

        return jax.lax.scan(body, c0, jnp.arange(n), reverse=forward_reverse)

    def f_fwd(P: tuple, G: tuple, c0: tuple):
        mids0 = tuple(jnp.broadcast_to(c0[j], (n - 1, *c0[j].shape)) for j in changing)

        def body(carry: tuple, i: Any) -> tuple:
            c, mids = carry
            # the carry entering block t goes to slot t - 1 (block 0's is overwritten)
            w = jnp.maximum(time_of(i) - 1, 0)
            mids = tuple(
                jax.lax.dynamic_update_index_in_dim(m, c[j], w, 0)
                for m, j in zip(mids, changing, strict=True)
            )
            outs, results, new = fns.record(*args(P, G, c, i))
            return (advance(c, outs), mids), (results, new)

        (cn, mids), (ys, new) = jax.lax.scan(
            body, (c0, mids0), jnp.arange(n), reverse=forward_reverse
        )
        return (cn, ys), (P, G, c0, cn, mids, new)

    def f_bwd(residuals: tuple, cts: tuple):
        P, G, c0, cn, mids, new = residuals
        d_cn = cts[0]
        act = [j for j, a in enumerate(run.active) if a]

        def body(carry: tuple, i: Any) -> tuple:
            dc, d_same = carry
            dc = dict(zip(act, dc, strict=True))
            t = time_of(i)
            c_in, c_out = list(c0), list(c0)
            for m, j in zip(mids, changing, strict=True):
                c_in[j] = jnp.where(t == 0, c0[j], _at(m, jnp.maximum(t - 1, 0)))
                c_out[j] = jnp.where(t == n - 1, cn[j], _at(m, jnp.minimum(t, n - 2)))
            p, g, x = args(P, G, c_in, i)
            outs = tuple(c_out[out_at[m]] for m in range(len(lay.outs)))
            d_outs = tuple(dc[out_at[m]] for m, a in enumerate(lay.act_out) if a)
            new_i = tuple(_at(a, i) for a in new)
            d_p, d_x = fns.backward(p, g, x, outs, (), new_i, d_outs, (None,) * n_act)
            before = {j: dc[j] if run.carry[j][0] == "keep" else jnp.zeros_like(dc[j]) for j in act}
            it = iter(d_x)
            for pos, a in zip(run.ins, lay.act_in, strict=True):
                if a:
                    before[pos] = before[pos] + next(it)
            same = [d for d, ln in zip(d_p, run.params, strict=True) if ln[0] == "same"]
            d_same = tuple(s + d for s, d in zip(d_same, same, strict=True))
            stacked = tuple(d for d, ln in zip(d_p, run.params, strict=True) if ln[0] == "stack")
            return (tuple(before[j] for j in act), d_same), stacked

        dc0 = tuple(d_cn[j] for j in act)
        d_same0 = tuple(
            jnp.zeros_like(a) for a, ln in zip(P, run.params, strict=True) if ln[0] == "same"
        )
        (dc, d_same), d_stacked = jax.lax.scan(
            body, (dc0, d_same0), jnp.arange(n), reverse=not forward_reverse
        )
        same_it, stack_it = iter(d_same), iter(d_stacked)
        d_P = tuple(next(same_it) if ln[0] == "same" else next(stack_it) for ln in run.params)
        dc = dict(zip(act, dc, strict=True))
        d_c0 = tuple(dc.get(j) for j in range(len(run.carry)))
        return d_P, None, d_c0

    f.defvjp(f_fwd, f_bwd)
    return f


def stack_key(link: tuple, n: int) -> str:
    """Name of the stacked slice range ``src[lo .. lo + n - 1]`` of a run's argument."""
    return f"{link[1]}:{link[2]}:{n}"


def run_stacks(model: BlockModel, runs: dict, gv: dict) -> dict:
    """The stacked slice ranges the runs read (:func:`stack_key` -> array)."""
    stacks = {}
    for r in runs.values():
        for ln in (*r.params, *r.others):
            if ln[0] == "stack":
                stacks[stack_key(ln, r.length)] = jax.lax.slice_in_dim(
                    gv[ln[1]], ln[2], ln[2] + r.length, axis=0
                )
    return stacks


def saved_residuals(fn: Callable, *args: Any) -> Counter:
    """What JAX saves at the top level of ``jax.vjp(fn, *args)``, as a multiset of
    ``(shape, dtype)``; arguments and literals left out (compare with
    :func:`expected_residuals`).

    The one place this package calls a private JAX function:
    ``jax._src.ad_checkpoint.saved_residuals`` is the function behind the public
    ``jax.ad_checkpoint.print_saved_residuals``, which only prints. A test
    (tests/jax_exec/test_auto_plan.py) fails if it moves or changes its output.
    """
    from jax_exec.residuals import saved_residuals as _saved

    found: Counter = Counter()
    for aval, source in _saved(fn, *args):
        if source.startswith("from the argument") or source == "from a literal":
            continue
        found[(tuple(int(d) for d in aval.shape), str(aval.dtype))] += 1
    return found

"""The compiled path: a block-chain schedule as one differentiable function
(docs/auto.md, "Compiled path").

The schedule's tree (:func:`jax_exec.execute.tree.parse_tree`) is lowered like a chain's
(:mod:`jax_exec.lowering`), with blocks in place of layers:

- a **Record** (``F_all(k) .. B(k)``) runs block k as a ``jax.custom_vjp`` whose
  forward is the option's ``record`` (``jax.vjp`` of the block under
  ``jax.checkpoint(policy=save_only_these_names(S))``, or plain autodiff) and whose
  residuals are exactly the chain model's: the block's inputs, its outputs and the new
  residuals of the option; the backward rebuilds the vjp closure and applies it, so
  the gradients are JAX's own and only what the option did not save is recomputed
  (from its residuals behind an optimization barrier, none on CPU:
  :mod:`jax_exec.execute.barriers`);
- a **Segment** (``F_ck(i) F_n(i+1..j-1)``) runs blocks i..j-1 as a ``custom_vjp``
  (:mod:`jax_exec.execute.segments`) that saves only its input and whose backward
  recomputes the segment with the subtree's structure inside, behind an optimization
  barrier (none on CPU, whose XLA does not schedule for memory); its first forward
  runs repeated stretches (:func:`~jax_exec.execute.loops.forward_runs`) as loops. A
  Segment with a scan run among its Records but no such stretch, or whose input is
  offloaded, runs under ``jax.checkpoint(prevent_cse=True)`` (an offload policy);
- the **loss stage** is a Record with plain autodiff;
- a **scan run** (consecutive Records of an unrolled scan's repeated blocks,
  :mod:`jax_exec.execute.loops`) runs as one ``lax.scan`` whose residuals are the
  Records', stacked (``lower(..., loops=False)`` unrolls it); the values it emits (the
  scan's ``ys``) leave it as stacked arrays, which the blocks after it read whole
  (``recorded(..., unpack=...)``).

So the residuals JAX saves at the top level are the values the schedule holds right
before its ``Loss`` op, plus the loss stage's own residuals
(:func:`expected_residuals`). The model state after the call comes out of the first
forward of each block (recomputations in the backward do not produce outputs), so
BatchNorm statistics are updated once; random bits are recomputed from the same keys.
"""

from __future__ import annotations

from collections import Counter
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
from jax_exec.execute.loops import (
    ScanRun,
    boundary,
    carry_cut,
    emits,
    emitted_stacks,
    forward_runs,
    held,
    inner_values,
    members,
    scan_runs,
    stack_key,
)
from jax_exec.execute.rounding import unrounded
from jax_exec.execute.segments import blocks_globals, globals_read, segment
from jax_exec.execute.tree import (
    Empty,
    LossNode,
    Record,
    Segment,
    node_ops,
    parse_tree,
    split_copies,
)
from jax_exec.program.kernels import BlockFunctions, named
from jax_exec.program.model import BlockModel, global_values
from schedir import Loss, Schedule
from schedir.blocks.simulate import schedule_options, simulate_blocks


def _to(space: Any, tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda v: jax.device_put(v, space), tree)


def recorded(
    fns: BlockFunctions, offload_in: bool = False, offload_out: bool = False,
    on_host: frozenset[int] = frozenset(), unpack: tuple | None = None,
) -> Callable:  # fmt: skip
    """``f(p, g, x) -> (outs, results)`` of a block whose autodiff keeps exactly its
    inputs, outputs and the option's new residuals (module docstring). With
    ``offload_in`` the inputs it keeps, with ``offload_out`` its outputs and new
    residuals (the next node's input buffer), are put in host memory in its forward
    rule and brought back in its backward rule (a ``custom_vjp``'s residuals are out of
    a checkpoint policy's reach); so are the new residuals of indices ``on_host`` (a
    host-memory variant's: XLA schedules their copy back within the backward).

    With ``unpack`` (per input of the block, ``(q, None)``: ``x[q]``, or ``(q, i)``:
    row i of the stacked array ``x[q]``) ``x`` holds loops' stacked outputs
    (:func:`~jax_exec.execute.loops.emitted_stacks`) in place of some inputs: the block keeps
    the stacks and slices them inside, so they are saved once, not row by row."""
    lay = fns.layout
    needs_results = any(kind == "result" for kind, _ in fns.recipe.sources)
    host, device = jax.memory.Space.Host, jax.memory.Space.Device

    def inputs(x: tuple) -> tuple:
        if unpack is None:
            return x
        return tuple(x[q] if i is None else x[q][i] for q, i in unpack)

    def packed(x: tuple, d_x: tuple) -> tuple:  # the cotangents of inputs(x), of x
        if unpack is None:
            return d_x
        rows: list[dict] = [{} for _ in x]
        for (q, i), d in zip(unpack, d_x, strict=True):
            if d is not None:
                rows[q][i] = d

        def cotangent(a: Any, found: dict) -> Any:
            if not found or None in found:
                return found.get(None)
            return jnp.stack([found.get(i, jnp.zeros_like(a[0])) for i in range(a.shape[0])])

        return tuple(map(cotangent, x, rows))

    @jax.custom_vjp
    def f(p: tuple, g: tuple, x: tuple) -> tuple:
        return fns.forward(p, g, inputs(x))

    def f_fwd(p: tuple, g: tuple, x: tuple):
        outs, results, new = unrounded(fns.record)(p, g, inputs(x))
        new = tuple(_to(host, r) if i in on_host else r for i, r in enumerate(new))
        kept = results if needs_results else ()
        saved_x = _to(host, x) if offload_in else x
        saved = _to(host, (outs, new)) if offload_out else (outs, new)
        return (outs, results), (p, g, saved_x, *saved[:1], kept, saved[1])

    def f_bwd(residuals: tuple, cts: tuple):
        p, g, x, outs, kept, new = residuals
        if offload_in:
            x = _to(device, x)
        if offload_out:
            outs, new = _to(device, (outs, new))
        new = tuple(_to(device, r) if i in on_host else r for i, r in enumerate(new))
        if fns.recomputes:  # what the option did not save is recomputed from these
            p, g, x, outs, kept, new = behind_barrier((p, g, x, outs, kept, new))
        d_outs = tuple(d for d, a in zip(cts[0], lay.act_out, strict=True) if a)
        n_act = sum(lay.act_in)
        d_p, d_act = fns.backward(p, g, inputs(x), outs, kept, new, d_outs, (None,) * n_act)
        it = iter(d_act)
        d_x = tuple(next(it) if a else None for a in lay.act_in)
        return d_p, None, packed(x, d_x)

    f.defvjp(f_fwd, f_bwd)
    return f


def _offload_policy(name: str):
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=[name],
        offload_src="device",
        offload_dst="pinned_host",
    )


def lower(model: BlockModel, schedule: Schedule, *, loops: bool = True) -> Callable:
    """``fn(params, rest, args) -> (loss, (aux, new_state))``, differentiable, following
    ``schedule`` (module docstring; ``new_state``: :meth:`Program.outputs
    <jax_exec.program.flat.Program.outputs>`). ``jax.value_and_grad(fn, has_aux=True)`` gives the
    loss and the parameters' gradients. With ``loops`` the schedule's scan runs
    (:func:`scan_runs`) are lowered as loops (:func:`looped`), else unrolled."""
    simulate_blocks(model.problem, schedule)
    options = schedule_options(model.problem, schedule)
    L = model.length
    chain_ops, offloaded = split_copies(schedule.ops)
    tree = parse_tree(chain_ops, L)
    cuts = model.blocks.cuts
    loops = loops and not offloaded  # a scan run's residuals stay on the device
    runs = scan_runs(model, schedule) if loops else {}
    run_fns = {k: looped(model, r, options) for k, r in runs.items()}
    run_blocks = frozenset(k for r in runs.values() for k in r.blocks)
    stacked = emitted_stacks(model, runs)  # a value a loop emits is read from its stack only
    run_stacks_of = {
        k: tuple(stacked[model.layouts[b].outs[o]][0] for b, o in emits(model, r))
        for k, r in runs.items()
    }

    def unpack(k: int) -> tuple | None:
        ins = model.layouts[k].ins
        if not stacked.keys() & set(ins):
            return None
        keys = held(ins, stacked)
        return tuple(
            (keys.index(stacked[v][0].id), stacked[v][1]) if v in stacked else (keys.index(v), None)
            for v in ins
        )

    loss_block = recorded(model.functions(L, 0), unpack=unpack(L))

    def block(k: int, offload_in: bool, offload_out: bool) -> Callable:
        host = frozenset(model.host_residuals(k, options[k]))
        fns = model.functions(k, options[k])
        return recorded(fns, offload_in, offload_out, host, unpack(k))

    def args_of(k: int, gv: dict, state: dict) -> tuple:
        lay = model.layouts[k]
        return (
            tuple(gv[v] for v in lay.params),
            tuple(gv[v] for v in lay.others),
            tuple(state[v] for v in held(lay.ins, stacked)),
        )

    def run_loop(r: ScanRun, gv: dict, stacks: dict, state: dict, results: dict) -> dict:
        entering, _, _ = boundary(model, r)
        c0 = tuple(state[v] for v in entering)
        cn, ys, em = run_fns[r.start](*loop_operands(r, gv, stacks), c0)
        results.update(loop_results(model, r, ys))
        made = dict(zip((st.id for st in run_stacks_of[r.start]), em, strict=True))
        return after_loop(model, r, state, cn, made, held(cuts[r.blocks.stop], stacked), stacked)

    def run(node: Any, gv: dict, stacks: dict, state: dict, results: dict, pos: int) -> Any:
        """Runs ``node`` (at chain op ``pos``: an offloaded input where ``pos`` is in
        ``offloaded``) from the cut values ``state``; returns the state after its
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
            missing = [v for v in boundary(model, r)[0] if v not in state]
            if missing:  # expected_residuals assumes the loop: never unroll silently
                raise RuntimeError(
                    f"scan run at block {r.start}: its entering cut values {missing} are "
                    f"not computed; lower(..., loops=False) unrolls it"
                )
            nxt = run_loop(r, gv, stacks, state, results)
            for _ in r.blocks:
                node, pos = node.rest, pos + 1
            return run(node, gv, stacks, nxt, results, pos)
        if isinstance(node, Record):
            k = node.index
            lay = model.layouts[k]
            out_off = pos + 1 in offloaded and isinstance(node.rest, Record | Segment)
            outs, res = block(k, pos in offloaded, out_off)(*args_of(k, gv, state))
            results.update(zip(lay.results, res, strict=True))
            nxt = {v: state[v] for v in held(cuts[k + 1], stacked) if v in state}
            nxt.update(zip(lay.outs, outs, strict=True))
            return run(node.rest, gv, stacks, nxt, results, pos + 1)
        if isinstance(node, Segment):
            after_pos = pos + (node.stop - node.start)
            inside_pos = after_pos + node_ops(node.after)
            name = f"jax_exec:in{pos}" if pos in offloaded else None

            def region(gv: dict, stacks: dict, state: dict) -> tuple[dict, dict]:
                if name is not None:  # the input is saved in pinned_host memory, nothing else
                    state = {v: named(a, name) for v, a in state.items()}
                inner: dict = {}
                out = run(node.inside, gv, stacks, state, inner, inside_pos)
                return out, inner

            region_state = {v: state[v] for v in held(cuts[node.start], stacked)}
            looping = loops and name is None  # (an offloaded input: a checkpoint policy's)
            first = forward_runs(model, node.start, node.stop) if looping else {}
            inner = [r for r in runs.values() if node.start <= r.start < node.stop]
            if first or (name is None and not inner):  # a custom_vjp (segments.py)
                # (without loops inside, it saves what jax.checkpoint saved: the globals
                # its blocks read; its barrier is the backward's only, and none on CPU)
                reads = (
                    globals_read(model, node.start, node.stop, run_blocks) if first
                    else blocks_globals(model, node.start, node.stop)
                )  # fmt: skip
                inner_stacks = {
                    key[1] for r in inner for keys in r.keys() for key in keys if key[0] == "stack"
                }
                checkpointed = segment(
                    model, options, node.start, node.stop, first, stacked,
                    held(cuts[node.stop], stacked), region,
                )  # fmt: skip
                after_state, res = checkpointed(
                    {v: gv[v] for v in reads},
                    {key: stacks[key] for key in inner_stacks},
                    region_state,
                )
                results.update(res)
                return run(node.after, gv, stacks, after_state, results, after_pos)
            policy = None if name is None else _offload_policy(name)
            checkpointed = jax.checkpoint(region, policy=policy, prevent_cse=True)
            after_state, res = checkpointed(gv, stacks, region_state)
            results.update(res)
            return run(node.after, gv, stacks, after_state, results, after_pos)
        raise TypeError(f"not a schedule tree node: {node!r}")  # pragma: no cover

    program = model.program

    def fn(params: Any, rest: Any, args: tuple) -> tuple:
        gv = global_values(model, params, rest, args)
        results: dict = {}
        loss = run(tree, gv, run_stacks(runs, gv), {}, results, 0)
        return loss, program.outputs(loss, gv, results)

    return fn


def expected_residuals(model: BlockModel, schedule: Schedule, *, loops: bool = True) -> Counter:
    """What the compiled step (:func:`lower` with the same ``loops``) saves at the top
    level, as a multiset of ``(shape, dtype)``: the values of the buffers resident right
    before ``Loss`` (each value once; ``abar`` adds the option's new residuals) and the
    loss stage's (the loss and its new residuals), and the slices of scanned stacks'
    parameters that the blocks read. A scan run (:func:`looped`) holds the same
    arrays stacked: its inner carries as one ``(length - 1, ...)`` array per changing
    carry position, its blocks' new residuals and parameter slices as ``(length, ...)``
    arrays; the values it emits (its ``ys``) as one ``(length, ...)`` array each,
    wherever they are held after it. Compare with :func:`saved_residuals`."""
    trace = simulate_blocks(model.problem, schedule, record_buffers=True)
    options = schedule_options(model.problem, schedule)
    loops = loops and not split_copies(schedule.ops)[1]  # as lower's
    at = next(i for i, op in enumerate(schedule.ops) if isinstance(op, Loss))
    names = trace.buffers[at - 1] if at > 0 else frozenset({"a[0]"})
    avals = model.program.avals
    values: set = set()
    found: Counter = Counter()

    def key(spec: Any, n: int | None = None) -> tuple:
        shape = tuple(int(d) for d in spec.shape)
        return ((n, *shape) if n is not None else shape, str(spec.dtype))

    runs = scan_runs(model, schedule) if loops else {}
    looped_blocks = {k for r in runs.values() if r.top for k in r.blocks}
    stacked = emitted_stacks(model, runs)
    stack_avals = {st.id: st.aval for st, _ in stacked.values()}

    for name in names:
        kind, c = name.rstrip("]").split("[")
        c = int(c)
        if kind == "d":
            continue
        values.update(held(model.blocks.cuts[c], stacked))
        if kind == "abar" and c - 1 not in looped_blocks:
            for spec in model.functions(c - 1, options[c - 1]).recipe.new:
                found[key(spec)] += 1
    for r in runs.values():
        if not r.top:
            continue
        _, leaving, changing = boundary(model, r)
        values.update(stacked[v][0].id for vids in members(model, r) for v in vids[:1])
        for j, changes in enumerate(changing):
            if changes and leaving[j] not in stacked:  # an emitted one: in its stack
                inner = [
                    carry_cut(model, r.start + t * r.period, r.scan)[j] for t in range(1, r.length)
                ]
                values.difference_update(inner)
                found[key(avals[inner[0]], r.length - 1)] += 1
        for k, o in inner_values(model, r):
            made = [model.layouts[k + t * r.period].outs[o] for t in range(r.length)]
            values.difference_update(made)
            found[key(avals[made[0]], r.length)] += 1
        for k in range(r.start, r.start + r.period):
            for spec in model.functions(k, options[k]).recipe.new:
                found[key(spec, r.length)] += 1
    for v in values:
        found[key(stack_avals[v]) if v in stack_avals else key(avals[v])] += 1
    lay = model.layouts[model.length]  # the loss stage keeps its inputs, output, residuals
    for v in (*held(lay.ins, stacked), *lay.outs):
        if v not in values:
            found[key(stack_avals[v]) if v in stack_avals else key(avals[v])] += 1
    for spec in model.functions(model.length, 0).recipe.new:
        found[key(spec)] += 1
    # A scanned stack's per-iteration parameter slices are computed once per step from
    # the stacked parameters (global_values) and held for the whole step, by both
    # executors: JAX saves each slice a block reads; like parameters, not activations.
    # A run reads them as stacked slice ranges (run_stacks), one per distinct range.
    read, stacks = set(), {}
    for k, lay in enumerate(model.layouts):
        r = next((r for r in runs.values() if k in r.blocks), None)
        t = r.template(k) - r.start if r is not None else 0
        links = (*r.params[t], *r.others[t]) if r is not None else ()
        for j, v in enumerate((*lay.params, *lay.others)):
            if r is not None and links[j][0] == "stack":
                stacks[stack_key(links[j], r.length)] = (v, r.length)
            else:
                read.add(v)
    found.update(key(avals[v]) for v in model.program.derived if v in read)
    found.update(key(avals[v], n) for v, n in stacks.values())
    # a weakly typed input is made strongly typed once per step (global_values): that
    # value, not the argument, is what the blocks reading it keep
    found.update(key(avals[v]) for v in model.program.weak if v in read)
    if loops:
        found.update(key(avals[v]) for v in segment_stacks(model, schedule))
    return found


def segment_stacks(model: BlockModel, schedule: Schedule) -> frozenset[int]:
    """The stacked globals that the top-level Segments whose first forward loops
    (:mod:`~jax_exec.execute.segments`) save beside the slices their blocks read
    (:func:`~jax_exec.execute.segments.globals_read`), where they are residuals: held as
    constants or computed by the step (a stacked parameter or argument is not). The
    unrolled step saves the slices alone: the loops save these bytes more."""
    chain_ops, offloaded = split_copies(schedule.ops)
    if offloaded:  # lowered without loops
        return frozenset()
    program = model.program
    inputs = {*program.param_ids, *program.rest_ids, *program.arg_ids}
    sources = {src for src, _ in program.derived.values()} - inputs
    looped = frozenset(k for r in scan_runs(model, schedule).values() for k in r.blocks)
    found: set = set()
    for node in _top_nodes(parse_tree(chain_ops, model.length)):
        if isinstance(node, Segment) and forward_runs(model, node.start, node.stop):
            found.update(sources.intersection(globals_read(model, node.start, node.stop, looped)))
    return frozenset(found)


def _top_nodes(node: Any):
    """The nodes of the tree's top level, in order (a Segment's ``inside`` left out)."""
    while isinstance(node, Record | Segment):
        yield node
        node = node.rest if isinstance(node, Record) else node.after


def saved_residuals(fn: Callable, *args: Any) -> Counter:
    """What JAX saves at the top level of ``jax.vjp(fn, *args)``, as a multiset of
    ``(shape, dtype)``; arguments and literals left out (compare with
    :func:`expected_residuals`).

    The one place this package calls a private JAX function:
    ``jax._src.ad_checkpoint.saved_residuals`` is the function behind the public
    ``jax.ad_checkpoint.print_saved_residuals``, which only prints. A test
    (tests/jax_exec/test_auto_plan.py) fails if it moves or changes its output.
    """
    from jax_exec.execute.residuals import saved_residuals as _saved

    found: Counter = Counter()
    for aval, source in _saved(fn, *args):
        if source.startswith("from the argument") or source == "from a literal":
            continue
        found[(tuple(int(d) for d in aval.shape), str(aval.dtype))] += 1
    return found

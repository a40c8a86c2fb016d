"""The compiled path keeps a scanned stack as a loop (jax_exec.execute.lowering.scan_runs):
consecutive Records of one unrolled scan's identical blocks become one ``lax.scan``
with the unrolled residuals stacked. Against plain ``nnx.value_and_grad`` (loss,
gradients, model state) and JAX's account of the saved residuals, at store-all and at
tighter budgets where runs remain; the unrolled lowering (``loops=False``) alongside."""

from __future__ import annotations

import dataclasses
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zoo
from auto_models import make_scan, mse
from figure_checks import load_script
from flax import nnx
from test_auto_plan import assert_close, reference

from jax_exec import auto
from jax_exec.execute.loops import boundary, emits, forward_runs, scan_runs
from jax_exec.execute.lowering import expected_residuals, lower, saved_residuals, segment_stacks
from jax_exec.execute.tree import Record, Segment, parse_tree
from schedir.blocks.simulate import schedule_options


def has_scan(fn, *args) -> bool:
    jaxpr = jax.make_jaxpr(jax.value_and_grad(fn, has_aux=True))(*args)

    def walk(j) -> bool:
        for eqn in j.eqns:
            if eqn.primitive.name == "scan":
                return True
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                if walk(sub):
                    return True
        return False

    return walk(jaxpr.jaxpr)


class NormLayer(nnx.Module):
    def __init__(self, width: int, *, rngs: nnx.Rngs):
        self.lin = nnx.Linear(width, width, rngs=rngs)
        self.ln = nnx.LayerNorm(width, rngs=rngs)


class Context(nnx.Module):
    """A reverse ``lax.scan`` over stacked weights, then an ``nnx.scan`` over layers
    reading a value computed before it (``ctx``: passes through every block)."""

    def __init__(self, width: int, depth: int, *, rngs: nnx.Rngs):
        self.inp = nnx.Linear(6, width, rngs=rngs)
        self.stack = nnx.Param(0.3 * jax.random.normal(rngs.params(), (depth, width, width)))

        @nnx.split_rngs(splits=depth)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs: nnx.Rngs):
            return NormLayer(width, rngs=rngs)

        self.layers = create(rngs)
        self.out = nnx.Linear(width, 3, rngs=rngs)

    def __call__(self, x):
        h = self.inp(x)
        ctx = jnp.tanh(h)

        def mix(h, w):
            return jnp.tanh(h @ w) + h, None

        h, _ = jax.lax.scan(mix, h, self.stack[...], reverse=True)

        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def body(layer, h):
            return h + jax.nn.relu(layer.ln(layer.lin(h))) * ctx

        return self.out(body(self.layers, h))


def make_context(width=8, depth=3, batch=4):
    x = jax.random.normal(jax.random.key(1), (batch, 6))
    y = jax.random.normal(jax.random.key(2), (batch, 3))
    return (lambda: Context(width, depth, rngs=nnx.Rngs(0))), mse, (x, y)


def budgets(p, fractions):
    least = p.least_budget()
    return [least + int(f * (p.store_all_peak - least)) for f in fractions]


def check_compiled(q, factory, args, ref):
    """The plan's compiled step (loops on) against the oracles (as check_plan's compiled
    half; the op-by-op run does not change with loops): loss, gradients, state and the
    saved residuals predicted. Returns ``(fn, params, rest)``."""
    _, params, rest = nnx.split(factory(), nnx.Param, ...)
    fn = q.lowered()
    (c_loss, (_, c_state)), c_grads = jax.jit(jax.value_and_grad(fn, has_aux=True))(
        params, rest, args
    )
    loss, grads, state = ref
    assert_close(c_loss, loss)
    assert_close(c_grads, grads)
    assert_close(c_state, state)
    assert saved_residuals(fn, params, rest, args) == expected_residuals(q.model, q.schedule)
    return fn, params, rest


def check_loops(q, factory, loss_fn, args, ref, *, looped: bool) -> None:
    """check_compiled, the loop in its jaxpr iff the schedule has runs; the unrolled
    step saves the same bytes, unstacked."""
    fn, params, rest = check_compiled(q, factory, args, ref)
    assert bool(scan_runs(q.model, q.schedule) or segment_loops(q)) == looped
    assert has_scan(fn, params, rest, args) == looped
    unrolled = lower(q.model, q.schedule, loops=False)
    assert not has_scan(unrolled, params, rest, args)
    want = expected_residuals(q.model, q.schedule, loops=False)
    assert saved_residuals(unrolled, params, rest, args) == want

    def nbytes(counter) -> int:  # (a threefry key: two uint32)
        size = {"key<fry>": 8}
        return sum(int(np.prod(s)) * (size.get(d) or np.dtype(d).itemsize) * c
                   for (s, d), c in counter.items())  # fmt: skip

    # the loop holds the unrolled residuals, stacked: the same bytes, and the stacked
    # constants its Segments' looping forwards slice
    stacks = Counter(
        (tuple(q.model.program.avals[v].shape), str(q.model.program.avals[v].dtype))
        for v in segment_stacks(q.model, q.schedule)
    )  # fmt: skip
    assert nbytes(expected_residuals(q.model, q.schedule)) == nbytes(want) + nbytes(stacks)


@pytest.mark.slow
def test_scanned_stack_lowered_as_a_loop():
    factory, loss_fn, args = make_scan(width=8, depth=3, batch=4)
    ref = reference(factory, loss_fn, args)
    p = auto.plan(loss_fn, factory(), *args, budget="100%", exact=False)
    for budget in budgets(p, (1.0, 0.4)):
        q = p.replan(budget)
        check_loops(q, factory, loss_fn, args, ref, looped=True)
    runs = scan_runs(p.model, p.schedule)
    assert [(r.start, r.period, r.length, r.step) for r in runs.values()] == [(1, 1, 3, 1)]


def test_reverse_scan_and_a_value_passing_through():
    factory, loss_fn, args = make_context()
    ref = reference(factory, loss_fn, args)
    p = auto.plan(loss_fn, factory(), *args, budget="100%", exact=False)
    runs = scan_runs(p.model, p.schedule)
    assert sorted(r.step for r in runs.values()) == [-1, 1]  # both scans, one reversed
    assert any(not c for r in runs.values() for c in boundary(p.model, r)[2])  # ctx
    q = p.replan(budgets(p, (0.1,))[0])
    assert False in {r.top for r in scan_runs(q.model, q.schedule).values()}  # in a Segment
    for plan in (p, q):  # a run inside a checkpointed Segment too
        check_loops(plan, factory, loss_fn, args, ref, looped=True)


class Emitting(nnx.Module):
    """A scan whose iterations emit outputs (``ys``, stacked after the loop): the carry
    itself (as an RNN's hidden states) and a value made from it."""

    def __init__(self, depth: int, reverse: bool, *, rngs: nnx.Rngs):
        self.stack = nnx.Param(0.3 * jax.random.normal(rngs.params(), (depth, 4, 4)))
        self.reverse = reverse

    def __call__(self, x):
        def layer(h, w):
            h = jnp.tanh(h @ w)
            return h, (h, h.sum(axis=-1))

        h, (hs, sums) = jax.lax.scan(layer, x, self.stack[...], reverse=self.reverse)
        return h + hs.mean(axis=0) * sums.mean(axis=0)[:, None]


def whiles(fn, params, rest, args) -> int:
    """The ``while`` loops of the compiled step's StableHLO (a loop's forward is one,
    its backward another; a loop in a checkpointed Segment runs its forward twice)."""
    step = jax.jit(jax.value_and_grad(fn, has_aux=True))
    return step.lower(params, rest, args).as_text().count("stablehlo.while")


def tree_nodes(q) -> list:
    """The Segments and Records of the schedule's tree, at every level."""
    found, todo = [], [parse_tree(q.schedule.ops, q.model.length)]
    while todo:
        node = todo.pop()
        if isinstance(node, Segment):
            found.append(node)
            todo += [node.inside, node.after]
        elif isinstance(node, Record):
            found.append(node)
            todo.append(node.rest)
    return found


def segments(q) -> list:
    """The Segments of the schedule's tree, at every level."""
    return [node for node in tree_nodes(q) if isinstance(node, Segment)]


def segment_loops(q) -> int:
    """The loops of the Segments' first forwards (forward_runs), over the schedule's tree."""
    return sum(len(forward_runs(q.model, s.start, s.stop)) for s in segments(q))


def loops_lowered(q) -> int:
    """The ``while`` loops of the compiled step: a run's forward (and its backward where
    it is differentiated), each time it runs: in a ``jax.checkpoint``-ed Segment's first
    forward and again in its recomputation; a Segment with loops in its first forward
    (segments.py) runs them, then its structure in its backward."""
    runs = scan_runs(q.model, q.schedule)

    def walk(node, primal: bool) -> int:
        n = 0
        while isinstance(node, Record | Segment):
            if isinstance(node, Segment):
                first = forward_runs(q.model, node.start, node.stop)
                n += len(first) if first else walk(node.inside, True)
                n += 0 if primal else walk(node.inside, False)
                node = node.after
            elif node.index in runs:
                n += 1 if primal else 2
                for _ in runs[node.index].blocks:
                    node = node.rest
            else:
                node = node.rest
        return n

    return walk(parse_tree(q.schedule.ops, q.model.length), False)


def check_emitting(q, factory, loss_fn, args, ref) -> dict:
    """check_loops, and the emitted values leave every run as one stacked array each
    (one ``while`` forward and one backward per run, more in Segments:
    :func:`loops_lowered`, none for the unrolled step's blocks). The runs, by first
    block."""
    check_loops(q, factory, loss_fn, args, ref, looped=True)
    runs = scan_runs(q.model, q.schedule)
    assert any(emits(q.model, r) for r in runs.values())
    _, params, rest = nnx.split(factory(), nnx.Param, ...)
    unrolled = lower(q.model, q.schedule, loops=False)
    loops = whiles(q.lowered(), params, rest, args) - whiles(unrolled, params, rest, args)
    assert loops == loops_lowered(q)
    return runs


def test_segments_forward_as_loops():
    """At the least budget a scanned stack is recomputed from its input at every level of
    a nest of Segments (``S[0:8]{S[0:7]{..} R6} R7``) and no Records repeat: no scan run,
    but each Segment's first forward runs its repeated blocks as one loop (segments.py),
    with the gradients and the saved residuals of jax.checkpoint's unrolled forwards, in
    fewer operations."""
    factory, loss_fn, args = make_scan(width=8, depth=8, batch=4)
    ref = reference(factory, loss_fn, args)
    p = auto.plan(loss_fn, factory(), *args, budget="100%", exact=False)
    q = p.replan(p.least_budget())
    assert not scan_runs(q.model, q.schedule)
    n = segment_loops(q)
    assert n >= 5  # the Segments over 3 blocks of the stack or more
    check_loops(q, factory, loss_fn, args, ref, looped=True)
    _, params, rest = nnx.split(factory(), nnx.Param, ...)
    unrolled = lower(q.model, q.schedule, loops=False)
    assert whiles(q.lowered(), params, rest, args) == n == loops_lowered(q)
    texts = [
        jax.jit(jax.value_and_grad(f, has_aux=True)).lower(params, rest, args).as_text()
        for f in (q.lowered(), unrolled)
    ]
    ops = [sum(" = stablehlo." in line for line in t.splitlines()) for t in texts]
    assert ops[0] < 0.9 * ops[1]
    # benchmarks/auto_step_size.py's count of the same (it fell out of step with
    # forward_runs' signature once, unnoticed until stop 48)
    fwd, _, ckpt, copies = load_script("benchmarks/auto_step_size.py").forward_copies(
        q.model, q.schedule
    )
    assert fwd == sum(type(op).__name__.startswith("F_") for op in q.schedule.ops)
    assert copies < ckpt


def test_a_segments_forward_loops_over_blocks_recorded_under_other_options():
    """A block's forward is the same under every option, so a Segment's first forward
    loops over repeated blocks that the schedule records later under different options
    (the 43-block BiLSTM at its least budget: 18,178 optimized HLO lines instead of
    19,219); the compiled step still equals plain autodiff and saves the plan's bytes."""
    factory, loss_fn, args = make_scan(width=8, depth=8, batch=4)
    ref = reference(factory, loss_fn, args)
    p = auto.plan(loss_fn, factory(), *args, budget="100%", exact=False)
    least = p.least_budget()
    for step in range(10):  # the first budget above the least where a Segment mixes options
        q = p.replan(least + (p.budget - least) * step // 20)
        options = schedule_options(q.model.problem, q.schedule)
        mixed = [
            r for s in segments(q) for r in forward_runs(q.model, s.start, s.stop).values()
            if len({options[k] for k in r.blocks}) > 1
        ]  # fmt: skip
        if mixed:
            break
    assert mixed, "no Segment over blocks of several options"
    check_loops(q, factory, loss_fn, args, ref, looped=True)
    _, params, rest = nnx.split(factory(), nnx.Param, ...)
    assert whiles(q.lowered(), params, rest, args) - whiles(
        lower(q.model, q.schedule, loops=False), params, rest, args
    ) == loops_lowered(q)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_emitting_outputs_is_a_loop(reverse):
    """A scan whose steps emit ys: the unrolled cuts grow (each iteration's ys wait for
    the stacking after the scan), the loop emits them stacked and the blocks after it
    read the stack; the compiled step equals the plain one and saves the unrolled
    bytes."""
    x = jax.random.normal(jax.random.key(1), (2, 4))
    y = jax.random.normal(jax.random.key(2), (2, 4))

    def factory():
        return Emitting(4, reverse, rngs=nnx.Rngs(0))

    ref = reference(factory, mse, (x, y))
    p = auto.plan(mse, factory(), x, y, budget="100%", exact=False)
    runs = check_emitting(p, factory, mse, (x, y), ref)
    assert [r.step for r in runs.values()] == [-1 if reverse else 1]


@pytest.mark.parametrize("budget", ["100%", pytest.param("65%", marks=pytest.mark.slow)])
def test_lstm_steps_are_one_loop(budget):
    """The zoo's BiLSTM tagger (three ``nnx.RNN`` layers over ``OptimizedLSTMCell``s,
    whose scans emit every step's carry): each layer's steps are loops, at store-all
    (one per layer) and at a budget that recomputes (at 65% the second layer's steps
    are recorded under two options: two loops). Its first step is in the loop (its constant initial
    carry is differentiated like the later carries: the same block), and so is its last
    where that reads the same values (the last layer's final cell state is not read
    after it: a block of its own). At 65% (the plan its bytes give, since stop 46) the
    second layer records 3 of its 12 steps under options of their own: 9 in two loops."""
    case = zoo.case("lstm")
    ref = reference(case.factory, case.loss_fn, case.args)
    p = auto.plan(case.loss_fn, case.factory(), *case.args, budget=budget)
    if budget != "100%":
        assert p.overhead > 0  # something is recomputed
    runs = check_emitting(p, case.factory, case.loss_fn, case.args, ref)
    looped = Counter()  # steps in loops, per layer (a loop per stretch of one option)
    for r in runs.values():
        looped[r.scan] += r.length
    least = 11 if budget == "100%" else 9  # of the 12 steps
    assert sorted(looped) == [0, 1, 2] and min(looped.values()) >= least
    if budget == "100%":
        assert sorted(r.length for r in runs.values()) == [11, 12, 12]


class RNNTagger(nnx.Module):
    """One ``nnx.RNN`` over an ``LSTMCell`` with ``seq_lengths``: its scan slices
    constant int32 time indices, stacked globals that the step holds as constants."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.rnn = nnx.RNN(nnx.LSTMCell(3, 4, rngs=rngs))
        self.out = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x, lengths):
        return self.out(self.rnn(x, seq_lengths=lengths))


def rnn_case():
    x = jax.random.normal(jax.random.key(0), (2, 6, 3))
    y = jax.random.normal(jax.random.key(1), (2, 6, 2))

    def loss_fn(model, x, lengths, y):
        return jnp.mean((model(x, lengths) - y) ** 2)

    return lambda: RNNTagger(rngs=nnx.Rngs(0)), loss_fn, (x, jnp.array([6, 4]), y)


def test_segments_looping_forward_save_the_stacked_constants_they_slice():
    """At the least budget of an ``nnx.RNN``, the top-level Segment's first forward loops
    over the steps and slices the scan's stacked constant time indices itself: the
    compiled step saves them (the unrolled step saves their slices alone), as
    ``expected_residuals`` says (it did not: three ``int32[12]`` more than predicted on
    the zoo's BiLSTM at its least budget)."""
    factory, loss_fn, args = rnn_case()
    ref = reference(factory, loss_fn, args)
    p = auto.plan(loss_fn, factory(), *args, budget="100%", exact=False)
    q = p.replan(p.least_budget())
    assert segment_stacks(q.model, q.schedule)  # the constants a looping forward slices
    check_loops(q, factory, loss_fn, args, ref, looped=True)


def test_a_scan_under_two_options_is_two_loops():
    """Two stretches of one scan's steps recorded under two options: two loops, the first
    without its last step, whose outputs the second loop's first step reads as its carry
    (else the second would slice them out of the first's stacked outputs, held twice);
    the whole first stretch was unrolled (the zoo's BiLSTM at 65%: 30 of 43 blocks in
    loops, now 34; 8,179 optimized HLO lines, now 7,136)."""
    factory, loss_fn, args = rnn_case()
    ref = reference(factory, loss_fn, args)
    p = auto.plan(loss_fn, factory(), *args, budget="100%", exact=False)
    (run,) = scan_runs(p.model, p.schedule).values()  # 4 blocks a step, 5 steps
    assert (run.period, run.length) == (4, 5)
    split = run.start + 3 * run.period  # steps 3 and 4 under other options
    options = tuple(
        (o + 1) % len(p.model.options[k]) if k in range(split, run.blocks.stop) else o
        for k, o in enumerate(p.schedule.options)
    )  # fmt: skip
    q = dataclasses.replace(p, schedule=dataclasses.replace(p.schedule, options=options))
    runs = scan_runs(q.model, q.schedule)
    assert sorted((r.start, r.length) for r in runs.values()) == [(run.start, 2), (split, 2)]
    check_emitting(q, factory, loss_fn, args, ref)


def test_scan_iterations_are_cut_alike():
    """Every iteration of an unrolled scan is cut at the same offsets from its start,
    though the crossing bytes differ at the scan's ends (find_cuts), and its first
    iteration, whose initial carry is a constant, is the same block as the others."""
    case = zoo.case("lstm")
    p = auto.plan(case.loss_fn, case.factory(), *case.args, budget="100%", exact=False)
    blocks, program = p.model.blocks, p.model.program
    for scan in program.scans:
        offsets = {
            tuple(c - a for c in blocks.positions if a <= c < b)
            for a, b in zip(scan.starts[:-1], scan.starts[1:], strict=True)
        }
        assert offsets == {(0,)}  # one block an iteration
        first, second = (blocks.positions.index(a) + 1 for a in scan.starts[:2])
        assert blocks.blocks[first].key == blocks.blocks[second].key


def recomputing_records(q) -> int:
    """The Records of the schedule's tree, at every level, whose option recomputes (a
    policy: ``BlockFunctions.recomputes``)."""
    options = schedule_options(q.model.problem, q.schedule)
    return sum(
        q.model.functions(node.index, options[node.index]).recomputes
        for node in tree_nodes(q)
        if isinstance(node, Record)
    )


def test_recomputations_are_behind_barriers_except_on_cpu():
    """Every recomputation runs behind an optimization barrier where XLA schedules for
    memory (it must not merge it with the first forward): each Segment's, and each
    Record's whose option is a checkpoint policy; and behind none on CPU, where XLA does
    not and the barriers only slowed its compile (jax_exec.execute.barriers). Lowered
    for CUDA on this CPU-only machine the step holds one barrier per Segment and per
    such Record (a decoder LM, no loops: each lowered once), lowered for CPU none; its
    residuals and gradients are the plain step's (CPU)."""
    case = zoo.case("decoder_lm")
    p = auto.plan(case.loss_fn, case.factory(), *case.args, budget="100%", exact=False)
    q = p.replan(p.least_budget())
    n, r = len(segments(q)), recomputing_records(q)
    assert n >= 5 and r >= 5
    _, params, rest = nnx.split(case.factory(), nnx.Param, ...)
    traced = jax.jit(jax.value_and_grad(q.lowered(), has_aux=True)).trace(params, rest, case.args)
    barriers = {
        platform: traced.lower(lowering_platforms=(platform,))
        .as_text()
        .count("stablehlo.optimization_barrier")
        for platform in ("cpu", "cuda")
    }
    assert barriers == {"cpu": 0, "cuda": n + r}
    check_compiled(q, case.factory, case.args, reference(case.factory, case.loss_fn, case.args))

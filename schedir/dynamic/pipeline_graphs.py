"""The task graphs of pipeline problems: a training step with its data
(:func:`training_task_graph`, :func:`training_graph`) and a stream of items through
groups of stages (:func:`pipeline_graph`)."""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from schedir.dynamic.graph import Datum, Task, TaskGraph
from schedir.errors import InvalidProblem
from schedir.pipeline.problem import PipelineProblem, working_set


@dataclass(frozen=True)
class GroupCosts:
    """What one group of stages costs in a training step (per micro-batch but ``update``).

    Attributes:
        first, last: its stages [first, last).
        forward, backward, update: seconds at speed 1 of its forward and backward of
            one micro-batch (the loss in the last group's backward) and of its
            parameter update (once per step).
        input_bytes: a_first, and its gradient d_first (0 for group 0: the model's
            input is a source of ``input_bytes`` and its gradient is not computed).
        stash_bytes: what the backward needs from the forward besides its inputs.
        param_bytes, grad_bytes: its parameters, and one partial gradient sum.
        forward_temp, backward_temp: bytes live only inside the forward / backward.
        update_bytes: what the update writes (kept to the end of the step).
    """

    first: int
    last: int
    forward: float
    backward: float
    update: float
    input_bytes: int
    stash_bytes: int
    param_bytes: int
    grad_bytes: int
    forward_temp: int = 0
    backward_temp: int = 0
    update_bytes: int = 0


def training_task_graph(
    groups: Sequence[GroupCosts], microbatches: int, target_bytes: int = 0
) -> TaskGraph:
    """The training step of a pipeline as a task graph with its data.

    Per micro-batch n and group g: ``F{g}[n]`` reads a_g[n] (``x[n]`` for g = 0, a
    source) and the group's parameters ``w{g}``, writes a_{g+1}[n] (nothing for the
    last group: its forward ends with the loss, which also reads the target ``y[n]``
    when ``target_bytes`` > 0) and the stash ``s{g}[n]`` (recomputable);
    ``B{g}[n]`` reads what ``F{g}[n]`` read, the stash and d_{g+1}[n] (not for the
    last group), writes d_g[n] (not for g = 0) and adds the parameter gradients to
    the accumulator ``acc{g}``. Per group, ``W{g}`` (after every ``B{g}``) reads the
    parameters and the accumulator (all partials) and writes ``u{g}`` (an output).
    Items are micro-batches; ``B0[n]`` completes item n.
    """
    m = microbatches
    if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
        raise InvalidProblem(f"microbatches = {m!r}: expected an integer >= 1")
    G = len(groups)
    if not G:
        raise InvalidProblem("training graph: no groups")
    data: list[Datum] = []

    def datum(name: str, size: int, kind: str, recompute: bool = False) -> int:
        data.append(Datum(name, size, kind, recompute))
        return len(data) - 1

    params = [datum(f"w{g}", c.param_bytes, "param") for g, c in enumerate(groups)]
    accs = [datum(f"acc{g}", c.grad_bytes, "accumulator") for g, c in enumerate(groups)]
    tasks: list[Task] = []
    bwd_ids: list[list[int]] = [[] for _ in groups]
    for n in range(m):
        a = datum(f"x[{n}]", groups[0].input_bytes, "input")
        y = datum(f"y[{n}]", target_bytes, "input") if target_bytes else None
        f_reads, f_ids, stash = [], [], []
        for g, c in enumerate(groups):
            reads = [a, params[g]] + ([y] if y is not None and g == G - 1 else [])
            s = datum(f"s{g}[{n}]", c.stash_bytes, "stash", recompute=True)
            writes = [s]
            nxt = None
            if g + 1 < G:
                nxt = datum(f"a{g + 1}[{n}]", groups[g + 1].input_bytes, "activation")
                writes.append(nxt)
            deps = ((len(tasks) - 1, c.input_bytes),) if g else ()
            tasks.append(Task(f"F{g}[{n}]", f"F{g}", c.forward, deps, n, False,
                              tuple(reads), tuple(writes), c.forward_temp))  # fmt: skip
            f_reads.append(reads)
            f_ids.append(len(tasks) - 1)
            stash.append(s)
            a = nxt
        d_in = None
        for g in reversed(range(G)):
            c = groups[g]
            reads = [*f_reads[g], stash[g]]
            deps = [(f_ids[g], c.stash_bytes)] + ([(f_ids[g - 1], c.input_bytes)] if g else [])
            if d_in is not None:
                reads.append(d_in)
                deps.append((len(tasks) - 1, groups[g + 1].input_bytes))
            writes = [accs[g]]
            d_in = None
            if g > 0:
                d_in = datum(f"d{g}[{n}]", c.input_bytes, "gradient")
                writes.append(d_in)
            tasks.append(Task(f"B{g}[{n}]", f"B{g}", c.backward, tuple(deps), n, g == 0,
                              tuple(reads), tuple(writes), c.backward_temp))  # fmt: skip
            bwd_ids[g].append(len(tasks) - 1)
    for g, c in enumerate(groups):
        out = datum(f"u{g}", c.update_bytes, "output")
        deps = tuple((b, c.grad_bytes) for b in bwd_ids[g])
        tasks.append(Task(f"W{g}", f"W{g}", c.update, deps, None, False,
                          (params[g], accs[g]), (out,)))  # fmt: skip
    return TaskGraph(tuple(tasks), tuple(data), tuple((c.first, c.last) for c in groups))


def training_graph(
    problem: PipelineProblem,
    microbatches: int | None = None,
    cuts: Sequence[int] | None = None,
    update_time: float = 0.0,
) -> TaskGraph:
    """:func:`training_task_graph` of a training problem's chain, one group per
    interval [cuts[g], cuts[g+1]) (default: one per stage): forward and backward times
    from the chain (the loss in the last backward), input sizes ``in_size``, stash
    ``sum(saved_size)``, temporaries :func:`schedir.pipeline.problem.working_set`, parameters
    ``weights`` (which count their gradients and optimizer state: the accumulators
    and the updates take no extra bytes), updates ``update_time`` seconds per group."""
    c, L = problem.chain, problem.length
    cuts = tuple(cuts or range(L + 1))
    if cuts[0] != 0 or cuts[-1] != L or any(a >= b for a, b in itertools.pairwise(cuts)):
        raise InvalidProblem(f"cuts = {cuts}: expected increasing stage indices from 0 to {L}")
    groups = []
    for i, j in itertools.pairwise(cuts):
        bwd = sum(c.bwd_time[i:j]) + (c.fwd_time[L] + c.bwd_time[L] if j == L else 0.0)
        groups.append(GroupCosts(
            i, j, sum(c.fwd_time[i:j]), bwd, update_time, c.in_size[i], sum(c.saved_size[i:j]),
            sum(problem.weights[i:j]), 0, working_set(problem, i, j),
            working_set(problem, i, j, backward=True)))  # fmt: skip
    return training_task_graph(groups, microbatches or problem.microbatches)


def pipeline_graph(problem: PipelineProblem, items: int, cuts: tuple[int, ...] | None = None):
    """The task graph of ``items`` items (micro-batches) through the chain, one task
    per group of stages [cuts[g], cuts[g+1]) (default: one per stage), without data
    (each edge is what one task reads). Inference: forwards ``F{g}`` chained by a_cut;
    training adds backwards ``B{g}`` that need d from the next group and the stash
    (sum of saved_size) of their own forward; :func:`training_graph` gives the whole
    training step with its data."""
    L, c = problem.length, problem.chain
    cuts = tuple(cuts or range(L + 1))
    G = len(cuts) - 1
    tasks: list[Task] = []
    for n in range(items):
        f_ids = []
        for g in range(G):
            i, j = cuts[g], cuts[g + 1]
            deps = ((len(tasks) - 1, c.in_size[i]),) if g else ()
            w = sum(c.fwd_time[i:j])
            final = not problem.training and g == G - 1
            tasks.append(Task(f"F{g}[{n}]", f"F{g}", w, deps, n, final))
            f_ids.append(len(tasks) - 1)
        if problem.training:
            for g in reversed(range(G)):
                i, j = cuts[g], cuts[g + 1]
                deps = [(f_ids[g], sum(c.saved_size[i:j]))]
                w = sum(c.bwd_time[i:j])
                if g < G - 1:
                    deps.append((len(tasks) - 1, c.in_size[j]))
                else:
                    w += c.fwd_time[L] + c.bwd_time[L]
                tasks.append(Task(f"B{g}[{n}]", f"B{g}", w, tuple(deps), n, g == 0))
    groups = tuple(itertools.pairwise(cuts))
    return TaskGraph(tuple(tasks), groups=groups)

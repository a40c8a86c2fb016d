"""Hand-split models through the execution core: profile, plan, run, and the compiled
path (docs/jax_exec.md).

Every function traces the layers and the loss into a step program
(:func:`~jax_exec.stages.program.stage_step`) and hands it to the core
(:mod:`jax_exec.execute`), as ``jax_exec.plan`` does for any Flax model: the same
interpreter runs chain schedules and schedules with copy ops (offload), the same
lowering compiles them.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

import solvers
from jax_exec.execute.lowering import expected_residuals
from jax_exec.execute.residuals import saved_residuals as residuals_of
from jax_exec.execute.result import RunResult
from jax_exec.execute.tree import parse_tree, split_copies
from jax_exec.profile import check_timing
from jax_exec.program.analysis import CostModel
from jax_exec.program.flat import aval_bytes
from jax_exec.stages.program import StageStep, stage_step
from jax_exec.stages.split import LayerWatch, StageList, split_layers
from schedir import Chain, OffloadSchedule, Schedule
from schedir.blocks.schedule import BlockSchedule
from solvers.blocks.policies import recorded

TIMINGS = ("roofline", "measure", "flops")


def profile(
    layers: Sequence[Any],
    loss_fn: Callable[[jax.Array, Any], jax.Array],
    x: jax.Array,
    y: Any,
    *,
    timing: str = "roofline",
    flops_per_second: float = 1e10,
    repeats: int = 7,
    cost_model: CostModel | None = None,
) -> Chain:
    """The :class:`schedir.Chain` of ``layers`` and ``loss_fn(out, y)`` on the batch
    ``(x, y)``: the chain of its step program (:func:`stage_step`, one stage per layer),
    whose sizes are the exact bytes the core's op-by-op runtime holds (the batch is an
    argument: ``in_size[0]`` is 0) and whose temporaries are the compiled kernels'.

    Times: ``timing="roofline"`` the cost model's (:class:`jax_exec.CostModel`, the
    planner's); ``"flops"`` the kernels' ``cost_analysis()`` FLOPs over
    ``flops_per_second``; ``"measure"`` the median wall time of ``repeats`` store-all
    steps run op by op (a stage's forward is timed as its recording forward, an upper
    bound of the plain one).

    Raises:
        TypeError: a layer output or the loss is not an array / scalar.
        ValueError: unknown ``timing``, ``repeats`` < 1, ``flops_per_second`` <= 0.
    """
    check_timing(timing, flops_per_second, repeats, TIMINGS)
    step = stage_step(layers, loss_fn, x, y, cost_model=cost_model)
    chain = step.model.problem.to_chain([0] * step.length)
    names = tuple(s.name for s in step.split.stages) + ("loss",)
    chain = dataclasses.replace(chain, names=names)
    if timing == "roofline":
        return chain
    L = step.length
    if timing == "flops":
        model = step.model
        fwd = [model.kernel("forward", k).flops for k in range(L)]
        bwd = [sum(kern.flops for kern in model.backward_kernels(k, 0)[1]) for k in range(L)]
        bwd.append(model.kernel("loss", L).flops)
        times = ([f / flops_per_second for f in fwd] + [0.0], [b / flops_per_second for b in bwd])
    else:
        times = _measured(step, x, y, repeats)
    return Chain(
        fwd_time=tuple(times[0]),
        bwd_time=tuple(times[1]),
        in_size=chain.in_size,
        saved_size=chain.saved_size,
        fwd_tmp=chain.fwd_tmp,
        bwd_tmp=chain.bwd_tmp,
        names=chain.names,
    )


def _measured(step: StageStep, x: Any, y: Any, repeats: int) -> tuple[list, list]:
    """Median seconds of each recording forward, backward and the loss over ``repeats``
    store-all steps run op by op (after one warm-up step)."""
    L = step.length
    schedule = recorded([0] * L)
    runs = [step.run(schedule, x, y).op_times for _ in range(repeats + 1)][1:]

    def median(i: int) -> float:
        return statistics.median(r[i] for r in runs)

    fwd = [median(k) for k in range(L)] + [0.0]
    bwd = [median(2 * L - k) for k in range(L)] + [median(L)]
    return fwd, bwd


def plan(
    layers: Sequence[Any],
    loss_fn: Callable[[jax.Array, Any], jax.Array],
    x: jax.Array,
    y: Any,
    budget: int | str,
    method: str = "rotor",
    *,
    timing: str = "roofline",
    **options: Any,
) -> tuple[Chain, Schedule]:
    """Profile ``layers`` on the batch ``(x, y)`` (:func:`profile`) and solve for
    ``budget`` (bytes, ``"12MiB"``, or ``"50%"`` of the store-all peak) with any chain
    method (``method``: a chain or offload solver's name; ``options`` go to it).

    ``budget`` counts activation bytes only (kept activations, residuals, gradients of
    activations, temporaries), not parameters, their gradients or the batch. Raises
    :class:`solvers.Infeasible` (``min_budget``: the least feasible budget).
    """
    from schedir.budget import parse_budget

    chain = profile(layers, loss_fn, x, y, timing=timing)
    store_all = solvers.solve(chain, 10**18, method="store_all").meta["peak_memory"]
    return chain, solvers.solve(chain, parse_budget(budget, store_all), method=method, **options)


def run(layers: Sequence[Any], loss_fn: Callable, schedule: Any, x: Any, y: Any) -> RunResult:
    """One training step of ``layers`` following ``schedule`` (chain ops, with copy ops
    or not, or a graph schedule of its block graph) op by op, with measured memory:
    the core's interpreter (``grads``: one pytree per layer)."""
    return stage_step(layers, loss_fn, x, y).run(schedule, x, y)


@dataclass
class Lowered:
    """A schedule lowered onto a stage list (:func:`lower`): the compiled path.

    ``loss(params, x, y, state=None)`` is pure and differentiable, and its autodiff
    follows the schedule (the core's lowering, traced for the batch's shapes at the
    first call); ``params`` holds one parameter pytree per layer (:meth:`params`; a
    parameter several layers read only in the first of them, its gradient there summed
    over its uses), ``state`` the layers' other state (:meth:`state`; None: read when
    ``loss`` is called, or traced).
    """

    split: StageList
    loss_fn: Callable
    schedule: Schedule
    steps: dict = field(default_factory=dict, repr=False)  # batch shapes -> (step, fn)

    def step(self, x: Any, y: Any) -> tuple[StageStep, Callable]:
        """The step program for batches shaped like ``(x, y)`` and its lowered function."""
        key = jax.tree_util.tree_map(lambda a: (jax.numpy.shape(a), jax.numpy.result_type(a)),
                                     (x, y))  # fmt: skip
        key = jax.tree_util.tree_flatten(key)
        key = (str(key[1]), tuple(key[0]))
        if key not in self.steps:
            step = stage_step(self.split.items, self.loss_fn, x, y, exact=False, split=self.split)
            self.steps[key] = (step, step.lowered(self.schedule))
        return self.steps[key]

    def loss(self, params: Sequence, x: Any, y: Any, state: Sequence | None = None) -> jax.Array:
        n = len(self.split.stages)
        if len(params) != n:
            raise ValueError(f"params has {len(params)} entries, the model {n} layers")
        rest = self.split.state() if state is None else list(state)
        if len(rest) != n:
            raise ValueError(f"state has {len(rest)} entries, the model {n} layers")
        _, fn = self.step(x, y)
        loss, _ = fn(list(params), list(rest), (x, y))
        return loss

    def params(self) -> list:
        """The parameters now (a copy: one pytree per layer, shared ones once)."""
        return jax.tree_util.tree_map(lambda v: v, self.split.params())

    def state(self) -> list:
        """The layers' non-trainable state now (a copy: one pytree per layer)."""
        return jax.tree_util.tree_map(lambda v: v, self.split.state())

    def value_and_grad(
        self, params: Sequence, x: Any, y: Any, state: Sequence | None = None
    ) -> tuple[jax.Array, list]:
        """``(loss, grads)`` of :meth:`loss` at ``params``; jit-able."""
        return jax.value_and_grad(self.loss)(list(params), x, y, state)


def lower(layers: Sequence[Any], loss_fn: Callable, schedule: Any) -> Lowered:
    """Lower ``schedule`` (chain ops, with copy ops or not) onto ``layers``: the
    compiled path (:func:`jax_exec.execute.lower`), e.g. ``jax.value_and_grad(
    lowered.loss)`` in any training loop.

    Raises :class:`schedir.InvalidSchedule` for a schedule of another length, an invalid
    one, or one that is not tree-shaped; TypeError for layers that are not a chain.
    """
    split = split_layers(layers)
    L = len(split.stages)
    ops = schedule.ops if isinstance(schedule, Schedule) else OffloadSchedule(schedule).ops
    if any(getattr(op, "buffer", "a")[0] in "wg" for op in ops):
        raise TypeError("weight copies (w[k], g[k]) are not lowered; use jax_exec.run")
    chain_ops, _ = split_copies(ops)
    parse_tree(chain_ops, L)  # made for this many layers and tree-shaped, or why not
    meta = dict(getattr(schedule, "meta", {}))
    return Lowered(split, loss_fn, BlockSchedule(ops, meta, (0,) * L))


def value_and_grad(
    layers: Sequence[Any], loss_fn: Callable, schedule: Any
) -> Callable[[jax.Array, Any], tuple[jax.Array, list]]:
    """A jitted ``f(x, y) -> (loss, grads)`` following ``schedule`` (``grads``: one
    pytree per layer). The layers are split once and traced per batch shape; their
    parameters and state are read at every call (so the step follows ``nnx.update`` and
    optimizers); a change of their structure (``model.eval()``, a reassigned
    submodule) splits and lowers them again. Gradients equal plain
    ``jax.value_and_grad``'s."""
    current: dict[str, Any] = {}

    def build() -> None:
        lowered = lower(layers, loss_fn, schedule)
        current.update(lowered=lowered, watch=LayerWatch(layers),
                       step=jax.jit(lowered.value_and_grad))  # fmt: skip

    build()  # a bad model or schedule fails here, not at the first call

    def f(x: Any, y: Any) -> tuple[jax.Array, list]:
        if current["watch"].changed():
            build()
        split = current["lowered"].split
        return current["step"](split.params(), x, y, split.state())

    return f


@dataclass(frozen=True)
class Residual:
    """One array JAX saves for the backward at the top level of a lowered step.

    Attributes:
        shape, dtype: of the array; nbytes: its size; host: whether it lives in host
        memory (an offloaded buffer); source: JAX's description.
    """

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    host: bool
    source: str


def saved_activations(lowered: Lowered, x: Any, y: Any, *, host: bool = False) -> list[Residual]:
    """The activations JAX saves at the top level of ``lowered``'s step (parameters,
    state and the batch left out): in device memory, or with ``host`` in host memory
    (the offloaded ones). Compare with :func:`expected_activations`."""
    _, fn = lowered.step(x, y)
    found = []
    args = (lowered.params(), lowered.state(), (x, y))
    for aval, source in residuals_of(lambda p, r, a: fn(p, r, a)[0], *args):
        if source.startswith("from the argument") or source == "from a literal":
            continue
        on_host = "host" in str(getattr(aval, "memory_space", "")).lower()
        if on_host == host:
            shape = tuple(int(d) for d in aval.shape)
            nbytes = aval_bytes(aval)
            found.append(Residual(shape, str(aval.dtype), nbytes, on_host, source))
    return found


def expected_activations(
    layers: Sequence[Any], loss_fn: Callable, schedule: Any, x: Any, y: Any
) -> Counter:
    """The activations a schedule (without copy ops) holds right before its ``Loss``,
    and the loss stage's own residuals, as a multiset of ``(shape, dtype)``: what
    :func:`saved_activations` finds (``Counter((r.shape, r.dtype) for r in ...)``)."""
    lowered = lower(layers, loss_fn, schedule)
    step, _ = lowered.step(x, y)
    return expected_residuals(step.model, lowered.schedule)

"""A stage list as a step program of the execution core (docs/jax_exec.md).

A hand-split model, a list of layers each mapping one array to the next
(:mod:`jax_exec.stages.split`), is a block chain with one block per layer and one save
option per block: plain autodiff, whose residuals are the chain model's ``abar`` (the
stage's output and the new residuals of its ``jax.vjp``). :func:`stage_step` traces
the layers and the loss as one pure function, marks each layer's output with
``checkpoint_name`` (:data:`BOUNDARY`) and cuts the program right after each mark, so
the core (:mod:`jax_exec.execute`) runs its schedules op by op and compiled, exactly as
it runs an automatically planned Flax model's.

The batch ``(x, y)`` is an argument of the step (held by the caller, reported in
``batch_bytes``), not an activation: ``a[0]`` holds nothing and no gradient of ``x`` is
computed. The parameters are the layers' own (a parameter several layers read is held
once, in the first of them, and its gradient summed over its uses).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.ad_checkpoint import checkpoint_name

from jax_exec.execute.graph import run_graph_schedule
from jax_exec.execute.interpreter import run_schedule
from jax_exec.execute.lowering import lower
from jax_exec.execute.result import RunResult
from jax_exec.execute.tree import check_schedule, split_copies
from jax_exec.program.analysis import CostModel
from jax_exec.program.build import program_model
from jax_exec.program.kernels import SaveOption
from jax_exec.program.model import BlockModel
from jax_exec.program.problem import build_problem
from jax_exec.program.trace import trace_pure
from jax_exec.stages.split import StageList, activation_specs, check_loss, split_layers
from schedir import GraphSchedule, OffloadSchedule, Schedule
from schedir.blocks.schedule import BlockSchedule

BOUNDARY = "jax_exec:stage"  # the checkpoint_name of every layer's output
PLAIN = SaveOption("everything", label="everything_saveable")  # the chain model's abar


@dataclass
class StageStep:
    """A stage list and its loss traced as a step program.

    Attributes:
        model: the :class:`~jax_exec.program.model.BlockModel` (block k is layer k).
        split: the layers as split (:class:`~jax_exec.stages.split.StageList`): its
            ``params()`` and ``state()`` are read at every call.
    """

    model: BlockModel
    split: StageList

    @property
    def length(self) -> int:
        return self.model.length

    def schedule(self, schedule: Schedule | Sequence) -> Schedule:
        """``schedule`` (or a sequence of ops) with its one option per block."""
        meta = dict(getattr(schedule, "meta", {}))
        ops = schedule.ops if isinstance(schedule, Schedule) else OffloadSchedule(schedule).ops
        chain_ops, _ = split_copies(ops)
        check_schedule(chain_ops, self.length)  # made for this many layers, or why not
        return BlockSchedule(ops, meta, (0,) * self.length)

    def run(self, schedule: Any, x: Any, y: Any) -> RunResult:
        """One step op by op (:func:`jax_exec.execute.run_schedule`); ``grads``: one
        pytree per layer."""
        params, rest = self.split.params(), self.split.state()
        if isinstance(schedule, GraphSchedule):
            options = (0,) * self.length
            return run_graph_schedule(self.model, schedule, options, params, rest, (x, y))
        return run_schedule(self.model, self.schedule(schedule), params, rest, (x, y))

    def lowered(self, schedule: Any) -> Callable:
        """``fn(params, rest, (x, y)) -> (loss, (aux, new_rest))`` following the schedule
        (:func:`jax_exec.execute.lower`); ``params``, ``rest`` as ``split.params()`` and
        ``split.state()``."""
        return lower(self.model, self.schedule(schedule))


def layer_cuts(program: Any, analysis: Any) -> list[int]:
    """Cut positions: right after each layer's mark."""
    del analysis
    return [
        i + 1
        for i, e in enumerate(program.eqns)
        if e.name == "name" and e.params.get("name") == BOUNDARY
    ]


def _spec(a: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(jax.numpy.shape(a), jax.numpy.result_type(a))


def plain_options(model: BlockModel, k: int) -> list[SaveOption]:
    """Every layer's one option: plain autodiff."""
    return [PLAIN]


def stage_step(
    layers: Any,
    loss_fn: Callable[[jax.Array, Any], jax.Array],
    x: Any,
    y: Any,
    *,
    cost_model: CostModel | None = None,
    exact: bool = True,
    split: StageList | None = None,
) -> StageStep:
    """Trace ``layers`` (:func:`~jax_exec.stages.split.split_layers`) and ``loss_fn(out,
    y)`` on the batch ``(x, y)`` (arrays or shapes) into a :class:`StageStep` (module
    docstring). ``exact``: compile every kernel (one option per block), so that the
    problem's figures are the op-by-op runtime's (the compiled path needs none);
    ``split``: the layers already split.

    Raises:
        TypeError: a layer that does not map one array to one floating-point array, a
            loss that is not a scalar, a layer that changes its state while running.
    """
    split = split or split_layers(layers)
    stages = split.stages
    specs = activation_specs(stages, x)
    check_loss(loss_fn, specs[-1], y)

    def pure(params: Sequence, rest: Sequence, args: tuple) -> tuple:
        full = split.expand(params)
        a, target = args
        for stage, p, r in zip(stages, full, rest, strict=True):
            a = checkpoint_name(stage.apply(p, r, a), BOUNDARY)
        return loss_fn(a, target), None, params, rest

    x, y = jax.tree_util.tree_map(_spec, (x, y))
    traced = trace_pure(pure, split.params(), split.state(), (x, y))
    model = program_model(traced, cost_model=cost_model, cuts=layer_cuts, options=plain_options)
    if exact:
        model.compile(model.every_kernel())  # one option per block: every figure exact
        model.problem = build_problem(model)
    return StageStep(model, split)

"""One entry point that executes a schedule on a hand-built model: :func:`run`.

It looks the schedule's class up (its most specific registered base) and calls that
executor:

=====================  ==============================================  ================
schedule class         executor                                         model
=====================  ==============================================  ================
``Schedule`` (chain)   :func:`jax_exec.stages.run` (the core)           list of layers
``OffloadSchedule``    :func:`jax_exec.stages.run` (the core)           list of layers
``GraphSchedule``      :func:`jax_exec.graph.runtime.run_graph` (core)  dict of nodes
``PipelineSchedule``   :func:`jax_exec.pipeline.mpmd.run_pipeline`      list of layers
=====================  ==============================================  ================

A plain sequence of ops (or their printed forms) runs as an offload schedule when it
holds copy ops, else as a chain schedule. Every executor returns a
:class:`jax_exec.RunResult`. A planned Flax model runs through its plan
(``jax_exec.plan(...).run``), the same core.

What does not go through :func:`run`, and why: ``run_dynamic`` executes no schedule
(the placement is decided while it runs, by a policy); the SPMD pipeline is a traced
function used inside ``jax.jit``, not a schedule interpreter; the compiled path
(``jax_exec.stages.value_and_grad``, ``Plan.lowered``) returns a function, not a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from jax_exec.execute.result import RunResult
from jax_exec.graph.runtime import run_graph
from jax_exec.pipeline.mpmd import run_pipeline
from jax_exec.stages import api as stages
from schedir import GraphSchedule, OffloadSchedule, Schedule
from schedir.pipeline.schedule import PipelineSchedule


class Executor(Protocol):
    """Runs one step of ``model`` following ``schedule`` and measures it."""

    def __call__(
        self, model: Any, loss_fn: Callable | None, schedule: Any, *inputs: Any, **options: Any
    ) -> RunResult: ...


def _graph(nodes, loss_fn, schedule, inputs, y, *, graph=None) -> RunResult:
    return run_graph(nodes, loss_fn, graph, schedule, inputs, y)


def _pipeline(layers, loss_fn, schedule, x, y=None, **options) -> RunResult:
    return run_pipeline(layers, schedule, x, y, loss_fn, **options)


EXECUTORS: dict[type, Executor] = {
    Schedule: stages.run,
    OffloadSchedule: stages.run,
    GraphSchedule: _graph,
    PipelineSchedule: _pipeline,
}


def register(schedule_class: type, executor: Executor) -> None:
    """Make :func:`run` execute schedules of ``schedule_class`` with ``executor``."""
    if not isinstance(schedule_class, type):
        raise TypeError(f"schedule_class = {schedule_class!r}: expected a class")
    EXECUTORS[schedule_class] = executor


def unregister(schedule_class: type) -> None:
    """Remove the executor of ``schedule_class`` (KeyError if none)."""
    del EXECUTORS[schedule_class]


def executor_for(schedule: Any) -> tuple[Executor, Any]:
    """The executor of ``schedule`` and the schedule in the form it takes.

    Raises:
        TypeError: no executor for the schedule's class.
    """
    if not hasattr(schedule, "ops"):
        if not isinstance(schedule, Sequence) or isinstance(schedule, str):
            raise TypeError(
                f"schedule: expected a schedule or a sequence of ops, got {type(schedule).__name__}"
            )
        return stages.run, OffloadSchedule(tuple(schedule))
    for cls in type(schedule).__mro__:
        if cls in EXECUTORS:
            return EXECUTORS[cls], schedule
    raise TypeError(
        f"no executor for {type(schedule).__name__}: registered are "
        f"{', '.join(sorted(c.__name__ for c in EXECUTORS))}"
    )


def run(
    model: Any, loss_fn: Callable | None, schedule: Any, *inputs: Any, **options: Any
) -> RunResult:
    """Execute one step of ``model`` following ``schedule``, with measured memory and time.

    Args:
        model: a list of layers (chain, offload and pipeline schedules) or a dict of
            nodes (graph schedules).
        loss_fn: ``loss_fn(out, y)`` -> scalar (None for an inference pipeline).
        schedule: a schedule (its class picks the executor) or a sequence of ops.
        inputs: ``x, y`` (a graph: ``inputs`` dict, ``y``; an inference pipeline: ``x``).
        options: passed to the executor (``graph=`` for a graph schedule, ``devices=``,
            ``block=`` for a pipeline schedule).
    """
    executor, schedule = executor_for(schedule)
    return executor(model, loss_fn, schedule, *inputs, **options)

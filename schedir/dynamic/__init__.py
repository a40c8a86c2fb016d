"""Dynamic runs: task graphs whose tasks a policy places and starts at run time, under
the devices' memory (docs/dynamic_training.md, docs/pipelines.md "Dynamic policies").

- :mod:`.graph`: :class:`TaskGraph` (tasks, their data); :mod:`.pipeline_graphs`: the
  graphs of pipeline problems (a training step with its data, an inference stream);
- :mod:`.runtime`: :class:`RuntimeState`, the rules (placement, admission, eviction,
  transfers, freeing) that both executors follow;
- :mod:`.simulate`: :func:`simulate_dynamic`, the simulated executor (the JAX one is
  ``jax_exec.pipeline.dynamic``); :class:`DynamicTrace`: what a run did.
"""

from schedir.dynamic.dataflow import HOST, SOURCES, DataLayout, data_layout
from schedir.dynamic.graph import Datum, Task, TaskGraph
from schedir.dynamic.pipeline_graphs import (
    GroupCosts,
    pipeline_graph,
    training_graph,
    training_task_graph,
)
from schedir.dynamic.runtime import RuntimeState, TaskPlan
from schedir.dynamic.simulate import simulate_dynamic, task_factors
from schedir.dynamic.trace import DynamicTrace

__all__ = [
    "HOST",
    "SOURCES",
    "DataLayout",
    "Datum",
    "DynamicTrace",
    "GroupCosts",
    "RuntimeState",
    "Task",
    "TaskGraph",
    "TaskPlan",
    "data_layout",
    "pipeline_graph",
    "simulate_dynamic",
    "task_factors",
    "training_graph",
    "training_task_graph",
]

"""jax_exec: everything that touches JAX and Flax (docs/jax_exec.md).

The drop-in, for any Flax NNX model (docs/auto.md):

- :func:`plan` -> :class:`Plan`: trace ``loss_fn(model, *args)``, cut it into blocks,
  choose what each block saves, recomputes or stores in low bits under a memory
  budget; ``Plan.run`` executes it op by op with measured memory (a
  :class:`RunResult`), ``Plan.lowered`` compiles it.
- :func:`value_and_grad`, :func:`grad`: ``nnx.value_and_grad`` and ``nnx.grad`` following
  such a plan.
- :func:`plan_device` -> :class:`DevicePlan`: the whole device's budget (parameters,
  gradients and optimizer state as ZeRO stages or on the host, with the activations;
  docs/device_memory.md).
- :class:`CostModel` (the roofline of every planned time), :class:`UnsupportedModel`
  (what the planner refuses, naming the operation).
- :func:`run`: execute any schedule on a hand-built model (a stage list, a DAG of
  modules, a pipeline), :func:`measure_platform`: the host link's copy speeds.

Expert entry points live in subpackages: :mod:`jax_exec.stages` (hand-split models:
profile, plan, run, the compiled path), :mod:`jax_exec.graph` (DAG models),
:mod:`jax_exec.parallel` (pipelines, ZeRO, dynamic runs on several devices),
:mod:`jax_exec.execute` (the one execution core), :mod:`jax_exec.program` (step
programs), :mod:`jax_exec.auto` (the planner).
"""

import logging

from jax_exec import auto, execute, graph, parallel, program, stages  # noqa: F401 (subpackages)
from jax_exec.auto import CostModel, Plan, UnsupportedModel, grad, plan, value_and_grad
from jax_exec.device_plan import DevicePlan, plan_device
from jax_exec.execute.copies import measure_platform
from jax_exec.execute.result import RunResult
from jax_exec.executor import run

# Silent unless the application configures logging: one INFO line per plan.
logging.getLogger("jax_exec").addHandler(logging.NullHandler())

__all__ = [
    "CostModel",
    "DevicePlan",
    "Plan",
    "RunResult",
    "UnsupportedModel",
    "grad",
    "measure_platform",
    "plan",
    "plan_device",
    "run",
    "value_and_grad",
]

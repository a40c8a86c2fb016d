"""jax_exec.auto: plan and run any Flax NNX model's training step under a memory
budget, from its code alone (docs/auto.md).

- :func:`plan`: trace ``loss_fn(model, *args)``, cut it into blocks, give each block its
  save options, and choose a schedule (a :class:`Plan`: ``.summary()``, ``.run()``).
- :func:`value_and_grad`, :func:`grad`: drop-in ``nnx.value_and_grad`` and
  ``nnx.grad`` following a plan.
"""

from jax_exec.auto.drop_in import grad, value_and_grad
from jax_exec.auto.plan import Plan, plan
from jax_exec.program.analysis import CostModel
from jax_exec.program.flatten import UnsupportedModel

__all__ = ["CostModel", "Plan", "UnsupportedModel", "grad", "plan", "value_and_grad"]

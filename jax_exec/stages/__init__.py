"""Hand-split models: a list of layers, each mapping one array to the next.

- :mod:`~jax_exec.stages.split`: what a stage list accepts (NNX modules, Linen
  ``(module, variables)`` pairs, JAX functions) and its pure :class:`Stage` view;
- :mod:`~jax_exec.stages.program`: the list and its loss as a step program of the
  execution core (:func:`stage_step`);
- :mod:`~jax_exec.stages.api`: :func:`profile` (its chain), :func:`plan` (profile and
  solve), :func:`run` (op by op), :func:`lower` / :func:`value_and_grad` (compiled),
  :func:`saved_activations` / :func:`expected_activations` (check the compiled path).
"""

from jax_exec.stages.api import (
    Lowered,
    expected_activations,
    lower,
    plan,
    profile,
    run,
    saved_activations,
    value_and_grad,
)
from jax_exec.stages.program import StageStep, stage_step
from jax_exec.stages.split import (
    Stage,
    StageList,
    as_stages,
    plain_loss,
    spec_bytes,
    split_layers,
)

__all__ = [
    "Lowered",
    "expected_activations",
    "lower",
    "plan",
    "profile",
    "run",
    "saved_activations",
    "value_and_grad",
    "Stage",
    "StageList",
    "StageStep",
    "as_stages",
    "plain_loss",
    "spec_bytes",
    "split_layers",
    "stage_step",
]

"""Hand-split models: a list of layers, each mapping one array to the next.

- :mod:`~jax_exec.stages.split`: what a stage list accepts (NNX modules, Linen
  ``(module, variables)`` pairs, JAX functions) and its pure :class:`Stage` view;
- :mod:`~jax_exec.stages.program`: the list and its loss as a step program of the
  execution core (:func:`stage_step`).
"""

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
    "Stage",
    "StageList",
    "StageStep",
    "as_stages",
    "plain_loss",
    "spec_bytes",
    "split_layers",
    "stage_step",
]

"""The dynamic runtime's rules, one per module, behind :class:`RuntimeState`: the state
that the simulator and the JAX runtime drive and that policies read
(docs/dynamic_training.md, "The runtime")."""

from schedir.dynamic.runtime.admission import Needs, TaskPlan
from schedir.dynamic.runtime.state import RuntimeState

__all__ = ["Needs", "RuntimeState", "TaskPlan"]

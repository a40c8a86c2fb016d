"""Steady state on several devices (docs/pipelines.md): the period model of interval
mappings (:mod:`.periods`: period, latency and memory of a mapping, the 1F1B training
period) and the periodic pattern that realizes it (:mod:`.pattern`), and the
master-worker problem (:mod:`.master_worker`, solved by ``master_worker_lp``)."""

from schedir.steady.master_worker import MasterWorker, SteadyState
from schedir.steady.pattern import inference_pattern
from schedir.steady.periods import (
    PeriodReport,
    boundary_period,
    buffer_counts,
    evaluate,
    interval_memory,
    mapping_memory,
    training_period,
    used_pairs,
)

__all__ = [
    "MasterWorker",
    "PeriodReport",
    "SteadyState",
    "boundary_period",
    "buffer_counts",
    "evaluate",
    "inference_pattern",
    "interval_memory",
    "mapping_memory",
    "training_period",
    "used_pairs",
]

"""Training steps repeated: the throughput and bubble of a training schedule.

A training schedule is one step of m micro-batches. Steps repeat on every device
in list order, without a barrier between them: a device starts step s + 1 once it
is done with its own part of step s (its parameters are updated when its last W
ends), as with the optimizer post-validation of Qi et al. (2023), under which
ZB-H2 has no bubble. :func:`step_report` simulates ``steps`` steps (the schedule as
a periodic pattern of m items, :func:`schedir.pipeline.ops.expand`) and measures:

- ``period``: seconds per step in steady state, the last step's end minus the
  previous one's (each step's end: its last compute op);
- ``bubble`` = period - max over devices of its compute seconds per step, and
  ``bubble_rate`` = bubble / that busy time (the papers' "bubble rate", e.g. (p-1)/m
  for 1F1B with uniform stages);
- ``makespan``: one step alone; ``device_peak``: bytes over the whole repeated run.

``steps=1`` is one step alone, as a runtime that waits for each step before the next
runs them (a barrier between steps): its period is its makespan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from schedir.errors import InvalidSchedule
from schedir.pipeline.ops import Bwd, Fwd, Wgt
from schedir.pipeline.problem import PipelineProblem
from schedir.pipeline.schedule import PipelineSchedule
from schedir.pipeline.simulate import PipelineTrace, simulate_pipeline


@dataclass(frozen=True)
class StepReport:
    """See the module docstring. Times in seconds, sizes in bytes; ``throughput`` in
    micro-batches per second (m / period)."""

    period: float
    makespan: float
    throughput: float | None
    busy: dict
    bubble: float
    bubble_rate: float
    device_peak: dict
    trace: PipelineTrace


def step_microbatches(schedule: PipelineSchedule) -> int:
    """The number m of micro-batches of a one-step training schedule (0..m-1 all used)."""
    mbs = {o.mb for _, ops in schedule.ops for o in ops if isinstance(o, Fwd | Bwd | Wgt)}
    if not mbs or mbs != set(range(len(mbs))):
        raise InvalidSchedule("a training step uses micro-batches 0..m-1")
    return len(mbs)


def step_report(problem: PipelineProblem, schedule: PipelineSchedule, steps: int = 3) -> StepReport:
    """Simulate ``steps`` >= 1 repeated steps of ``schedule`` (module docstring)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidSchedule(f"steps = {steps!r}: expected an integer >= 1")
    if schedule.periodic:
        raise InvalidSchedule("step_report takes one step, not a periodic pattern")
    m = step_microbatches(schedule)
    periodic = dataclasses.replace(schedule, periodic=m)
    trace = simulate_pipeline(problem, periodic, items=steps * m)
    # step 0 runs as it would alone: every resource serves it before the next step
    ends = [0.0] * steps
    first, busy = None, {}
    for rec in trace.records:
        s = _mb(rec.op) // m if rec.resource[0] == "compute" else None
        if s is not None:
            ends[s] = max(ends[s], rec.end)
        if s == 0:
            dev = rec.resource[1]
            busy[dev] = busy.get(dev, 0.0) + rec.end - rec.start
            first = rec.start if first is None else min(first, rec.start)
    period = ends[-1] - ends[-2] if steps > 1 else ends[0] - (first or 0.0)
    top = max(busy.values(), default=0.0)
    bubble = period - top
    return StepReport(
        period=period,
        makespan=ends[0] - (first or 0.0),
        throughput=m / period if period > 0 else None,
        busy=busy,
        bubble=bubble,
        bubble_rate=bubble / top if top > 0 else 0.0,
        device_peak=dict(trace.device_peak),
        trace=trace,
    )


def _mb(printed: str) -> int:
    """The micro-batch of a printed compute op, e.g. ``Bi(0:3,5,+0.1)`` -> 5."""
    return int(printed.split("(", 1)[1].split(",")[1].rstrip(")"))

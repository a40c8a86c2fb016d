"""The periodic pattern of an inference mapping: the schedule that realizes the period
model (items released at the model's period, round-robin over each interval's
replicas; ``meta`` reports the model's period and latency)."""

from __future__ import annotations

import math

from schedir.pipeline.ops import Fwd, Recv, Send
from schedir.pipeline.problem import Mapping, PipelineProblem
from schedir.pipeline.schedule import PipelineSchedule
from schedir.steady.periods import evaluate


def inference_pattern(problem: PipelineProblem, mapping: Mapping) -> PipelineSchedule:
    """The periodic round-robin pattern of an inference mapping (K = lcm of |R|)."""
    mapping.check(problem)
    ivs = mapping.intervals
    K = math.lcm(*(len(iv.devices) for iv in ivs))
    lists: dict[str, list] = {u: [] for iv in ivs for u in iv.devices}
    for n in range(K):
        for g, iv in enumerate(ivs):
            u = iv.devices[n % len(iv.devices)]
            if g > 0:
                prev = ivs[g - 1].devices
                lists[u].append(Recv("a", iv.first, n, prev[n % len(prev)]))
            lists[u].append(Fwd(iv.first, iv.last, n))
            if g + 1 < len(ivs):
                nxt = ivs[g + 1].devices
                lists[u].append(Send("a", iv.last, n, nxt[n % len(nxt)]))
    rep = evaluate(problem, mapping)
    meta = {"kind": "inference", "period": rep.period, "latency": rep.latency}
    return PipelineSchedule(tuple((u, tuple(v)) for u, v in lists.items()), meta,
                            mapping=mapping, periodic=K, release_interval=rep.period)  # fmt: skip

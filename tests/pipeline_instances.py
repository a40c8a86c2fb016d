"""Random pipeline instances shared by the tests/test_pipeline_*.py files."""

from __future__ import annotations

import dataclasses
import random

from schedir import Chain, Device, Link, Platform
from schedir.pipeline.problem import PipelineProblem


def random_problem(
    rng: random.Random,
    L: int = 5,
    P: int = 4,
    *,
    training: bool = False,
    identical: bool = False,
    memory: bool = False,
    microbatches: int = 8,
) -> PipelineProblem:
    """A chain of L stages on P devices with random speeds, links and (optional) memory."""
    fw = [rng.uniform(0.5, 3) for _ in range(L)]
    bw = [rng.uniform(0.5, 3) for _ in range(L + 1)]
    cw = [rng.randint(1, 50) for _ in range(L + 1)]
    cbw = [0] + [rng.randint(1, 80) for _ in range(L)]
    ft = [rng.randint(0, 5) for _ in range(L)]
    bt = [rng.randint(0, 5) for _ in range(L + 1)]
    chain = Chain.from_rotor(fw, bw, cw, cbw, ft, bt)
    weights = [rng.randint(0, 100) for _ in range(L)]
    if identical:
        cap = rng.choice([None, 300, 400]) if memory else None
        devs = [Device(f"d{u}", 1.5, cap) for u in range(P)]
        platform = Platform.fully_connected(devs, rng.uniform(5, 50), rng.uniform(0, 0.2))
    else:
        devs = [Device(f"d{u}", rng.choice([0.5, 1.0, 1.5, 2.0]), None) for u in range(P)]
        if memory:
            devs = [dataclasses.replace(d, memory=rng.choice([None, 250, 350])) for d in devs]
        links = tuple(
            Link(a.name, b.name, rng.uniform(5, 50), rng.uniform(0, 0.2))
            for a in devs
            for b in devs
            if a != b
        )
        platform = Platform(devices=tuple(devs), links=links)
    return PipelineProblem(chain, weights, platform, microbatches, training)

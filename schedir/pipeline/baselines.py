"""Published training pipeline schedules, generated for any stages p and micro-batches m.

Each generator takes a training :class:`PipelineProblem` and ``devices`` (names, in
pipeline order; default: the platform's), cuts the chain into chunks of balanced
work (:func:`schedir.pipeline.placement.balanced_cuts`; or ``cuts``) and returns one
training step as a :class:`PipelineSchedule` (its ``plans``: one per chunk, its
``meta["pattern"]``):

- :func:`gpipe` (Huang et al., NeurIPS 2019): all forwards, then all backwards;
- :func:`one_f_one_b` (PipeDream-Flush; Narayanan et al., SC 2021): stage d runs
  p - d - 1 warm-up forwards, then one forward and one backward;
- :func:`interleaved_1f1b` (Narayanan et al., SC 2021): v chunks per device (chunk c
  on device c mod p), micro-batches in groups of p per chunk, (p - d - 1) 2 + (v - 1) p
  warm-up forwards on device d; needs m a multiple of p, as in the paper;
- :func:`zb_h1` (Qi et al., ICLR 2024, "Zero Bubble Pipeline Parallelism"): 1F1B's
  warm-up, split backwards, device d postponing its first d weight gradients (a third
  of 1F1B's bubble at 1F1B's memory when F = B = W);
- :func:`zb_h2` (same paper): 2 (p - d - 1) warm-up forwards, the first 2d weight
  gradients postponed (no bubble when F = B = W and m >= 2p - 1, at (2p - 1) / p of
  1F1B's memory on the first device);
- :func:`v_shape` (after Qi et al., NeurIPS 2024, "Pipeline Parallelism with
  Controllable Memory"): two chunks per device in a V (chunk c on device c, then
  back), split backwards, one micro-batch's building block repeated every 6 slots:
  at most half of 1F1B's activation memory (p >= 4) with less bubble than 1F1B.

Their bubbles and peaks under uniform costs are the formulas of docs/pipelines.md
("Baselines"), checked exactly in tests/schedir/test_pipeline_baselines.py.

:func:`gpipe_ops` and :func:`one_f_one_b_ops` build GPipe and 1F1B on an interval
mapping without replication (one chunk per interval; the schedule keeps the mapping).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from schedir.errors import InvalidSchedule
from schedir.pipeline.placement import (
    Order,
    balanced_cuts,
    place,
    schedule_from_orders,
)
from schedir.pipeline.problem import Mapping, PipelineProblem
from schedir.pipeline.schedule import PipelineSchedule


def _setup(problem: PipelineProblem, devices, chunks_per_device: int, cuts, shape: str = "loop"):
    if not problem.training:
        raise InvalidSchedule("training schedules need a training problem (training=True)")
    devices = list(devices or [d.name for d in problem.platform.devices])
    for u in devices:
        problem.platform.device(u)
    parts = len(devices) * chunks_per_device
    cuts = list(cuts) if cuts is not None else balanced_cuts(problem, parts)
    if len(cuts) != parts + 1:
        raise InvalidSchedule(f"cuts = {cuts}: expected {parts + 1} cut points")
    return devices, place(cuts, devices, shape)


def _build(problem, chunks, orders, pattern, recompute=None, **meta) -> PipelineSchedule:
    meta = {"pattern": pattern, "microbatches": problem.microbatches, **meta}
    return schedule_from_orders(problem, chunks, orders, meta, recompute)


def gpipe(problem: PipelineProblem, devices: Sequence[str] | None = None, *, cuts=None,
          recompute=None) -> PipelineSchedule:  # fmt: skip
    """GPipe: every forward, then every backward in reverse micro-batch order."""
    devs, chunks = _setup(problem, devices, 1, cuts)
    m = problem.microbatches
    orders = {u: [("F", d, n) for n in range(m)] + [("B", d, n) for n in reversed(range(m))]
              for d, u in enumerate(devs)}  # fmt: skip
    return _build(problem, chunks, orders, "gpipe", recompute)


def one_f_one_b(problem: PipelineProblem, devices: Sequence[str] | None = None, *, cuts=None,
                recompute=None) -> PipelineSchedule:  # fmt: skip
    """1F1B (PipeDream-Flush): at most p - d micro-batches in flight on device d."""
    devs, chunks = _setup(problem, devices, 1, cuts)
    p, m = len(devs), problem.microbatches
    orders = {u: [(kind, d, n) for kind, n in one_f_one_b_order(d, p, m)]
              for d, u in enumerate(devs)}  # fmt: skip
    return _build(problem, chunks, orders, "1f1b", recompute)


def one_f_one_b_order(p: int, P: int, m: int) -> list[tuple[str, int]]:
    """1F1B order of stage p of P (PipeDream-Flush, Narayanan et al., SC 2021): P-p-1
    warm-up forwards, then alternate one forward and one backward, then drain; at most
    P - p micro-batches are in flight on stage p."""
    warm = min(P - p - 1, m)
    seq = [("F", i) for i in range(warm)]
    f = warm
    for b in range(m):
        if f < m:
            seq.append(("F", f))
            f += 1
        seq.append(("B", b))
    return seq


def interleaved_order(d: int, p: int, v: int, m: int) -> Order:
    """Device d's order in interleaved 1F1B (chunk k of device d is global chunk
    k p + d). Forward number i (0 <= i < m v) is micro-batch (i // (p v)) p + i % p of
    local chunk (i // p) % v; backward number i the same with the chunks reversed."""
    if m % p:
        raise InvalidSchedule(f"interleaved 1F1B needs micro-batches ({m}) to be a multiple "
                              f"of the pipeline depth ({p}) (Narayanan et al. 2021)")  # fmt: skip
    total = m * v

    def which(i: int, forward: bool) -> tuple[int, int]:
        k = (i // p) % v
        return (k if forward else v - 1 - k) * p + d, (i // (p * v)) * p + i % p

    warm = min((p - d - 1) * 2 + (v - 1) * p, total)
    seq: Order = [("F", *which(i, True)) for i in range(warm)]
    for i in range(total - warm):
        seq.append(("F", *which(warm + i, True)))
        seq.append(("B", *which(i, False)))
    seq += [("B", *which(i, False)) for i in range(total - warm, total)]
    return seq


def interleaved_1f1b(problem: PipelineProblem, devices: Sequence[str] | None = None, *,
                     chunks: int = 2, cuts=None, recompute=None) -> PipelineSchedule:  # fmt: skip
    """Interleaved 1F1B with ``chunks`` (v) chunks per device."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise InvalidSchedule(f"chunks = {chunks!r}: expected an integer >= 1")
    devs, placed = _setup(problem, devices, chunks, cuts)
    p, m = len(devs), problem.microbatches
    orders = {u: interleaved_order(d, p, chunks, m) for d, u in enumerate(devs)}
    return _build(problem, placed, orders, "interleaved_1f1b", recompute, chunks_per_device=chunks)


def zb_order(d: int, p: int, m: int, warm: int, defer: int) -> Order:
    """A zero-bubble order on device d: ``warm`` warm-up forwards; then rounds k =
    0..m-1 of (the next forward, Bi_k, and W_{k - defer} once k >= defer); then the
    postponed weight gradients."""
    warm = min(warm, m)
    seq: Order = [("F", d, n) for n in range(warm)]
    f = warm
    w = 0
    for k in range(m):
        if f < m:
            seq.append(("F", d, f))
            f += 1
        seq.append(("Bi", d, k))
        if k >= defer:
            seq.append(("W", d, w))
            w += 1
    seq += [("W", d, n) for n in range(w, m)]
    return seq


def zb_h1(problem: PipelineProblem, devices: Sequence[str] | None = None, *, cuts=None,
          recompute=None) -> PipelineSchedule:  # fmt: skip
    """ZB-H1: 1F1B's p - d - 1 warm-up forwards on device d, its first d weight
    gradients postponed (they fill the drain)."""
    devs, chunks = _setup(problem, devices, 1, cuts)
    p, m = len(devs), problem.microbatches
    orders = {u: zb_order(d, p, m, p - d - 1, d) for d, u in enumerate(devs)}
    return _build(problem, chunks, orders, "zb_h1", recompute)


def zb_h2(problem: PipelineProblem, devices: Sequence[str] | None = None, *, cuts=None,
          recompute=None) -> PipelineSchedule:  # fmt: skip
    """ZB-H2: 2 (p - d - 1) warm-up forwards on device d (the bubble before its first
    backward filled), its first 2d weight gradients postponed (the drain filled: the
    steps form a parallelogram)."""
    devs, chunks = _setup(problem, devices, 1, cuts)
    p, m = len(devs), problem.microbatches
    orders = {u: zb_order(d, p, m, 2 * (p - d - 1), 2 * d) for d, u in enumerate(devs)}
    return _build(problem, chunks, orders, "zb_h2", recompute)


def v_block(p: int) -> dict[tuple[str, int], int]:
    """The V-shape building block of one micro-batch on p devices (2p chunks, chunk c
    on device c for c < p, else 2p - 1 - c) with unit-time ops (F = B = W = 1, as in Qi
    et al. 2024): the start slot of every ("F" | "Bi" | "W", chunk). Each op takes the
    earliest slot after its dependency whose residue modulo 6 (one micro-batch's six
    ops per device) is still free on its device: forwards down the V, then input
    gradients back up, then weight gradients, so that repeating the block every 6
    slots never makes two ops of a device collide."""
    C = 2 * p
    taken: dict[int, set] = {d: set() for d in range(p)}
    slot: dict[tuple[str, int], int] = {}

    def put(key: tuple[str, int], ready: int) -> None:
        d = key[1] if key[1] < p else C - 1 - key[1]
        t = ready
        while t % 6 in taken[d]:
            t += 1
        taken[d].add(t % 6)
        slot[key] = t

    for c in range(C):
        put(("F", c), slot["F", c - 1] + 1 if c else 0)
    for c in reversed(range(C)):
        put(("Bi", c), (slot["Bi", c + 1] if c + 1 < C else slot["F", c]) + 1)
    for c in reversed(range(C)):
        put(("W", c), slot["Bi", c] + 1)
    return slot


def v_shape(problem: PipelineProblem, devices: Sequence[str] | None = None, *, cuts=None,
            recompute=None) -> PipelineSchedule:  # fmt: skip
    """A V-shape schedule: two chunks per device in a V, split backwards, the
    building block :func:`v_block` repeated every 6 slots; each device runs its ops
    in the order of their slots (the warm-up and drain squeezed by the simulator)."""
    devs, chunks = _setup(problem, devices, 2, cuts, shape="v")
    p, m = len(devs), problem.microbatches
    block = v_block(p)
    timed: dict[str, list] = {u: [] for u in devs}
    for n in range(m):
        for (kind, c), t in block.items():
            timed[chunks[c][2]].append((t + 6 * n, kind, c, n))
    orders = {u: [(kind, c, n) for _, kind, c, n in sorted(ops)] for u, ops in timed.items()}
    return _build(problem, chunks, orders, "v_shape", recompute, chunks_per_device=2)


BASELINES = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved_1f1b": interleaved_1f1b,
    "zb_h1": zb_h1,
    "zb_h2": zb_h2,
    "v_shape": v_shape,
}


def _on_mapping(
    problem: PipelineProblem,
    mapping: Mapping,
    order: Callable[[int, int], list[tuple[str, int]]],
    recompute: list[float] | None,
    pattern: str,
) -> PipelineSchedule:
    """The step whose interval p (of P, one device each) runs ``order(p, P)``: (kind,
    micro-batch) pairs, kind "F" or "B"."""
    mapping.check(problem)
    if any(len(iv.devices) != 1 for iv in mapping.intervals):
        raise InvalidSchedule("training pipelines take one device per interval (no replication)")
    chunks = [(iv.first, iv.last, iv.devices[0]) for iv in mapping.intervals]
    P = len(chunks)
    orders = {u: [(kind, p, mb) for kind, mb in order(p, P)] for p, (_, _, u) in enumerate(chunks)}
    s = schedule_from_orders(problem, chunks, orders, {"pattern": pattern},
                             recompute or [0.0] * P)  # fmt: skip
    return dataclasses.replace(s, mapping=mapping)


def gpipe_ops(
    problem: PipelineProblem, mapping: Mapping, recompute: list[float] | None = None
) -> PipelineSchedule:
    """GPipe (Huang et al., NeurIPS 2019) on ``mapping``: all forwards, then all
    backwards (reversed)."""
    m = problem.microbatches

    def order(p: int, P: int):
        return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]

    return _on_mapping(problem, mapping, order, recompute, "gpipe")


def one_f_one_b_ops(
    problem: PipelineProblem, mapping: Mapping, recompute: list[float] | None = None
) -> PipelineSchedule:
    """The 1F1B schedule of ``problem.microbatches`` micro-batches on ``mapping``."""
    m = problem.microbatches
    return _on_mapping(problem, mapping, lambda p, P: one_f_one_b_order(p, P, m), recompute,
                       "1f1b")  # fmt: skip

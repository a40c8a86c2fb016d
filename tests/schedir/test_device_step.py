"""The whole device's step model (schedir.device_step) against timelines worked out by
hand: a two-block chain and its loss stage, a tied parameter read by block 0 and the
loss, four devices on a ring whose pass over B bytes takes B / 1000 s."""

from __future__ import annotations

import math

import pytest

from schedir import B, F_all, InvalidProblem, Loss
from schedir.device_step import (
    StepCosts,
    Strategy,
    data_parallel_platform,
    device_step,
    strategies,
)
from schedir.platform import CopyEngine, Platform
from schedir.trace import TraceRecorder
from schedir.training_state import Placement, device_bytes

# t0 in block 0, t1 in block 1, t2 tied: block 0 and the loss stage (block 2)
PARAMS = [((200,), 4), ((200,), 4), ((100,), 4)]
OPT = PARAMS
BLOCKS = [(0, 2), (1,), (2,)]
COSTS = StepCosts(update_bytes_per_second=1e4, host_bytes_per_second=1e3)


def _trace():
    ops = [F_all(0), F_all(1), Loss(), B(1), B(0)]
    rec = TraceRecorder(0)
    for need, dt in zip([10, 20, 30, 25, 15], [1.0, 1.0, 1.0, 2.0, 2.0], strict=True):
        rec.record(need, need - 5, dt)
    return rec.trace(tuple(ops))


def _platform():
    # ring pass of B bytes over 4 devices: 3/4 B sent at 750 B/s = B / 1000 s
    ring = data_parallel_platform(4, link_bandwidth=750.0, link_latency=0.0)
    return Platform(offload=CopyEngine(100.0), prefetch=CopyEngine(100.0), devices=ring.devices,
                    links=ring.links)  # fmt: skip


def _step(strategy, devices=4):
    return device_step(_trace(), BLOCKS, PARAMS, OPT, strategy, devices, _platform(), COSTS)


def test_data_parallelism_all_reduces_each_tensor_once_complete():
    s = _step(Strategy(Placement.zero(0)))
    # B(1) ends at 5: t1 all-reduced (2 passes of 800 B) 5..6.6; B(0) ends at 7: t0 and
    # the tied t2, complete now, 7..9.4; the update reads 2000 + 2 * 2000 + 2 * 2000 B
    assert math.isclose(s.step_time, 9.4 + 1.0)
    assert s.compute_time == 7.0 and math.isclose(s.update_time, 1.0)
    assert math.isclose(s.exposed_time, 2.4) and math.isclose(s.ring_time, 4.0)
    assert s.collective_bytes == 2 * 600 + 2 * 900 and s.buffers == 0
    assert s.peak_bytes == 3 * 2000 + max(30, 2000)  # the update's bytes exceed activations


def test_stage_1_reduce_scatters_updates_its_shard_and_gathers_the_parameters():
    s = _step(Strategy(Placement.zero(1)))
    # one pass per tensor once complete (5..5.8, 7..8.2); the shard's update reads
    # 500 + 2 * 500 + 2 * 500 B; then the updated parameters are all-gathered (2 s)
    assert math.isclose(s.step_time, 8.2 + 0.25 + 2.0)
    assert s.update_bytes == 500 and s.buffers == 0
    assert s.collective_bytes == 3 * (800 + 1200 + 2000) // 4


def test_stage_3_gathers_before_every_op_and_reduces_every_backward():
    plain = _step(Strategy(Placement.zero(3)))
    # gathers 1200 (block 0), 800, 400 (loss); reductions wait for their buffer (depth 1)
    assert math.isclose(plain.step_time, 13.8 + 0.25)
    prefetch = _step(Strategy(Placement.zero(3), prefetch=True))
    assert math.isclose(prefetch.step_time, 10.6 + 0.25)
    both = _step(Strategy(Placement.zero(3), prefetch=True, overlap=True))
    assert math.isclose(both.step_time, 9.4 + 0.25)
    state = device_bytes(PARAMS, OPT, Placement.zero(3), 4, blocks=BLOCKS)
    assert state.gather == state.reduce_scatter == 1200
    assert (plain.buffers, prefetch.buffers, both.buffers) == (2400, 3600, 4800)
    assert both.peak_bytes == state.resident + 4800 + max(30, 500)
    # gathers 1200 + 800 + 400 + 800 + 1200 and reductions 400 + 800 + 1200, 3/4 sent
    assert plain.collective_bytes == 3 * (4400 + 2400) // 4


def test_offloaded_optimizer_copies_shards_and_updates_on_the_host():
    s = _step(Strategy(Placement.zero(2, offload=True)))
    # down: the parameter shard (500 B, 0..5), then each reduced gradient shard; up: the
    # updated shard; then the replicated parameters are all-gathered (2 s)
    assert math.isclose(s.step_time, 12.4 + 2.5 + 5.0 + 2.0)
    assert s.host_bytes == 500 + 100 + 200 + 300 + 500 and s.update_bytes == 0
    assert s.state.opt_state == 0 and s.state.host == 500 and s.buffers == 1200


def test_one_device_communicates_nothing():
    for strategy in strategies():
        s = _step(strategy, devices=1)
        assert s.collective_bytes == 0 and s.buffers == 0
        if strategy.placement.opt_state != "host":
            assert math.isclose(s.step_time, 7.0 + s.update_time)


def test_strategies_and_bad_input():
    names = [s.name for s in strategies()]
    assert len(names) == len(set(names)) == 15
    assert "ZeRO-3 +offload +prefetch +overlap" in names and "ZeRO-0" in names
    with pytest.raises(InvalidProblem, match="prefetch"):
        Strategy(Placement.zero(2), prefetch=True)
    with pytest.raises(InvalidProblem, match="overlap"):
        Strategy(Placement.zero(1), overlap=True)
    with pytest.raises(InvalidProblem, match="block_params"):
        device_step(_trace(), [(0, 7)], PARAMS, OPT, Strategy(Placement()), 4, _platform())
    with pytest.raises(InvalidProblem, match="host_bytes_per_second"):
        StepCosts(host_bytes_per_second=0)
    with pytest.raises(InvalidProblem, match="no block"):
        device_step(_trace(), BLOCKS[:2], PARAMS, OPT, Strategy(Placement()), 4, _platform())

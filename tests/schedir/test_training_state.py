"""Per-device bytes of parameters, gradients and optimizer state (schedir.training_state):
the ZeRO paper's table, the sharding rule's corner cases, host placement, and the ring
communication model, against hand-computed oracles."""

from __future__ import annotations

import math

import pytest

from schedir import Device, InvalidProblem, Platform
from schedir.training_state import (
    Placement,
    Tensor,
    device_bytes,
    mixed_precision_adam,
    shard_axis,
    step_comm,
    zero_paper_bytes,
)

PSI = 7_500_000_000  # the paper's example: 7.5B parameters, 64 devices


def test_the_paper_table_for_its_7_5b_example() -> None:
    gb = [round(float(zero_paper_bytes(PSI, 64, s)) / 1e9, 1) for s in range(4)]
    assert gb == [120.0, 31.4, 16.6, 1.9]
    # the exact values behind the paper's rounding
    assert [zero_paper_bytes(PSI, 64, s) for s in range(4)] == [
        120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]  # fmt: skip
    assert zero_paper_bytes(PSI, 1, 3) == 120_000_000_000  # N = 1: nothing to divide


def test_accounting_equals_the_paper_when_every_tensor_divides() -> None:
    # 7.5B parameters as 1875 tensors of (64, 62500): every one splits over 64 devices
    shapes = [((64, 62_500), 2)] * 1875
    params, opt = mixed_precision_adam(shapes)
    for stage in range(4):
        got = device_bytes(params, opt, Placement.zero(stage), 64)
        assert got.resident == zero_paper_bytes(PSI, 64, stage)


def test_indivisible_tensors_stay_replicated() -> None:
    assert shard_axis((10, 3), 8) is None  # NamedSharding refuses 10 / 8: no padding
    assert shard_axis((10, 16), 8) == 1  # the first axis that divides
    assert shard_axis((0, 16), 8) == 1 and shard_axis((0, 3), 8) is None
    assert shard_axis((), 8) is None and shard_axis((8,), 1) is None
    p = [((10, 3), 4), ((24, 5), 4), ((), 4)]  # 120 + 480 + 4 bytes
    got = device_bytes(p, p, Placement.zero(3), 8)
    assert got.params == 120 + 480 // 8 + 4 == got.grads == got.opt_state
    assert got.gather == 480 and got.reduce_scatter == 480  # largest block, full size


def test_zero_sizes_and_one_device() -> None:
    zero = device_bytes([((0, 7), 4)], [((0, 7), 4), ((), 4)], Placement.zero(3), 8)
    assert (zero.params, zero.grads, zero.opt_state, zero.gather) == (0, 0, 4, 0)
    assert device_bytes([], [], Placement.zero(3), 8).peak == 0
    p = [((16, 4), 4)]
    for stage in range(4):
        one = device_bytes(p, p, Placement.zero(stage), 1)
        assert one.resident == 3 * 256 and one.gather == one.reduce_scatter == 0


def test_host_placement_keeps_no_optimizer_state_on_the_device() -> None:
    p = [((16, 4), 4), ((3,), 4)]
    opt = p + [((), 4)]
    got = device_bytes(p, opt, Placement.zero(2, offload=True), 8)
    assert got.opt_state == 0 and got.host == 256 // 8 + 12 + 4
    assert got.grads == 256 // 8 + 12 and got.params == 256 + 12
    with pytest.raises(InvalidProblem, match="params"):
        Placement(params="host")


def test_blocks_and_separate_gradient_dtypes() -> None:
    p = [((8, 8), 2), ((8,), 2), ((16, 8), 2)]
    grads = [((8, 8), 4), ((8,), 4), ((16, 8), 4)]
    got = device_bytes(p, [], Placement.zero(3), 8, grads=grads, blocks=[[0, 1], [2]])
    assert got.gather == max(128 + 16, 256) and got.reduce_scatter == 512
    assert got.grads == (256 + 32 + 512) // 8


def test_bad_input_names_the_field() -> None:
    with pytest.raises(InvalidProblem, match=r"params\[1\]"):
        device_bytes([((2,), 4), ((-1,), 4)], [], Placement(), 2)
    with pytest.raises(InvalidProblem, match="devices"):
        device_bytes([], [], Placement(), 0)
    with pytest.raises(InvalidProblem, match="stage"):
        Placement.zero(4)
    with pytest.raises(InvalidProblem, match="blocks"):
        device_bytes([((2,), 4)], [], Placement(), 2, blocks=[[3]])
    with pytest.raises(InvalidProblem, match="itemsize"):
        Tensor((2,), 0)


def test_tensors_the_model_shards_over_data_itself() -> None:
    # FSDP's kernel (the model splits axis 0 over data) and a bias the model leaves whole
    kernel, bias = Tensor((32, 16), 4, data_axis=0), Tensor((16,), 4)
    for stage in range(4):  # the kernel is 1/N under every stage; the bias as the stage says
        got = device_bytes([kernel, bias], [kernel, bias], Placement.zero(stage), 4,
                           blocks=[[0, 1]])  # fmt: skip
        assert got.params == 512 + (16 if stage == 3 else 64)
        assert got.grads == 512 + (16 if stage >= 2 else 64)
        assert got.opt_state == 512 + (16 if stage >= 1 else 64)
        # the kernel is gathered and reduce-scattered whole under every stage
        assert got.gather == 2048 + (64 if stage == 3 else 0)
        assert got.reduce_scatter == 2048 + (64 if stage >= 2 else 0)
    assert device_bytes([kernel], [], Placement(), 1).params == 2048  # N = 1: whole
    with pytest.raises(InvalidProblem, match="data_axis = 1 of shape"):
        device_bytes([Tensor((4, 6), 4, data_axis=1)], [], Placement(), 4)
    with pytest.raises(InvalidProblem, match="data_axis = 2"):
        Tensor((4, 6), 4, data_axis=2)


def test_ring_communication_model() -> None:
    devices = [Device(f"d{i}") for i in range(4)]
    platform = Platform.fully_connected(devices, bandwidth=1e9, latency=1e-6)
    platform = Platform(offload=Platform.host_offload(2e9).offload,
                        prefetch=Platform.host_offload(4e9).prefetch,
                        devices=platform.devices, links=platform.links)  # fmt: skip
    p = [((1000,), 4)]  # 4000 bytes; each ring pass sends 3/4 of it
    base = step_comm(p, Placement.zero(0), 4, platform)
    assert base.collective_bytes == 2 * 3000
    assert math.isclose(base.collective_time, 2 * (3e-6 + 3000 / 1e9))
    assert step_comm(p, Placement.zero(2), 4, platform) == base  # same volume as DP
    three = step_comm(p, Placement.zero(3), 4, platform)
    assert three.collective_bytes == 3 * 3000  # the paper's 1.5x
    off = step_comm(p, Placement.zero(2, offload=True), 4, platform)
    assert off.host_bytes == 2 * 1000
    assert math.isclose(off.host_time, 1000 / 2e9 + 1000 / 4e9)
    assert step_comm(p, Placement.zero(3), 1, Platform()).time == 0.0
    ring = Platform(devices=tuple(devices[:2]))  # no links
    with pytest.raises(InvalidProblem, match="no link"):
        step_comm(p, Placement.zero(1), 2, ring)

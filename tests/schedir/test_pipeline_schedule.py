"""A pipeline schedule's typed structure (schedir.pipeline.schedule): chunk plans, the
mapping, the period of a pattern and its release interval, in place of meta keys."""

from __future__ import annotations

import json

import pytest

import schedir
import solvers
from schedir.errors import InvalidSchedule
from schedir.pipeline.baselines import one_f_one_b_ops
from schedir.pipeline.ops import Fwd
from schedir.pipeline.problem import Interval, Mapping
from schedir.pipeline.schedule import ChunkPlan, PipelineSchedule, expand
from schedir.steady import inference_pattern


def _problem(memory=None, training=True):
    c = schedir.Chain.from_rotor([1.0, 2.0, 1.0], [1.0, 2.0, 1.0, 0.5], [4, 4, 4, 2],
                                 [8, 8, 8, 0], [1, 1, 1], [1, 1, 1, 1])  # fmt: skip
    devs = [schedir.Device("g0", memory=memory), schedir.Device("g1", memory=memory)]
    plat = schedir.Platform.fully_connected(devs, 4.0)
    return schedir.PipelineProblem(c, (1, 1, 1), plat, microbatches=3, training=training)


def test_json_round_trips_every_field():
    pb = _problem()
    m = Mapping((Interval(0, 2, ("g0",)), Interval(2, 3, ("g1",))))
    s = one_f_one_b_ops(pb, m).with_plans(
        [ChunkPlan(0, 2, "g0", 40, "rotor", 1.5, ("F_ck(0)", "F_all(1)", "Loss()", "B(1)",
                                                  "F_all(0)", "B(0)"))])  # fmt: skip
    assert s.mapping == m and [(p.first, p.last, p.device) for p in s.plans] == [
        (0, 2, "g0"), (2, 3, "g1")]  # fmt: skip
    assert s.plan(0, 2).ops[0] == schedir.F_ck(0) and s.footprints() == {(0, 2): 40}
    back = PipelineSchedule.from_dict(json.loads(s.to_json()))
    assert back == s
    pattern = inference_pattern(_problem(training=False), Mapping((Interval(0, 3, ("g0", "g1")),)))
    assert pattern.periodic == 2 and pattern.release_interval == pytest.approx(2.0)
    assert PipelineSchedule.from_dict(json.loads(pattern.to_json())) == pattern
    unrolled = expand(pattern, 5)
    assert unrolled.periodic is None and unrolled.release_interval == pattern.release_interval


def test_solvers_keep_the_structure_through_the_registry():
    """solvers.solve adds its verdict to meta and keeps the typed fields."""
    s = solvers.solve(_problem(memory=60), None, "pipeline_1f1b")
    assert s.plans and all(p.kind in ("store_all", "rotor") for p in s.plans)
    assert all(p.footprint is not None for p in s.plans) and s.mapping is not None
    assert "plans" not in s.meta and "stash" not in s.meta


def test_structure_in_meta_is_refused():
    ops = (("g0", (Fwd(0, 3, 0),)),)
    for key in ("stash", "plans", "chunks", "mapping", "periodic"):
        with pytest.raises(InvalidSchedule, match=f"meta.{key} is not read"):
            PipelineSchedule(ops, {key: 1})


@pytest.mark.parametrize("make, match", [
    (lambda: ChunkPlan(2, 1, "g0"), "expected first < last"),
    (lambda: ChunkPlan(0, 1, ""), "device = ''"),
    (lambda: ChunkPlan(0, 1, "g0", -1), "footprint = -1"),
    (lambda: ChunkPlan(0, 1, "g0", 1.5), "footprint = 1.5"),
    (lambda: ChunkPlan(0, 1, "g0", kind="remat"), "kind = 'remat'"),
    (lambda: ChunkPlan(0, 1, "g0", extra=-1.0), "extra = -1.0"),
    (lambda: ChunkPlan(0, 1, "g0", ops=("F(0:1,0)",)), "cannot parse op"),
    (lambda: PipelineSchedule((), plans=(ChunkPlan(0, 1, "g0"), ChunkPlan(0, 1, "g1"))),
     "chunk 0:1 has two plans"),
    (lambda: PipelineSchedule((), plans=({"chunk": [0, 1]},)), "is not a ChunkPlan"),
    (lambda: PipelineSchedule((), mapping=[[0, 1, ["g0"]]]), "expected a Mapping"),
    (lambda: PipelineSchedule((), periodic=0), "periodic = 0"),
    (lambda: PipelineSchedule((), release_interval=float("inf")), "release_interval = inf"),
    (lambda: PipelineSchedule.from_dict({"format": "schedir.pipeline_schedule", "ops": [],
                                         "plans": [{"chunk": 1}]}), "expected {'chunk'"),
    (lambda: PipelineSchedule.from_dict({"format": "schedir.pipeline_schedule", "ops": [],
                                         "mapping": [[0, 1, "g0"], 5]}), "mapping"),
])  # fmt: skip
def test_bad_structure_is_refused_with_the_field_named(make, match):
    with pytest.raises(InvalidSchedule, match=match) as err:
        make()
    assert "\n" not in str(err.value)


def test_with_plans_replaces_the_chunks_it_names():
    s = PipelineSchedule((), plans=(ChunkPlan(0, 1, "g0"), ChunkPlan(1, 2, "g1")))
    t = s.with_plans([ChunkPlan(1, 2, "g1", 7), ChunkPlan(2, 3, "g0", 9)])
    assert [(p.first, p.footprint) for p in t.plans] == [(0, None), (1, 7), (2, 9)]
    assert s.footprints() == {} and t.footprints() == {(1, 2): 7, (2, 3): 9}

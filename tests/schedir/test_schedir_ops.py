"""Ops (printing, parsing, equality) and the Schedule JSON format."""

import json

import pytest

import schedir
from schedir import B, F_all, F_ck, F_n, InvalidSchedule, Loss, Schedule, parse_op

STAGE_OPS = [F_ck, F_n, F_all, B]


@pytest.mark.parametrize("cls", STAGE_OPS)
@pytest.mark.parametrize("k", [0, 3, 17])
def test_stage_op_prints_and_parses(cls, k):
    op = cls(k)
    text = f"{cls.__name__}({k})"
    assert str(op) == text
    assert repr(op) == text
    back = parse_op(text)
    assert back == op and type(back) is cls and back.index == k


def test_loss_prints_and_parses():
    assert str(Loss()) == "Loss()" and repr(Loss()) == "Loss()"
    assert parse_op("Loss()") == Loss()
    assert type(parse_op("Loss()")) is Loss


def test_printed_forms():
    assert str(F_ck(3)) == "F_ck(3)"
    assert str(F_n(0)) == "F_n(0)"
    assert str(F_all(12)) == "F_all(12)"
    assert str(B(1)) == "B(1)"
    assert str([F_ck(1), Loss()]) == "[F_ck(1), Loss()]"


def test_parse_tolerates_whitespace():
    assert parse_op("  F_ck( 3 ) ") == F_ck(3)
    assert parse_op("Loss( )") == Loss()


def test_equality_and_hash_by_type_and_index():
    assert F_ck(1) == F_ck(1)
    assert hash(F_ck(1)) == hash(F_ck(1))
    assert F_ck(1) != F_n(1)
    assert F_n(1) != F_all(1)
    assert F_all(1) != B(1)
    assert F_ck(1) != F_ck(2)
    assert Loss() == Loss() and hash(Loss()) == hash(Loss())
    assert B(0) != Loss()
    ops = {F_ck(1), F_n(1), F_all(1), B(1), F_ck(1), Loss(), Loss(), F_ck(2)}
    assert len(ops) == 6
    assert {F_ck(1): "a"}[parse_op("F_ck(1)")] == "a"


def test_ops_are_frozen():
    op = F_ck(1)
    with pytest.raises(AttributeError):
        op.index = 2


@pytest.mark.parametrize("cls", STAGE_OPS)
@pytest.mark.parametrize("index", [-1, 1.0, "1", True, None])
def test_bad_index_rejected(cls, index):
    with pytest.raises(InvalidSchedule):
        cls(index)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "F_ck",
        "F_ck()",
        "F_ck(-1)",
        "F_ck(1.5)",
        "F_ck(a)",
        "F_ck(1",
        "F_ck 1",
        "Loss(3)",
        "B()",
        "Foo(1)",
        "f_ck(1)",
        "F_ck(1) F_ck(2)",
        "F_ck(1)x",
        None,
        3,
        F_ck(1),
    ],
)
def test_bad_text_raises(text):
    with pytest.raises(InvalidSchedule):
        parse_op(text)


# --- Schedule ------------------------------------------------------------------------

OPS = (F_all(0), F_ck(1), F_n(2), Loss(), F_ck(1), F_all(2), B(2), B(1), B(0))


def test_schedule_accepts_strings_and_ops():
    s1 = Schedule(OPS)
    s2 = Schedule([str(op) for op in OPS])
    assert s1 == s2
    assert s1.ops == OPS and isinstance(s2.ops, tuple)
    assert len(s1) == 9
    assert s1.meta == {}


def test_schedule_rejects_foreign_ops():
    with pytest.raises(InvalidSchedule, match="op 1"):
        Schedule([F_ck(0), 42])
    with pytest.raises(InvalidSchedule):
        Schedule(["F_ck(0)", "nope"])


def test_schedule_rejects_non_json_meta():
    with pytest.raises(InvalidSchedule, match="meta"):
        Schedule(OPS, meta={"f": object()})


def test_schedule_json_round_trip_exact():
    meta = {
        "method": "rotor",
        "budget": 1024,
        "solve_time": 0.1 + 0.2,
        "options": {"slots": 500, "nested": {"list": [1, 2.5, "x", None, True], "e": {}}},
        "ok": False,
    }
    s = Schedule(OPS, meta=meta)
    text = s.to_json()
    d = json.loads(text)
    assert d["format"] == "schedir.schedule"
    assert d["version"] == 1
    assert d["ops"] == [
        "F_all(0)",
        "F_ck(1)",
        "F_n(2)",
        "Loss()",
        "F_ck(1)",
        "F_all(2)",
        "B(2)",
        "B(1)",
        "B(0)",
    ]
    assert d["meta"] == meta
    back = Schedule.from_json(text)
    assert back == s
    assert back.ops == OPS
    assert back.meta == meta
    assert back.meta["solve_time"] == 0.1 + 0.2
    assert Schedule.from_json(s.to_json(indent=2)) == s


def test_schedule_meta_is_normalized_through_json():
    s = Schedule(OPS, meta={"t": (1, 2), 3: "x"})
    assert s.meta == {"t": [1, 2], "3": "x"}
    assert Schedule.from_json(s.to_json()) == s


def test_schedule_meta_is_copied():
    meta = {"options": {"a": 1}}
    s = Schedule(OPS, meta=meta)
    meta["options"]["a"] = 2
    assert s.meta == {"options": {"a": 1}}


def test_schedule_save_load(tmp_path):
    s = Schedule(OPS, meta={"method": "x", "budget": 7})
    path = tmp_path / "s.json"
    schedir.save(s, path)
    back = schedir.load(path)
    assert isinstance(back, Schedule) and back == s


def test_empty_schedule_round_trip():
    s = Schedule(())
    assert Schedule.from_json(s.to_json()) == s


@pytest.mark.parametrize(
    "change",
    [
        {"format": "schedir.chain"},
        {"format": None},
        {"version": 2},
        {"version": None},
        {"ops": "F_ck(0)"},
        {"ops": None},
        {"ops": ["F_ck(0)", "G(1)"]},
    ],
)
def test_schedule_bad_json_raises(change):
    d = Schedule(OPS).to_dict()
    d.update(change)
    d = {k: v for k, v in d.items() if v is not None}
    with pytest.raises(InvalidSchedule):
        Schedule.from_json(json.dumps(d))
    with pytest.raises(InvalidSchedule):
        Schedule.from_dict(d)


def test_schedule_json_missing_meta_is_empty():
    d = Schedule(OPS).to_dict()
    del d["meta"]
    assert Schedule.from_dict(d) == Schedule(OPS)


def test_load_dispatches_schedule_errors(tmp_path):
    d = Schedule(OPS).to_dict()
    d["version"] = 9
    path = tmp_path / "s.json"
    path.write_text(json.dumps(d))
    with pytest.raises(InvalidSchedule, match="version"):
        schedir.load(path)

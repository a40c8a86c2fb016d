"""Chain construction, validation, rotor interop and JSON I/O (docs/semantics.md)."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

import schedir
from schedir import Chain, InvalidProblem

FIELDS = ("fwd_time", "bwd_time", "in_size", "saved_size", "fwd_tmp", "bwd_tmp")


def fields(**overrides):
    """Fields of a valid L = 2 chain, with some replaced."""
    base = {
        "fwd_time": [1.0, 2.0, 0.0],
        "bwd_time": [3.0, 4.0, 1.5],
        "in_size": [10, 20, 30],
        "saved_size": [25, 35, 0],
        "fwd_tmp": [1, 2, 0],
        "bwd_tmp": [3, 4, 5],
    }
    base.update(overrides)
    return base


def test_valid_chain_fields_and_length():
    c = Chain(**fields())
    assert c.length == 2
    assert c.fwd_time == (1.0, 2.0, 0.0)
    assert c.bwd_time == (3.0, 4.0, 1.5)
    assert c.in_size == (10, 20, 30)
    assert c.saved_size == (25, 35, 0)
    assert c.fwd_tmp == (1, 2, 0)
    assert c.bwd_tmp == (3, 4, 5)
    assert c.names is None
    assert all(type(v) is float for v in c.fwd_time + c.bwd_time)
    assert all(type(v) is int for v in c.in_size + c.saved_size + c.fwd_tmp + c.bwd_tmp)


def test_numpy_inputs_are_normalized():
    c = Chain(
        fwd_time=np.array([1.0, 0.0]),
        bwd_time=np.array([2.0, 3.0], dtype=np.float32),
        in_size=np.array([4, 8], dtype=np.int64),
        saved_size=[np.int32(12), 0],
        fwd_tmp=[0, 0],
        bwd_tmp=[np.uint8(1), 2],
    )
    assert c.in_size == (4, 8) and all(type(v) is int for v in c.in_size)
    assert c.saved_size == (12, 0) and type(c.saved_size[0]) is int
    assert c.bwd_tmp == (1, 2) and type(c.bwd_tmp[0]) is int
    assert c.bwd_time == (2.0, 3.0) and type(c.bwd_time[0]) is float


def test_integral_float_size_is_accepted_exactly():
    c = Chain(**fields(in_size=[10.0, 20, 30]))
    assert c.in_size == (10, 20, 30) and type(c.in_size[0]) is int


def test_loss_only_chain():
    c = Chain(fwd_time=[0.0], bwd_time=[1.0], in_size=[5], saved_size=[0], fwd_tmp=[0], bwd_tmp=[0])
    assert c.length == 0


def test_empty_chain_rejected():
    with pytest.raises(InvalidProblem, match="fwd_time"):
        Chain(**{name: [] for name in FIELDS})


@pytest.mark.parametrize("name", FIELDS)
def test_length_mismatch_names_the_field(name):
    bad = fields()
    bad[name] = bad[name][:2]
    with pytest.raises(InvalidProblem) as err:
        Chain(**bad)
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    if name == "fwd_time":
        # every other field now disagrees with fwd_time: the message names one of them
        assert "fwd_time" in msg and "length 2" in msg and "length 3" in msg
    else:
        assert name in msg and "length 2" in msg and "length 3" in msg


@pytest.mark.parametrize("name", ["in_size", "saved_size", "fwd_tmp", "bwd_tmp"])
@pytest.mark.parametrize("value", [-1, 3.5, -2.0, float("nan"), float("inf"), "7", None])
def test_bad_size_names_field_index_value(name, value):
    bad = fields()
    bad[name] = list(bad[name])
    bad[name][1] = value
    with pytest.raises(InvalidProblem) as err:
        Chain(**bad)
    msg = str(err.value)
    assert f"{name}[1]" in msg
    assert repr(value) in msg


@pytest.mark.parametrize("name", ["in_size", "saved_size", "fwd_tmp", "bwd_tmp"])
@pytest.mark.parametrize("value", [True, False])
def test_bool_size_rejected(name, value):
    bad = fields()
    bad[name] = list(bad[name])
    bad[name][2] = value
    with pytest.raises(InvalidProblem) as err:
        Chain(**bad)
    assert f"{name}[2]" in str(err.value) and repr(value) in str(err.value)


@pytest.mark.parametrize("name", ["fwd_time", "bwd_time"])
@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), float("-inf"), -1.0, -1, True, False, "1.0", None]
)
def test_bad_time_names_field_index_value(name, value):
    bad = fields()
    bad[name] = list(bad[name])
    bad[name][0] = value
    with pytest.raises(InvalidProblem) as err:
        Chain(**bad)
    msg = str(err.value)
    assert f"{name}[0]" in msg
    assert repr(value) in msg


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize("value", ["abc", 3, None, {0: 1}])
def test_field_not_a_sequence(name, value):
    with pytest.raises(InvalidProblem, match=name):
        Chain(**fields(**{name: value}))


def test_names():
    c = Chain(**fields(), names=["conv", "fc", "loss"])
    assert c.names == ("conv", "fc", "loss")
    with pytest.raises(InvalidProblem, match="names") as err:
        Chain(**fields(), names=["conv", "fc"])
    assert "2" in str(err.value) and "3" in str(err.value)
    with pytest.raises(InvalidProblem, match=r"names\[1\]"):
        Chain(**fields(), names=["conv", 7, "loss"])


def test_invalid_problem_is_value_error():
    assert issubclass(InvalidProblem, ValueError)
    assert issubclass(schedir.InvalidSchedule, ValueError)


def test_chain_is_frozen():
    c = Chain(**fields())
    with pytest.raises(AttributeError):
        c.in_size = (1, 2, 3)


def test_store_all_time():
    c = Chain(**fields())
    # forwards 1 + 2 + 0, backwards 3 + 4 + 1.5
    assert c.store_all_time() == 11.5


def test_arrays_pad_in_size():
    arr = Chain(**fields()).arrays()
    assert arr["in_size"].tolist() == [10, 20, 30, 0]
    assert arr["saved_size"].tolist() == [25, 35, 0]
    assert arr["fwd_time"].dtype == np.float64 and arr["bwd_tmp"].dtype == np.int64


# --- rotor interop -------------------------------------------------------------------


def test_from_rotor_mapping():
    # L = 3
    fw = [1.0, 2.0, 3.0]
    bw = [4.0, 5.0, 6.0, 7.0]
    cw = [10, 11, 12, 13]
    cbw = [99, 21, 22, 23]  # cbw[0] is never read
    ftmp = [31, 32, 33]
    btmp = [41, 42, 43, 44]
    c = Chain.from_rotor(fw, bw, cw, cbw, ftmp, btmp)
    assert c.length == 3
    assert c.fwd_time == (1.0, 2.0, 3.0, 0.0)
    assert c.bwd_time == (4.0, 5.0, 6.0, 7.0)
    assert c.in_size == (10, 11, 12, 13)
    assert c.saved_size == (21, 22, 23, 0)
    assert c.fwd_tmp == (31, 32, 33, 0)
    assert c.bwd_tmp == (41, 42, 43, 44)
    assert c.names is None


def test_from_rotor_names_and_zero_stages():
    c = Chain.from_rotor([], [2.0], [5], [7], [], [1], names=["loss"])
    assert c.length == 0
    assert c.fwd_time == (0.0,) and c.saved_size == (0,) and c.fwd_tmp == (0,)
    assert c.in_size == (5,) and c.bwd_tmp == (1,) and c.names == ("loss",)


ROTOR = {
    "fw": [1.0, 2.0],
    "bw": [3.0, 4.0, 1.0],
    "cw": [10, 20, 30],
    "cbw": [10, 25, 35],
    "ftmp": [0, 1],
    "btmp": [0, 2, 3],
}


@pytest.mark.parametrize("name", list(ROTOR))
@pytest.mark.parametrize("delta", [-1, 1])
def test_from_rotor_wrong_lengths(name, delta):
    lists = {k: list(v) for k, v in ROTOR.items()}
    if name == "fw":
        # changing fw changes L: then every other list has the wrong length
        lists["fw"] = lists["fw"][:1] if delta < 0 else lists["fw"] + [5.0]
    elif delta < 0:
        lists[name] = lists[name][:-1]
    else:
        lists[name] = lists[name] + [lists[name][-1]]
    with pytest.raises(InvalidProblem) as err:
        Chain.from_rotor(**lists)
    assert "rotor list" in str(err.value)
    if name != "fw":
        assert f"rotor list {name} " in str(err.value)


def test_from_rotor_validates_values():
    lists = {k: list(v) for k, v in ROTOR.items()}
    lists["cw"][1] = -3
    with pytest.raises(InvalidProblem, match=r"in_size\[1\]"):
        Chain.from_rotor(**lists)


def test_to_rotor_round_trip():
    c = Chain.from_rotor(**ROTOR)
    r = c.to_rotor()
    assert r == ROTOR  # cbw[0] was set to cw[0] in ROTOR, as to_rotor does
    assert Chain.from_rotor(**r) == c
    c2 = Chain(**fields(), names=None)
    assert Chain.from_rotor(**c2.to_rotor()) == c2


@pytest.mark.parametrize(
    "override",
    [{"fwd_time": [1.0, 2.0, 0.5]}, {"saved_size": [25, 35, 7]}, {"fwd_tmp": [1, 2, 3]}],
)
def test_to_rotor_refuses_loss_stage_values_rotor_cannot_hold(override):
    c = Chain(**fields(**override))
    (name,) = override
    with pytest.raises(InvalidProblem, match=rf"{name}\[2\]"):
        c.to_rotor()


# --- JSON ----------------------------------------------------------------------------


@pytest.mark.parametrize("names", [None, ["a", "b", "loss"]])
def test_save_load_round_trip(tmp_path, names):
    c = Chain(**fields(fwd_time=[0.1, 1e-7, 0.0], bwd_time=[1 / 3, 2.5e10, 0.7]), names=names)
    path = tmp_path / "chain.json"
    schedir.save(c, path)
    d = json.loads(path.read_text())
    assert d["format"] == "schedir.chain" and d["version"] == 1
    assert d["in_size"] == [10, 20, 30]
    back = schedir.load(path)
    assert isinstance(back, Chain)
    assert back == c
    assert back.bwd_time[0] == 1 / 3
    assert schedir.load(str(path)) == c


def test_from_dict_dispatch():
    c = Chain(**fields())
    assert schedir.from_dict(c.to_dict()) == c
    assert Chain.from_dict(c.to_dict()) == c


def write(tmp_path, obj):
    path = tmp_path / "x.json"
    path.write_text(json.dumps(obj))
    return path


@pytest.mark.parametrize("fmt", ["schedir.chian", None, 3])
def test_load_bad_format(tmp_path, fmt):
    d = Chain(**fields()).to_dict()
    d["format"] = fmt
    with pytest.raises(InvalidProblem, match="format"):
        schedir.load(write(tmp_path, d))
    with pytest.raises(InvalidProblem, match="format"):
        Chain.from_dict(d)


def test_load_missing_format(tmp_path):
    d = Chain(**fields()).to_dict()
    del d["format"]
    with pytest.raises(InvalidProblem, match="format"):
        schedir.load(write(tmp_path, d))


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_load_bad_version(tmp_path, version):
    d = Chain(**fields()).to_dict()
    d["version"] = version
    with pytest.raises(InvalidProblem, match="version"):
        schedir.load(write(tmp_path, d))


@pytest.mark.parametrize("name", FIELDS)
def test_load_missing_field(tmp_path, name):
    d = Chain(**fields()).to_dict()
    del d[name]
    with pytest.raises(InvalidProblem, match=name):
        schedir.load(write(tmp_path, d))


def test_load_invalid_values(tmp_path):
    d = Chain(**fields()).to_dict()
    d["saved_size"][0] = 2.5
    with pytest.raises(InvalidProblem, match=r"saved_size\[0\]"):
        schedir.load(write(tmp_path, d))


def test_load_not_json_or_not_object(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(InvalidProblem, match="JSON"):
        schedir.load(path)
    with pytest.raises(InvalidProblem):
        schedir.load(write(tmp_path, [1, 2, 3]))


def test_json_times_are_exact():
    c = Chain(**fields(bwd_time=[0.1 + 0.2, math.pi, 1e-300]))
    back = Chain.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back.bwd_time == c.bwd_time


# --- import hygiene ------------------------------------------------------------------


def test_import_does_not_pull_jax_or_cvxpy():
    code = "import schedir, sys; assert 'jax' not in sys.modules and 'cvxpy' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "override, named",
    [
        ({"fwd_time": [1e308, 1e308, 0.0]}, "fwd_time[0] = 1e+308"),
        ({"bwd_time": [3.0, 1.7e308, 1.5]}, "bwd_time[1] = 1.7e+308"),
        ({"in_size": [10, 2**62, 30]}, "in_size[1] = 4611686018427387904"),
        ({"saved_size": [2**61, 2**61, 0]}, "saved_size[0]"),
    ],
)
def test_values_whose_sums_overflow_are_refused(override, named):
    with pytest.raises(InvalidProblem) as err:
        Chain(**fields(**override))
    assert named in str(err.value) and "too large" in str(err.value)


def test_large_but_summable_times_are_kept():
    c = Chain(**fields(fwd_time=[1e300, 1e300, 0.0]))
    assert math.isfinite(c.store_all_time())


def test_offload_problem_validates_weights_and_copy_times():
    from schedir import OffloadProblem, Platform

    c = Chain(**fields())
    for bad, message in (([1, float("inf"), 0], r"weight_size\[1\]"), ([1, 2], "length"),
                         ("abc", "sequence"), ([2**61, 2**61, 0], "2\\*\\*62")):  # fmt: skip
        with pytest.raises(InvalidProblem, match=message):
            OffloadProblem(c, Platform(), weight_size=bad)
    with pytest.raises(InvalidProblem, match="bandwidth = 1e-306: outside"):
        OffloadProblem(c, Platform.host_offload(1e-306))
    assert OffloadProblem(c, Platform.host_offload(0.0)).platform.offload.bandwidth == 0.0

"""The command line on bad input and honest numbers (issue 11, items 5 and 7, and the list
of internal errors): exact budgets, exactness of every answer, one-line errors (exit 2)
where an internal error (exit 3) used to be.

In process through ``schedir_cli.main`` (output captured).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import one_line_error, run

import schedir
import solvers
from schedir_cli.app import parse_budget
from schedir_cli.common import CLIError

ROOT = Path(__file__).resolve().parents[2]
CHAIN = str(ROOT / "examples" / "chain_small.json")
DEMO = str(ROOT / "examples" / "demo_model.json")


def solvers_accept(budget: int) -> bool:
    """Whether ``solvers.solve`` takes this exact integer budget (the budget contract:
    any Python int; the registry of the 'chain' branch implements it)."""
    try:
        solvers.solve(schedir.load(CHAIN), budget, "store_all")
    except schedir.InvalidProblem:
        return False
    return True


BIG = 2**60  # sizes beyond a float's 53-bit mantissa
needs_int_budgets = pytest.mark.skipif(
    not solvers_accept(BIG + 3), reason="needs solvers.solve to accept any int budget (contract)"
)


# ---------------------------------------------------------------- item 7: exact budgets


def test_parse_budget_is_exact() -> None:
    peak = 4 * BIG + 14  # not a float: 100% used to land bytes below it
    assert parse_budget("100%", lambda: peak) == peak
    assert parse_budget("50%", lambda: peak) == 2 * BIG + 7
    assert parse_budget("33.3%", lambda: peak) == peak * 333 // 1000
    assert parse_budget(str(10**30)) == 10**30
    assert parse_budget("1e30") == 10**30
    assert parse_budget("0.1KiB") == 102  # 102.4 rounds down
    assert parse_budget("1.000000000000000001GB") == 10**9  # no float rounding up


@pytest.mark.parametrize(
    "text, needle",
    [
        ("1e400", "not a finite number"),
        ("1e-500", "exponent out of range"),
        ("1400.5", "not a whole number of bytes"),
        ("1" + "0" * 5000, "digits"),
        ("inf", "expected a number"),
        ("nan", "expected a number"),
    ],
)
def test_parse_budget_refuses_non_finite_and_fractional_bytes(text, needle) -> None:
    with pytest.raises(CLIError) as info:
        parse_budget(text, lambda: 1630)
    assert info.value.status == 2 and needle in str(info.value)
    assert len(str(info.value)) < 200  # a long input is cut in the message


@pytest.mark.parametrize(
    "argv",
    [
        ["solve", CHAIN, "-b", "1e400"],
        ["solve", CHAIN, "-b", "1e400", "-m", "all"],
        ["tradeoff", CHAIN, "--from", "1e400"],
        ["tradeoff", CHAIN, "--to", "1e400"],
        ["tradeoff", CHAIN, "--from", "1e400", "--to", "2KiB"],
    ],
)
def test_budget_1e400_is_a_one_line_error(capsys, argv) -> None:
    status, _, err = run(capsys, *argv)
    assert status == 2 and "not a finite number" in one_line_error(err)


@needs_int_budgets
def test_huge_integer_budgets_and_exact_percent(capsys, tmp_path: Path) -> None:
    status, out, err = run(capsys, "solve", CHAIN, "-b", str(10**30), "--json")
    assert status == 0, err
    assert json.loads(out)["budget"] == 10**30
    big = schedir.Chain.from_rotor(
        [1.0, 1.0], [1.0, 1.0, 1.0], [BIG + 1, BIG + 3, 5], [BIG + 7, BIG + 9, 0], [0, 0], [0, 0, 0]
    )
    path = tmp_path / "big.json"
    schedir.save(big, path)
    peak = schedir.simulate(big, solvers.chain.store_all.store_all_ops(big)).peak_memory
    status, out, err = run(capsys, "solve", path, "-b", "100%", "-m", "store_all", "--json")
    assert status == 0, err  # 100% is the store-all peak to the byte
    data = json.loads(out)
    assert data["budget"] == peak == data["results"][0]["peak_memory"]


# ---------------------------------------------------------------- item 5: exactness


def test_answer_quality_optimal_only_when_claimed_or_proven() -> None:
    from schedir_cli.answers import answer_quality

    exact = {"makespan": 2.0, "exact": True}
    assert answer_quality(exact, claimed=False) == {
        "label": "optimal", "exact": True, "fixed": False, "time_limited": False,
        "slot_size": None, "lower_bound": 2.0, "gap": 0.0,
    }  # fmt: skip
    disc = {"makespan": 2.0, "exact": True, "discretization": {"slot_size": 8, "lower_bound": 1.6}}
    q = answer_quality(disc, claimed=True)
    assert not q["exact"] and q["slot_size"] == 8 and q["gap"] == pytest.approx(0.25)
    assert q["label"] == "<=25.0%"
    timed = {"makespan": 3.0, "time_limited": True, "lower_bound": 2.0}
    q = answer_quality(timed, claimed=True)
    assert not q["exact"] and q["time_limited"] and q["gap"] == pytest.approx(0.5)
    q = answer_quality({"makespan": 3.0, "time_limited": True}, claimed=True)
    assert not q["exact"] and q["gap"] is None and q["label"] == "no bound"
    assert answer_quality({"makespan": 3.0}, claimed=False)["label"] == "heuristic"
    # before solvers set meta["exact"]: the registry's claim, unless discretized
    assert answer_quality({"makespan": 1.0}, claimed=True)["exact"]
    assert not answer_quality({"makespan": 1.0, "discretization": {}}, claimed=True)["exact"]
    # a discretized answer at its proven lower bound (to float rounding) is an optimum
    at_bound = {"makespan": 0.1 + 0.2, "discretization": {"slot_size": 8, "lower_bound": 0.3}}
    q = answer_quality(at_bound, claimed=True)
    assert q["exact"] and q["label"] == "optimal" and q["gap"] == 0.0 and q["slot_size"] == 8
    # a tiny gap is printed as a bound rounded up, never as 0.0%
    near = {"makespan": 1.00004, "discretization": {"slot_size": 8, "lower_bound": 1.0}}
    assert answer_quality(near, claimed=True)["label"] == "<=0.0040%"
    # a fixed schedule is labelled fixed whatever its solver's exact flag (JAX policies)
    q = answer_quality({"makespan": 1.0, "exact": True}, claimed=True, fixed=True)
    assert q["label"] == "fixed" and not q["exact"]


def test_solve_says_when_rotor_is_discretized(capsys) -> None:
    """demo_model.json is discretized (its peak is 293 MB): at 50% rotor's answer reaches
    its proven lower bound (optimal, and says it was discretized); at 30% it does not
    (its bound, rounded up, and never 'optimal')."""
    status, out, _ = run(capsys, "solve", DEMO, "-b", "50%", "-m", "rotor", "--json")
    assert status == 0
    (data,) = json.loads(out)["results"]
    assert data["slot_size"] > 1 and data["lower_bound"] <= data["makespan"]
    assert data["label"] == "optimal" and data["exact"] is True and data["gap"] == 0.0
    status, out, _ = run(capsys, "solve", DEMO, "-b", "50%", "-m", "rotor")
    assert "quality   optimal: discretized in slots of" in out and "proven by a lower" in out
    status, out, _ = run(capsys, "solve", DEMO, "-b", "50%", "-m", "all")
    rotor = next(line for line in out.splitlines() if line.startswith("rotor"))
    assert rotor.split()[1] == "optimal"
    status, out, _ = run(capsys, "solve", CHAIN, "-b", "1400", "--json")
    (data,) = json.loads(out)["results"]
    assert data["exact"] is True and data["gap"] == 0.0 and data["slot_size"] is None


def test_tradeoff_says_which_points_are_exact(capsys, tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    argv = ["tradeoff", DEMO, "-m", "rotor", "--from", "12%", "--points", "3", "--json"]
    status, out, _ = run(capsys, *argv, "--csv", table)
    assert status == 0
    rows = json.loads(out)["points"]
    # one coarse table: at 12% of the store-all peak its answer is above its bound; at
    # 56% it reaches its bound (proven optimal); at the store-all peak the answer is
    # store-all itself, whose makespan is the lower bound
    assert [r["exact"] for r in rows] == [False, True, True]
    assert all(r["lower_bound"] <= r["makespan"] for r in rows)
    assert [r["label"] for r in rows] == ["<=15.1%", "optimal", "optimal"]
    assert "label" in table.read_text().splitlines()[0]
    status, out, _ = run(capsys, *argv[:-1])
    assert "~" in out and "rotor: not proven optimal at 1 of 3 budgets; <=15.1%" in out
    status, out, _ = run(capsys, "tradeoff", CHAIN, "-m", "rotor", "--points", "3", "--json")
    assert all(r["exact"] is True and r["gap"] == 0.0 for r in json.loads(out)["points"])


def test_tradeoff_reads_per_budget_exactness(capsys, monkeypatch) -> None:
    """When solvers.Tradeoff carries ``exact`` and ``lower_bounds``, the CLI prints them."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Curve:
        method: str
        budgets: tuple
        makespans: tuple
        solve_time: float
        slot_size: int | None
        exact: tuple
        lower_bounds: tuple

    def fake(problem, budgets, method, **_):
        n = len(budgets)
        return Curve(method, tuple(budgets), (30.0,) * n, 0.0, 4, (True,) + (False,) * (n - 1),
                     (30.0,) + (24.0,) * (n - 1))  # fmt: skip

    monkeypatch.setattr(solvers, "tradeoff", fake)
    status, out, _ = run(capsys, "tradeoff", CHAIN, "-m", "rotor", "--points", "3", "--json")
    rows = json.loads(out)["points"]
    assert [r["exact"] for r in rows] == [True, False, False]
    assert [r["gap"] for r in rows] == [0.0, pytest.approx(0.25), pytest.approx(0.25)]
    status, out, _ = run(capsys, "tradeoff", CHAIN, "-m", "rotor", "--points", "3")
    assert "not proven optimal at 2 of 3 budgets; <=25.0%" in out


# ---------------------------------------------------------------- infeasible without a least budget


def test_infeasible_without_min_budget(capsys, monkeypatch) -> None:
    """checkmate_milp under a time limit may end without a schedule: min_budget None."""
    from dataclasses import replace

    def no_incumbent(chain, budget, **_):
        raise solvers.Infeasible("chen_sqrt", budget, None, "time limit reached without a schedule")

    key = ("chen_sqrt", schedir.Chain)
    entry = replace(solvers.registry._METHODS[key], function=no_incumbent)
    monkeypatch.setitem(solvers.registry._METHODS, key, entry)
    status, out, err = run(capsys, "solve", CHAIN, "-b", "1400", "-m", "chen_sqrt")
    line = one_line_error(err)
    assert status == 1 and "None" not in line and "least" not in line
    assert "chen_sqrt: found no schedule under 1.37 KiB (1400 B) (time limit reached" in line
    assert "chen_sqrt: chen_sqrt" not in line
    status, out, err = run(capsys, "solve", CHAIN, "-b", "1400", "-m", "all")
    assert status == 0 and "no schedule: time limit reached without a schedule" in out
    status, out, err = run(capsys, "solve", CHAIN, "-b", "1400", "-m", "chen_sqrt", "--json")
    (data,) = json.loads(out)["results"]
    assert status == 1 and data["min_budget"] is None and "time limit" in data["detail"]


def test_a_solver_bug_in_a_comparison_keeps_the_table(capsys, monkeypatch) -> None:
    """--method all: a method that crashes is one row (and exit 3), not a lost table."""
    from dataclasses import replace

    def broken(chain, budget, **_):
        raise RuntimeError("revolve returned a schedule the simulator rejects")

    key = ("revolve", schedir.Chain)
    entry = replace(solvers.registry._METHODS[key], function=broken)
    monkeypatch.setitem(solvers.registry._METHODS, key, entry)
    status, out, err = run(capsys, "solve", CHAIN, "-b", "1400", "-m", "all")
    assert status == 3 and "rotor" in out and "internal error: RuntimeError: revolve" in out
    assert "internal error in revolve" in one_line_error(err)
    with pytest.raises(RuntimeError):
        run(capsys, "solve", CHAIN, "-b", "1400", "-m", "all", "--debug")
    status, _, err = run(capsys, "solve", CHAIN, "-b", "1400", "-m", "revolve")
    assert status == 3 and "Traceback" not in err


def test_no_doubled_prefix(capsys, tmp_path: Path) -> None:
    status, _, err = run(capsys, "solve", CHAIN, "-b", "1400", "-o", "model=nope")
    line = one_line_error(err)
    assert status == 2 and "rotor: rotor:" not in line and "rotor" in line
    # solvers that name themselves without a colon: "pipeline_dp needs identical devices"
    path = tmp_path / "p.json"
    schedir.save(pipeline_problem([schedir.Device("d0"), schedir.Device("d1", 2.0)]), path)
    status, _, err = run(capsys, "solve", path, "-b", "4000", "-m", "pipeline_dp")
    line = one_line_error(err)
    assert status == 2 and "schedir: error: pipeline_dp needs identical devices" in line
    status, out, _ = run(capsys, "solve", path, "-b", "4000", "-m", "all")
    assert "pipeline_dp: pipeline_dp" not in out and "pipeline_1f1b: pipeline_1f1b" not in out


def pipeline_problem(devices, training: bool = False) -> schedir.PipelineProblem:
    chain = schedir.load(CHAIN)
    platform = schedir.Platform.fully_connected(devices, 100.0)
    return schedir.PipelineProblem(chain, (10,) * chain.length, platform, 4, training)


def test_pipeline_makespans_are_not_compared_with_one_items_store_all(capsys, tmp_path) -> None:
    """A pipeline's makespan covers its items on several devices; the chain's store-all
    is one item on one device: no overhead against it (it was +414.8%, +195.5% for a
    1F1B step faster than running its 4 micro-batches on one device)."""
    devices = [schedir.Device("d0"), schedir.Device("d1")]
    for training, method in ((False, "pipeline_dp"), (True, "pipeline_1f1b")):
        path = tmp_path / f"p{training}.json"
        schedir.save(pipeline_problem(devices, training), path)
        status, out, err = run(capsys, "solve", path, "-b", "100%", "-m", method, "--json")
        data = json.loads(out)
        assert status == 0, err
        assert data["results"][0]["overhead"] is None and data["store_all"]["makespan"] is None
        assert data["budget"] == data["store_all"]["peak_memory"]  # % budgets still work
        status, out, _ = run(capsys, "solve", path, "-b", "100%", "-m", method)
        assert status == 0 and "vs store-all" not in out
        status, out, _ = run(capsys, "solve", path, "-b", "100%", "-m", "all")
        assert (
            "store-all peak of the chain on one device" in out
            and "%" not in out.split("----\n")[1].split("* fastest")[0]
        )
        status, out, _ = run(capsys, "tradeoff", path, "-m", method, "--points", "2", "--json")
        assert json.loads(out)["store_all"]["makespan"] is None
        assert all(r["overhead"] is None for r in json.loads(out)["points"])


# ---------------------------------------------------------------- internal errors -> exit 2


def test_deeply_nested_json(capsys, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(schedir.InvalidProblem, match="nested too deeply"):
        schedir.load(deep)
    for argv in (["solve", deep, "-b", "1"], ["simulate", CHAIN, deep], ["show", deep]):
        status, _, err = run(capsys, *argv)
        assert status == 2 and "nested too deeply" in one_line_error(err)
    nested = tmp_path / "nested_meta.json"
    meta = "{" + '"a":{' * 50_000 + "}" * 50_000 + "}"
    nested.write_text('{"format": "schedir.schedule", "version": 1, "ops": [], "meta": ' + meta)
    status, _, err = run(capsys, "simulate", CHAIN, nested)
    assert status == 2 and "nested too deeply" in one_line_error(err)


@pytest.mark.parametrize("flag", ["--out", "--plot"])
def test_unwritable_outputs_fail_before_solving(capsys, tmp_path: Path, monkeypatch, flag):
    calls = []
    real = solvers.solve
    monkeypatch.setattr(solvers, "solve", lambda *a, **k: calls.append(a) or real(*a, **k))
    afile = tmp_path / "afile.txt"
    afile.write_text("x")
    suffix = ".json" if flag == "--out" else ".png"
    (tmp_path / f"dir{suffix}").mkdir()
    for target, needle in [
        (tmp_path, "is a directory"),
        (afile / f"below{suffix}", "is not a directory"),
        (tmp_path / f"dir{suffix}", "is a directory"),
    ]:
        status, _, err = run(capsys, "solve", CHAIN, "-b", "1400", flag, target)
        assert status == 2 and needle in one_line_error(err), err
    assert calls == []  # refused before any work


def test_unwritable_tradeoff_outputs(capsys, tmp_path: Path) -> None:
    (tmp_path / "t.csv").mkdir()
    (tmp_path / "t.png").mkdir()
    for flag, target in [("--csv", tmp_path / "t.csv"), ("--plot", tmp_path / "t.png")]:
        status, _, err = run(capsys, "tradeoff", CHAIN, flag, target)
        assert status == 2 and "is a directory" in one_line_error(err)
    status, _, err = run(capsys, "tradeoff", CHAIN, "--csv", tmp_path / "t.txt")
    assert status == 2 and "unknown file type" in one_line_error(err)


def test_show_out_directory_and_profile_out(capsys, tmp_path: Path) -> None:
    sched = tmp_path / "s.json"
    assert run(capsys, "solve", CHAIN, "-b", "1400", "--out", sched)[0] == 0
    status, _, err = run(capsys, "show", sched, "--out", tmp_path)
    assert status == 2 and "is a directory" in one_line_error(err)
    status, _, err = run(capsys, "profile", "--out", tmp_path)
    assert status == 2 and "is a directory" in one_line_error(err)
    afile = tmp_path / "f"
    afile.write_text("x")
    status, _, err = run(capsys, "experiments", "--dir", tmp_path, "--out", afile)
    assert status == 2 and "expected a folder" in one_line_error(err)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["solve", CHAIN, "-b", "1400", "--show", "--width", "0"], "--width"),
        (["solve", CHAIN, "-b", "1400", "--show", "--width", "-3"], "--width"),
        (["show", CHAIN, "--width", "0"], "--width"),
        (["profile", "--batch", "-4"], "--batch"),
        (["profile", "--batch", "0"], "--batch"),
        (["profile", "--depth", "0"], "--depth"),
        (["experiments", "--timeout", "-1"], "--timeout"),
        (["experiments", "--timeout", "nan"], "--timeout"),
        (["tradeoff", CHAIN, "--points", "0"], "--points"),
    ],
)
def test_bad_numeric_flags(capsys, argv, needle) -> None:
    status, _, err = run(capsys, *argv)
    assert status == 2 and needle in one_line_error(err)


def test_schedule_meta_budget_not_a_number(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "s.json"
    bad.write_text(json.dumps({"format": "schedir.schedule", "version": 1,
                               "ops": ["F_all(0)", "Loss()", "B(0)"],
                               "meta": {"budget": "lots", "problem": CHAIN}}))  # fmt: skip
    for argv in (["simulate", CHAIN, bad], ["show", bad]):
        status, _, err = run(capsys, *argv)
        assert status == 2 and "meta.budget = 'lots'" in one_line_error(err)
    with pytest.raises(schedir.InvalidSchedule, match="meta.budget"):
        schedir.Schedule(("Loss()",), {"budget": 1.5})
    with pytest.raises(schedir.InvalidSchedule, match="expected a JSON object"):
        schedir.from_dict({"format": "schedir.schedule", "version": 1, "ops": [], "meta": [1]})


def test_schedule_of_another_problem_kind(capsys, tmp_path: Path) -> None:
    chain = schedir.load(CHAIN)
    graph_schedule = solvers.solve(chain.to_graph(), 1400, "dtr")
    with pytest.raises(schedir.InvalidSchedule, match="graph_schedule.*cannot run on a Chain"):
        schedir.simulate(chain, graph_schedule)
    chain_schedule = solvers.solve(chain, 1400, "rotor")
    with pytest.raises(schedir.InvalidSchedule, match="cannot run on a Graph"):
        schedir.simulate(chain.to_graph(), chain_schedule)
    path = tmp_path / "g.json"
    schedir.save(graph_schedule, path)
    status, _, err = run(capsys, "simulate", CHAIN, path)
    line = one_line_error(err)
    assert status == 2 and "cannot run on a Chain" in line and "--as-graph" in line
    assert run(capsys, "simulate", CHAIN, path, "--as-graph")[0] == 0


def test_overflowing_times_never_print_inf(capsys, tmp_path: Path) -> None:
    d = schedir.load(CHAIN).to_dict()
    d["fwd_time"] = [1e308] * len(d["fwd_time"])
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(d))
    for argv in (
        ["solve", path, "-b", "2KiB"],
        ["solve", path, "-b", "2KiB", "-m", "all", "--json"],
        ["tradeoff", path, "--json"],
    ):
        status, out, err = run(capsys, *argv)
        assert status == 2, (argv, err)
        assert "too large" in one_line_error(err)
        assert not any(word in out for word in ("inf", "Infinity", "NaN", "nan"))
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(d).replace("1e+308", "NaN", 1))
    status, _, err = run(capsys, "solve", nan, "-b", "2KiB")
    assert status == 2 and "NaN" in one_line_error(err)

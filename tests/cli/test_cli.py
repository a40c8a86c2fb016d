"""The ``schedir`` command line: every subcommand, budgets with units, one-line errors.

Most cases call ``schedir_cli.main(argv)`` in process (exit status returned, output
captured); a few run ``python -m schedir_cli`` and the ``schedir`` entry point in a
subprocess to check the real exit codes and that no traceback is printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import schedir
from schedir_cli.app import CLIError, main, parse_budget

ROOT = Path(__file__).resolve().parents[2]
CHAIN = str(ROOT / "examples" / "chain_small.json")
DEMO = str(ROOT / "examples" / "demo_model.json")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("schedir: error: "), err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------- budgets


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1400", 1400),
        ("1400B", 1400),
        ("2KiB", 2048),
        ("2 KiB", 2048),
        ("1.5MiB", 1572864),
        ("2GiB", 2 * 2**30),
        ("1TiB", 2**40),
        ("3kB", 3000),
        ("2GB", 2 * 10**9),
        ("2gib", 2 * 2**30),
        ("1e3", 1000),
        ("50%", 815),
        ("100%", 1630),
        ("12.5%", 203),
    ],
)
def test_parse_budget(text: str, expected: int) -> None:
    assert parse_budget(text, lambda: 1630) == expected


@pytest.mark.parametrize("text", ["2XB", "abc", "", "-5", "1.2.3GiB", "5 % %", "GiB"])
def test_parse_budget_rejects(text: str) -> None:
    with pytest.raises(CLIError) as info:
        parse_budget(text, lambda: 1630)
    assert info.value.status == 2


# ---------------------------------------------------------------- solve


def test_solve_rotor(capsys) -> None:
    status, out, _ = run(capsys, "solve", CHAIN, "--budget", "1400", "--method", "rotor")
    assert status == 0
    assert "makespan  25 s (+13.6% vs store-all 22 s)" in out
    assert "peak      1.30 KiB (1330 B)" in out
    assert "solve" in out


def test_solve_percent_and_json(capsys) -> None:
    status, out, _ = run(capsys, "solve", CHAIN, "-b", "75%", "-m", "recompute_all", "--json")
    assert status == 0
    data = json.loads(out)
    assert data["budget"] == 1222 and data["store_all"]["peak_memory"] == 1630
    (result,) = data["results"]
    assert result["method"] == "recompute_all" and result["status"] == "ok"
    assert result["peak_memory"] <= 1222 and result["label"] == "fixed"
    status, out, err = run(capsys, "solve", CHAIN, "-b", "50%", "--json")
    assert status == 1 and json.loads(out)["results"][0]["min_budget"] == 1140
    assert "no schedule fits 815 B" in one_line_error(err)


def test_solve_all_table(capsys) -> None:
    import solvers

    status, out, _ = run(capsys, "solve", CHAIN, "--budget", "80%", "--method", "all")
    assert status == 0
    for method in solvers.available(schedir.load(CHAIN)):
        assert method.name in out
    assert "infeasible" in out  # store_all does not fit 80% of its own peak
    assert "*" in out.split("rotor")[1].splitlines()[0]  # rotor is the fastest


def test_solve_all_json(capsys) -> None:
    status, out, _ = run(capsys, "solve", CHAIN, "-b", "1000", "-m", "all", "--json")
    data = json.loads(out)
    statuses = {r["method"]: r["status"] for r in data["results"]}
    assert statuses["store_all"] == "infeasible"
    assert status == (0 if "ok" in statuses.values() else 1)


def test_solve_all_on_graph(capsys, tmp_path: Path) -> None:
    graph = tmp_path / "g.json"
    schedir.save(schedir.load(CHAIN).to_graph(), graph)
    status, out, _ = run(capsys, "solve", graph, "-b", "90%", "-m", "all", "--json")
    assert status == 0
    data = json.loads(out)  # solver chatter (HiGHS) must not pollute stdout
    assert data["kind"] == "graph" and {r["method"] for r in data["results"]} >= {"dtr"}


def test_solve_out_show_simulate(capsys, tmp_path: Path) -> None:
    sched = tmp_path / "sched" / "s.json"
    png, svg = tmp_path / "s.png", tmp_path / "s.svg"
    status, out, _ = run(
        capsys, "solve", CHAIN, "-b", "1.37KiB", "--out", sched, "--plot", png, "--show"
    )
    assert status == 0 and sched.is_file() and png.stat().st_size > 5000
    assert "compute |" in out and "memory |" in out
    schedule = schedir.load(sched)
    assert Path(schedule.meta["problem"]).name == "chain_small.json"
    assert schedule.meta["budget"] == 1402
    status, out, _ = run(capsys, "show", sched, "--out", svg)  # problem from the meta
    assert status == 0 and "<svg" in svg.read_text()[:500]
    assert out.splitlines()[0].startswith("rotor, 15 ops: makespan 25 s")
    status, out, _ = run(capsys, "simulate", CHAIN, sched)
    assert status == 0 and "makespan  25 s" in out and "fits" in out
    status, out, _ = run(capsys, "simulate", CHAIN, sched, "--json", "--trace")
    data = json.loads(out)
    assert data["makespan"] == 25.0 and len(data["trace"]["start"]) == data["ops"]


def test_outputs_into_new_folders_say_they_created_them(capsys, tmp_path: Path) -> None:
    """Each output flag may name folders that do not exist: created, said on stderr
    (stdout stays one JSON object with --json), once per folder."""
    sched, png = tmp_path / "a" / "b" / "s.json", tmp_path / "c" / "s.png"
    argv = ["solve", CHAIN, "-b", "1400", "--out", sched, "--plot", png, "--json"]
    status, out, err = run(capsys, *argv)
    assert status == 0 and json.loads(out)["results"][0]["status"] == "ok"
    assert err.splitlines() == [f"schedir: created folder {sched.parent}",
                                f"schedir: created folder {png.parent}"]  # fmt: skip
    status, _, err = run(capsys, *argv)  # the folders exist now: nothing to say
    assert status == 0 and err == ""
    table = tmp_path / "d" / "t.csv"
    status, out, err = run(
        capsys, "tradeoff", CHAIN, "-m", "rotor", "--points", "2", "--csv", table
    )
    assert status == 0 and table.is_file() and f"created folder {table.parent}" in err


def test_show_graph_schedule(capsys, tmp_path: Path) -> None:
    graph = tmp_path / "g.json"
    schedir.save(schedir.load(CHAIN).to_graph(), graph)
    sched = tmp_path / "g_sched.json"
    assert run(capsys, "solve", graph, "-b", "1400", "-m", "dtr", "--out", sched)[0] == 0
    status, out, _ = run(capsys, "show", sched, "--problem", graph, "--out", tmp_path / "g.png")
    assert status == 0 and "F=forward" in out and (tmp_path / "g.png").is_file()


def test_tradeoff(capsys, tmp_path: Path) -> None:
    png, table = tmp_path / "t.png", tmp_path / "t.csv"
    argv = ["tradeoff", CHAIN, "--points", "5", "--plot", png, "--csv", table]
    status, out, _ = run(capsys, *argv)
    assert status == 0 and png.stat().st_size > 5000
    lines = table.read_text().splitlines()
    assert lines[0] == "budget,method,makespan,overhead,label,exact,fixed,lower_bound,gap"
    assert len(lines) == 1 + 5 * 5
    assert "+0.0%" in out and "rotor" in out
    status, out, _ = run(capsys, "tradeoff", CHAIN, "-m", "rotor", "--points", "3", "--json")
    points = json.loads(out)["points"]
    assert [r["budget"] for r in points] == [1140, 1385, 1630]
    assert points[-1]["overhead"] == 0.0


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "argv, status, needle",
    [
        (["solve", CHAIN, "-b", "900"], 1, "the least is 1.11 KiB (1140 B)"),
        (["solve", CHAIN, "-b", "2XB"], 2, "unknown unit 'XB'"),
        (["solve", CHAIN, "-b", "2KiB", "-m", "nope"], 2, "unknown method 'nope'"),
        (["solve", "/no/such.json", "-b", "1"], 2, "no such file"),
        (["solve", CHAIN, "-b", "1400", "-o", "model=nope"], 2, "rotor"),
        (["solve", CHAIN, "-b", "1400", "-o", "nokey"], 2, "KEY=VALUE"),
        (["solve", CHAIN, "-b", "1400", "--plot", "x.gif"], 2, "unknown file type"),
        (["solve", CHAIN, "-b", "1400", "-m", "all", "--out", "x.json"], 2, "one method"),
        (["solve", CHAIN], 2, "--budget"),
        (["frobnicate"], 2, "invalid choice"),
        (["tradeoff", CHAIN, "-m", "nope"], 2, "unknown method"),
        (["tradeoff", CHAIN, "--points", "1"], 2, "at least 2 budgets"),
        (["tradeoff", CHAIN, "--from", "1600", "--to", "1200"], 2, "empty budget range"),
        (["profile", "--model", "nope"], 2, "unknown model 'nope'"),
        (["experiments", "nope"], 2, "unknown experiment 'nope'"),
    ],
)
def test_errors_are_one_line(capsys, argv, status, needle) -> None:
    got, out, err = run(capsys, *argv)
    assert got == status, err
    assert needle in one_line_error(err)


def test_bad_files(capsys, tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"format": "something.else"}))
    bad_chain = tmp_path / "bad_chain.json"
    d = json.loads(Path(CHAIN).read_text())
    d["in_size"][2] = -5
    bad_chain.write_text(json.dumps(d))
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    bad_sched = tmp_path / "bad_sched.json"
    bad_sched.write_text(json.dumps({"format": "schedir.schedule", "version": 1,
                                     "ops": ["F_ck(0)", "B(0)"]}))  # fmt: skip
    cases = [
        (["solve", bad_json, "-b", "1"], "not valid JSON"),
        (["solve", wrong, "-b", "1"], "something.else"),
        (["solve", bad_chain, "-b", "1"], "in_size[2]"),
        (["solve", binary, "-b", "1"], "bin.json"),
        (["simulate", CHAIN, bad_sched], "invalid schedule: op 1: B(0)"),
        (["simulate", CHAIN, CHAIN], "expected a schedule"),
        (["simulate", bad_sched, bad_sched], "expected a problem"),
        (["show", bad_sched], "pass --problem"),
        (["show", bad_sched, "--problem", CHAIN], "invalid schedule"),
    ]
    for argv, needle in cases:
        status, _, err = run(capsys, *argv)
        assert status == 2, (argv, err)
        assert needle in one_line_error(err), (argv, err)


def test_debug_shows_traceback(capsys) -> None:
    with pytest.raises(CLIError):
        main(["solve", CHAIN, "-b", "2XB", "--debug"])


def test_subprocess_exit_codes_and_entry_point() -> None:
    """The real process: ``python -m schedir_cli`` and the installed ``schedir`` script."""
    bad = subprocess.run(
        [sys.executable, "-m", "schedir_cli", "solve", CHAIN, "-b", "2 furlongs"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "unknown unit 'furlongs'" in bad.stderr
    script = Path(sys.executable).parent / "schedir"
    exe = [str(script)] if script.exists() else [sys.executable, "-m", "schedir_cli"]
    missing = subprocess.run(exe + ["simulate", CHAIN, "/no/such.json"], capture_output=True,
                             text=True)  # fmt: skip
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "Traceback" not in missing.stderr  # exit status 1 (infeasible): tested in process


def test_import_schedir_stays_light() -> None:
    code = (
        "import schedir, schedir_cli, schedir.render, schedir_cli.report, sys; "
        "heavy = [m for m in ('solvers', 'jax', 'flax', 'cvxpy', 'matplotlib') "
        "if m in sys.modules]; assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ---------------------------------------------------------------- profile, experiments


def test_profile_small_model(capsys, tmp_path: Path) -> None:
    out = tmp_path / "mlp.json"
    argv = ["profile", "--model", "mlp", "--depth", "1", "--batch", "4", "--out", out]
    status, text, _ = run(capsys, *argv)
    assert status == 0 and "3 stages" in text
    chain = schedir.load(out)
    assert chain.length == 3 and chain.in_size[0] == 0  # the batch is an argument
    status, text, _ = run(capsys, "solve", out, "-b", "100%")
    assert status == 0


def test_shipped_demo_model_solves(capsys) -> None:
    status, out, _ = run(capsys, "solve", DEMO, "--budget", "50%", "--method", "all")
    assert status == 0 and "rotor" in out and out.count("\n") >= 8


FAKE = """
import argparse, csv, pathlib, sys
p = argparse.ArgumentParser(); p.add_argument("--quick", action="store_true")
p.add_argument("--out"); a = p.parse_args()
out = pathlib.Path(a.out); out.mkdir(parents=True, exist_ok=True)
if "{name}" == "broken":
    print("something went wrong"); sys.exit(3)
with open(out / "{name}.csv", "w") as f:
    w = csv.writer(f); w.writerow(["n", "value", "quick"])
    for i in range(40): w.writerow([i, i / 3, a.quick])
(out / "{name}.png").write_bytes(b"\\x89PNG fake")
"""


def test_experiments_report(capsys, tmp_path: Path) -> None:
    exp = tmp_path / "exps"
    exp.mkdir()
    for name in ("alpha", "broken", "_helper"):
        (exp / f"{name}.py").write_text(f'"""The {name} experiment."""\n' + FAKE.format(name=name))
    results = tmp_path / "results"
    argv = ["experiments", "--quick", "--dir", exp, "--out", results]
    status, out, err = run(capsys, *argv)
    assert status == 1 and "failed: broken" in out  # one experiment failed
    assert "2/2" in err  # progress
    report = (results / "REPORT.md").read_text()
    assert "_helper" not in report
    assert "python exps/alpha.py --quick --out results/alpha" in report
    assert "![alpha](alpha/alpha.png)" in report
    assert "| n | value | quick |" in report and "| 0 | 0 | True |" in report
    assert "first 25 of 40 rows" in report and "The alpha experiment." in report
    assert "**Failed** (status 3)" in report and "something went wrong" in report
    status, out, _ = run(capsys, "experiments", "--dir", exp, "--out", results, "alpha")
    assert status == 0 and "--quick" not in (results / "REPORT.md").read_text()


@pytest.mark.slow
def test_all_experiments_quick_report(tmp_path: Path) -> None:
    """``schedir experiments --quick`` end to end: every PNG is embedded in the report."""
    proc = subprocess.run(
        [sys.executable, "-m", "schedir_cli", "experiments", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "REPORT.md").read_text()
    pngs = sorted(tmp_path.glob("*/*.png"))
    assert pngs
    for png in pngs:
        assert f"]({png.parent.name}/{png.name})" in report

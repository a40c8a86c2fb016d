"""The command line as a newcomer meets it (issue 11): help, version, the methods listing,
solver options with ``--method all``, a chain solved with graph methods, experiments
from any folder, quiet solvers, plot units, and README's claims about the scripts.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import run

import schedir
import solvers
from schedir_cli.common import kind_name

ROOT = Path(__file__).resolve().parents[2]
CHAIN = str(ROOT / "examples" / "chain_small.json")


def test_no_command_prints_the_help(capsys) -> None:
    status, out, err = run(capsys)
    assert status == 0 and err == ""
    assert out.startswith("usage: schedir") and "solve" in out and "methods" in out


def test_version(capsys) -> None:
    status, out, _ = run(capsys, "--version")
    assert status == 0 and out.strip() == f"schedir {schedir.__version__}"
    status, out, _ = run(capsys, "solve", "--help")
    assert status == 0 and "--as-graph" in out


def test_methods_lists_kind_exactness_and_options(capsys) -> None:
    status, out, _ = run(capsys, "methods")
    assert status == 0
    for m in solvers.available():
        assert m.name in out
    assert "\nchain:" in out and "\ngraph:" in out  # kind names, as everywhere
    assert "model='tight'" in out  # rotor's option and its default
    # a long name (everything_saveable) keeps its column: name, then the label
    for m in solvers.available():
        line = next(li for li in out.splitlines() if li.split()[:1] == [m.name])
        assert line.split()[1] in ("optimal", "fixed", "heuristic"), line
    status, out, _ = run(capsys, "methods", CHAIN, "--json")
    data = json.loads(out)
    assert data["kind"] == "chain" and {m["kind"] for m in data["methods"]} == {"chain"}
    rotor = next(m for m in data["methods"] if m["method"] == "rotor")
    assert rotor["exact"] is True and rotor["options"]["model"] == "tight"
    assert rotor["label"] == "optimal"
    status, out, _ = run(capsys, "methods", CHAIN, "--as-graph", "--json")
    assert "checkmate_milp" in {m["method"] for m in json.loads(out)["methods"]}


def test_fixed_schedules_are_labelled_alike(capsys) -> None:
    """store-all, recompute-all and JAX's checkpoint policies are each one schedule
    whatever the budget: ``fixed`` in the listing, the tables and the answers (never
    ``optimal``, whatever their solvers' own exact flag says)."""
    fixed = {(m.name, kind_name(m.problem)) for m in solvers.available() if m.fixed}
    assert {("store_all", "chain"), ("store_all", "graph"), ("recompute_all", "chain")} <= fixed
    assert {("nothing_saveable", "blocks"), ("everything_saveable", "blocks")} <= fixed
    status, out, _ = run(capsys, "methods", "--json")
    labels = {(m["method"], m["kind"]): m["label"] for m in json.loads(out)["methods"]}
    assert all(labels[key] == "fixed" for key in fixed)
    status, out, _ = run(capsys, "solve", CHAIN, "-b", "100%", "-m", "all", "--json")
    rows = {r["method"]: r for r in json.loads(out)["results"]}
    assert rows["store_all"]["label"] == "fixed" and rows["store_all"]["exact"] is False
    assert rows["rotor"]["label"] == "optimal" and rows["rotor"]["exact"] is True
    status, out, _ = run(capsys, "solve", CHAIN, "-b", "100%", "-m", "all")
    assert out.split("\nstore_all")[1].split()[0] == "fixed"
    # the flag is true: one schedule whatever the budget (here the chain's and its graph's)
    chain = schedir.load(CHAIN)
    for problem in (chain, chain.to_graph()):
        for m in solvers.available(problem):
            if m.fixed:
                roomy = solvers.solve(problem, 10**9, m.name)
                tight = solvers.solve(problem, roomy.meta["peak_memory"], m.name)
                assert tight.ops == roomy.ops, m.name


def test_options_with_method_all(capsys) -> None:
    argv = ["solve", CHAIN, "-b", "1400", "-m", "all", "--json", "-o", "segments=2"]
    status, out, _ = run(capsys, *argv)
    rows = {r["method"]: r for r in json.loads(out)["results"]}
    assert status == 0 and rows["chen_sqrt"]["options"] == {"segments": 2}
    assert rows["rotor"]["options"] == {}
    status, out, err = run(capsys, "solve", CHAIN, "-b", "1400", "-m", "all", "-o", "nope=1")
    assert status == 2 and "option 'nope' is not taken by any of" in err and "rotor:" in err
    status, out, err = run(capsys, "solve", CHAIN, "-b", "1400", "-o", "segments=2")
    assert status == 2 and "option 'segments' is not taken by rotor" in err


def test_a_chain_with_graph_methods(capsys, tmp_path: Path) -> None:
    sched = tmp_path / "g.json"
    argv = ["solve", CHAIN, "-b", "1400", "--as-graph", "-m", "dtr", "--out", sched]
    status, out, _ = run(capsys, *argv)
    assert status == 0 and "as a graph" in out
    assert schedir.load(sched).meta["as_graph"] is True
    assert run(capsys, "simulate", CHAIN, sched)[0] == 0  # the meta says: on the graph
    status, out, _ = run(capsys, "show", sched)
    assert status == 0 and "F=forward" in out
    status, out, err = run(capsys, "solve", CHAIN, "-b", "1400", "-m", "checkmate_milp")
    assert status == 2 and "--as-graph" in err
    status, out, _ = run(capsys, "solve", CHAIN, "-b", "90%", "--as-graph", "-m", "all", "--json")
    assert status == 0 and json.loads(out)["kind"] == "graph"
    # overheads against the chain's store-all, as in the chain methods' table (the
    # graph's own store_all, 29.2 s here, runs a recording forward twice: +33.0%)
    data, chain = json.loads(out), schedir.load(CHAIN)
    peak = data["store_all"]["peak_memory"]
    assert data["as_graph"] is True
    assert data["store_all"] == {"makespan": chain.store_all_time(), "peak_memory": peak}
    rows = {r["method"]: r for r in data["results"]}
    graph_store_all = chain.to_graph().store_all_time()
    assert rows["dtr"]["overhead"] == pytest.approx(
        rows["dtr"]["makespan"] / chain.store_all_time() - 1
    )
    status, out, _ = run(capsys, "solve", CHAIN, "-b", "100%", "--as-graph", "-m", "store_all")
    assert "vs store-all of the chain 22 s" in out and graph_store_all > chain.store_all_time()
    status, out, _ = run(capsys, "tradeoff", CHAIN, "--as-graph", "-m", "dtr", "--points", "2")
    assert "overhead vs store-all of the chain 22 s" in out


def test_experiments_from_any_folder(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    status, _, err = run(capsys, "experiments", "no_such_experiment")
    assert status == 2 and "known: " in err and "remat_tradeoff" in err
    status, _, err = run(capsys, "experiments", "remat_tradeoff", "--quick", "--out", "exp")
    assert status == 0, err
    assert (tmp_path / "exp" / "REPORT.md").is_file() and (
        tmp_path / "exp" / "remat_tradeoff"
    ).is_dir()


def test_no_solver_banner_unless_verbose(tmp_path: Path) -> None:
    """HiGHS prints a banner on its first use in a process: a fresh process each time."""
    graph = tmp_path / "g.json"
    schedir.save(schedir.load(CHAIN).to_graph(), graph)
    argv = [sys.executable, "-m", "schedir_cli", "solve", str(graph), "-b", "1400", "-m",
            "checkmate_milp"]  # fmt: skip
    quiet = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert quiet.returncode == 0, quiet.stderr
    assert "HiGHS" not in quiet.stdout + quiet.stderr
    verbose = subprocess.run([*argv, "--verbose"], capture_output=True, text=True, cwd=ROOT)
    assert "HiGHS" not in verbose.stdout  # solvers are quiet; a banner would go to stderr


def _labels(monkeypatch) -> list[str]:
    """Axis labels of every figure saved while the fixture is active."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    labels: list[str] = []
    real = Figure.savefig

    def save(self, *a, **k):
        labels.extend(t for ax in self.axes for t in (ax.get_xlabel(), ax.get_ylabel()) if t)
        return real(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", save)
    return labels


def test_plot_axes_fit_the_numbers(capsys, tmp_path: Path, monkeypatch) -> None:
    labels = _labels(monkeypatch)
    demo = ROOT / "examples" / "demo_model.json"  # milliseconds, hundreds of MiB
    assert run(capsys, "solve", demo, "-b", "50%", "--plot", tmp_path / "s.png")[0] == 0
    assert "time (ms)" in labels and "memory (MiB)" in labels
    labels.clear()
    assert run(capsys, "tradeoff", CHAIN, "--points", "3", "--plot", tmp_path / "t.png")[0] == 0
    assert "memory budget (KiB)" in labels  # 1.1 to 1.6 KiB, not 0.001 MiB


@pytest.mark.slow
def test_demo_prints_mib_and_the_median_of_its_runs(tmp_path: Path) -> None:
    """`make demo` (quick): one unit (MiB, as the CLI), the measured time is the median
    of repeated runs and says so, every schedule's gradients match plain autodiff."""
    argv = [sys.executable, "examples/demo.py", "--quick", "--out", str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "MiB" in out and " MB" not in out and "median of 2 runs" in out
    rows = [line.split() for line in out.splitlines() if line.split()[-1:] in (["ok"], ["FAIL"])]
    assert rows and all(row[-1] == "ok" for row in rows)
    assert (tmp_path / "memory_rotor.png").is_file()


def test_readme_opens_with_make_demo_and_make_test() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndemo:" in makefile and "\ntest:" in makefile


def _flags(script: Path) -> set[str]:
    """The option strings a script's argparse declares (add_argument("--x", ...))."""
    flags = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    return flags


def test_readme_says_which_scripts_take_quick_and_out() -> None:
    """README's table of scripts says, for each script of examples/ and benchmarks/,
    whether it takes ``--quick`` and ``--out``; every experiment takes both."""
    section = (ROOT / "README.md").read_text().split("## Scripts", 1)[1].split("\n## ")[0]
    said = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[0].endswith(".py`"):
            said[cells[0].strip("`")] = cells[1].startswith("yes")
    scripts = sorted(
        f"{folder}/{p.name}"
        for folder in ("examples", "benchmarks")
        for p in (ROOT / folder).glob("*.py")
    )
    assert sorted(said) == scripts
    for script, takes in said.items():
        assert takes == ({"--quick", "--out"} <= _flags(ROOT / script)), script
    for script in (ROOT / "paper_experiments").glob("*.py"):
        if not script.name.startswith("_"):
            assert {"--quick", "--out"} <= _flags(script), script.name

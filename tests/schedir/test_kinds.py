"""Every problem kind through the same calls: the kind registry, JSON, simulate, judge,
render and the CLI's ``simulate`` / ``show`` (save -> load -> simulate -> show)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import schedir
from schedir import Chain, Device, Platform, kind
from schedir.pipeline.baselines import one_f_one_b_ops
from schedir.pipeline.problem import Interval, Mapping, PipelineProblem
from schedir_cli import main

ROOT = Path(__file__).resolve().parents[2]


def small_chain() -> Chain:
    return Chain.from_rotor(
        [1.0, 2.0, 1.0], [1.0, 2.0, 2.0, 0.5], [8, 8, 8, 4], [0, 16, 16, 8], [1, 2, 1], [0, 2, 1, 1]
    )


def chain_case():
    chain = small_chain()
    ops = ["F_ck(0)", "F_all(1)", "F_all(2)", "Loss()", "B(2)", "B(1)", "F_all(0)", "B(0)"]
    return chain, schedir.Schedule(tuple(ops), {"budget": 1000}), ["compute"]


def graph_case():
    chain = small_chain()
    ops = ["F_all(0)", "F_all(1)", "F_all(2)", "Loss()", "B(2)", "B(1)", "B(0)"]
    graph = chain.to_graph()
    return graph, schedir.GraphSchedule(schedir.chain_ops_to_graph(chain, ops)), ["compute"]


def offload_case():
    chain = Chain.from_rotor([1.0], [2.0, 0.5], [4, 8], [0, 12], [0], [0, 0])
    problem = schedir.OffloadProblem(chain, Platform.host_offload(4.0))
    ops = ["Offload(a[0])", "F_all(0)", "Wait(a[0])", "Prefetch(a[0])", "Loss()", "Wait(a[0])",
           "B(0)"]  # fmt: skip
    return problem, schedir.OffloadSchedule(tuple(ops), {"budget": 100}), ["compute", "d2h", "h2d"]


def pipeline_case():
    devs = [Device("gpu0", 1.0, None), Device("gpu1", 1.0, None)]
    problem = PipelineProblem(
        small_chain(), (1, 1, 1), Platform.fully_connected(devs, 8.0), 4, training=True
    )
    mapping = Mapping((Interval(0, 1, ("gpu0",)), Interval(1, 3, ("gpu1",))))
    return problem, one_f_one_b_ops(problem, mapping), ["gpu0", "gpu1", "gpu0->gpu1", "gpu1->gpu0"]


CASES = {"chain": chain_case, "graph": graph_case, "offload": offload_case,
         "pipeline": pipeline_case}  # fmt: skip


def test_every_kind_is_registered_once_with_its_formats() -> None:
    names = [k.name for k in kind.kinds()]
    assert set(CASES) <= set(names) and len(names) == len(set(names))
    for name, case in CASES.items():
        problem, schedule, _ = case()
        assert kind.of(problem).name == name and kind.of(type(schedule)).name == name
        assert kind.format_class(problem.to_dict()["format"]) is type(problem)
        assert kind.format_class(schedule.to_dict()["format"]) is type(schedule)
        assert isinstance(schedule, schedir.Schedule)


@pytest.mark.parametrize("name", sorted(CASES))
def test_save_load_simulate_judge_render(name: str, tmp_path: Path) -> None:
    problem, schedule, lanes = CASES[name]()
    schedir.save(problem, tmp_path / "p.json")
    schedir.save(schedule, tmp_path / "s.json")
    problem2, schedule2 = schedir.load(tmp_path / "p.json"), schedir.load(tmp_path / "s.json")
    assert schedule2 == schedule and type(problem2) is type(problem)
    trace = schedir.simulate(problem2, schedule2)
    assert trace.peak_memory == schedir.simulate(problem, schedule).peak_memory
    budget = None if kind.of(problem).budget != "required" else 10**6
    assert schedir.simulate.__module__ == "schedir.simulate"
    from schedir.simulate import judge

    assert judge(problem2, trace, budget)["peak_memory"] == trace.peak_memory
    from schedir import render

    drawn = render.lanes(problem2, schedule2, trace)
    assert list(drawn) == lanes and all(drawn.values())


@pytest.mark.parametrize("name", sorted(CASES))
def test_cli_simulate_and_show(name: str, tmp_path: Path, capsys) -> None:
    problem, schedule, lanes = CASES[name]()
    schedir.save(problem, tmp_path / "p.json")
    schedir.save(schedule, tmp_path / "s.json")
    p, s = str(tmp_path / "p.json"), str(tmp_path / "s.json")
    assert main(["simulate", p, s]) == 0
    out = capsys.readouterr().out
    assert f"{len(schedule)} ops" in out and "makespan" in out and "peak" in out
    assert main(["show", s, "--problem", p, "--width", "60"]) == 0
    rows = capsys.readouterr().out.splitlines()
    drawn = [r.split("|")[0].strip() for r in rows if "|" in r]
    assert drawn[: len(lanes)] == lanes


def test_a_schedule_of_another_kind_is_refused_by_name() -> None:
    chain, chain_schedule, _ = chain_case()
    pipeline, pipeline_schedule, _ = pipeline_case()
    with pytest.raises(schedir.InvalidSchedule, match="PipelineSchedule.*cannot run on a Chain"):
        schedir.simulate(chain, pipeline_schedule)
    with pytest.raises(schedir.InvalidSchedule, match="cannot run on a PipelineProblem"):
        schedir.simulate(pipeline, chain_schedule)


def test_chain_to_graph_is_the_registered_reduction() -> None:
    chain = small_chain()
    assert kind.convert(chain, "graph") == chain.to_graph() == schedir.chain_to_graph(chain)
    assert kind.convert(chain, "chain") is chain
    with pytest.raises(TypeError, match="no reduction chain -> pipeline"):
        kind.convert(chain, "pipeline")


def test_register_refuses_a_format_tag_of_another_kind() -> None:
    chain_kind = kind.get("chain")
    clash = kind.Kind("clash", dict, (dict,), {"schedir.chain": schedir.Graph}, print, None, print)
    try:
        with pytest.raises(ValueError, match="'schedir.chain' is chain's"):
            kind.register(clash)
    finally:
        if "clash" in [k.name for k in kind.kinds()]:
            kind.unregister("clash")
    assert kind.get("chain") is chain_kind and "clash" not in [k.name for k in kind.kinds()]


def test_ir_core_imports_no_application_and_no_heavy_library() -> None:
    """No module of schedir imports solvers, jax_exec, the command line or jax/flax/cvxpy."""
    code = (
        "import sys, pkgutil, importlib, schedir\n"
        "for m in pkgutil.walk_packages(schedir.__path__, 'schedir.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('solvers', 'jax_exec', 'schedir_cli', 'jax', 'flax', 'cvxpy', 'matplotlib')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _schedir_imports() -> dict[str, set[str]]:
    """Module -> the schedir modules it imports (anywhere in it, lazy imports too)."""
    import ast

    files = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (ROOT / "schedir").rglob("*.py")
    }
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found |= (
                {next(t for t in targets if t in files)}
                if any(t in files for t in targets)
                else set()
            )
        edges[name] = found - {name}
    return edges


def test_no_import_cycle_between_modules_of_the_ir() -> None:
    """Strongly connected components of schedir's module imports (package __init__
    files hand names on and are left out: every module imports its parents)."""
    edges = {
        m: {t for t in ts if not (ROOT / t.replace(".", "/") / "__init__.py").exists()}
        for m, ts in _schedir_imports().items()
        if not (ROOT / m.replace(".", "/") / "__init__.py").exists()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_a_message_beyond_the_chain_is_an_invalid_schedule(tmp_path: Path, capsys) -> None:
    """Regression: Send(a9, ...) on a 3-stage chain raised IndexError (exit 3 in the CLI)."""
    problem, _, _ = pipeline_case()
    bad = schedir.PipelineSchedule((("gpu0", ("F(0:3,0)", "Send(a9,0,gpu1)")),))
    with pytest.raises(schedir.InvalidSchedule, match=r"Send\(a9,0,gpu1\): index 9 out of range"):
        schedir.simulate(problem, bad)
    schedir.save(problem, tmp_path / "p.json")
    schedir.save(bad, tmp_path / "s.json")
    assert main(["simulate", str(tmp_path / "p.json"), str(tmp_path / "s.json")]) == 2
    assert "index 9 out of range 0..3" in capsys.readouterr().err

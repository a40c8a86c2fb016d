"""Every ``--json`` answer follows its versioned record (schedir_cli/schema.py), the
records are the tables of docs/formats.md#command-line-answers, and the labels of the
JSON answers are the words of the text output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_cli import run

import schedir
from schedir_cli import schema
from schedir_cli.schema import check

ROOT = Path(__file__).resolve().parents[2]
CHAIN = str(ROOT / "examples" / "chain_small.json")
DEMO = str(ROOT / "examples" / "demo_model.json")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Problems of several kinds and a schedule written by ``solve --out``."""
    tmp = tmp_path_factory.mktemp("json")
    chain = schedir.load(CHAIN)
    paths = {"graph": tmp / "graph.json", "pipeline": tmp / "pipeline.json"}
    schedir.save(chain.to_graph(), paths["graph"])
    devices = [schedir.Device("d0"), schedir.Device("d1")]
    platform = schedir.Platform.fully_connected(devices, 100.0)
    schedir.save(
        schedir.PipelineProblem(chain, (10,) * chain.length, platform, 4), paths["pipeline"]
    )
    schedule = tmp / "rotor.json"
    from schedir_cli import main

    assert main(["solve", CHAIN, "-b", "1400", "--out", str(schedule), "-q"]) == 0
    return {**{k: str(v) for k, v in paths.items()}, "schedule": str(schedule)}


# (argv, expected exit status): every command that answers --json, each status of a
# result, every problem kind the bundled files reach
CASES = {
    "solve one": (["solve", CHAIN, "-b", "1400"], 0),
    "solve infeasible": (["solve", CHAIN, "-b", "900"], 1),
    "solve bad option": (["solve", CHAIN, "-b", "1400", "-m", "all", "-o", "segments=0"], 0),
    "solve all": (["solve", CHAIN, "-b", "80%", "-m", "all"], 0),
    "solve discretized": (["solve", DEMO, "-b", "30%", "-m", "all"], 0),
    "solve as graph": (["solve", CHAIN, "-b", "90%", "--as-graph", "-m", "dtr"], 0),
    "solve graph": (["solve", "{graph}", "-b", "100%", "-m", "store_all"], 0),
    "solve pipeline": (["solve", "{pipeline}", "-b", "100%", "-m", "pipeline_dp"], 0),
    "simulate": (["simulate", CHAIN, "{schedule}"], 0),
    "simulate trace": (["simulate", CHAIN, "{schedule}", "--trace"], 0),
    "tradeoff": (["tradeoff", CHAIN, "--points", "3"], 0),
    "tradeoff pipeline": (["tradeoff", "{pipeline}", "-m", "pipeline_dp", "--points", "2"], 0),
    "methods": (["methods"], 0),
    "methods of a problem": (["methods", CHAIN, "--as-graph"], 0),
}


@pytest.mark.parametrize("case", CASES)
def test_every_json_answer_follows_its_record(capsys, files, case) -> None:
    argv, want = CASES[case]
    status, out, err = run(capsys, *[a.format(**files) for a in argv], "--json")
    assert status == want, err
    answer = json.loads(out)  # one object on stdout, whatever stderr says
    check(answer)
    assert answer["format"] == f"schedir.cli.{argv[0]}" and answer["version"] == 1
    if case == "solve bad option":  # one row of each status but internal
        statuses = {r["status"] for r in answer["results"]}
        assert statuses == {"ok", "infeasible", "error"}


def test_one_method_and_all_methods_answer_one_shape(capsys) -> None:
    one = json.loads(run(capsys, "solve", CHAIN, "-b", "1400", "--json")[1])
    every = json.loads(run(capsys, "solve", CHAIN, "-b", "1400", "-m", "all", "--json")[1])
    assert one.keys() == every.keys() and len(one["results"]) == 1
    rotor = next(r for r in every["results"] if r["method"] == "rotor")
    assert one["results"][0].keys() == rotor.keys()
    assert {k: v for k, v in rotor.items() if k != "solve_time"} == {
        k: v for k, v in one["results"][0].items() if k != "solve_time"
    }


def test_kind_names_are_the_text_outputs(capsys, files) -> None:
    for path, kind in (
        (CHAIN, "chain"),
        (files["graph"], "graph"),
        (files["pipeline"], "pipeline"),
    ):
        text = run(capsys, "methods", path)[1]
        assert f"({kind}, " in text.splitlines()[0] and f"\n{kind}:" in text
        data = json.loads(run(capsys, "methods", path, "--json")[1])
        assert data["kind"] == kind and {m["kind"] for m in data["methods"]} == {kind}


def test_labels_of_the_table_are_those_of_the_json(capsys) -> None:
    """Per method, the word of the ``--method all`` table is the JSON answer's label."""
    for path, budget in ((CHAIN, "80%"), (CHAIN, "100%"), (DEMO, "30%"), (DEMO, "50%")):
        argv = ["solve", path, "-b", budget, "-m", "all"]
        table = run(capsys, *argv)[1]
        rows = json.loads(run(capsys, *argv, "--json")[1])["results"]
        for r in rows:
            line = next(li for li in table.splitlines() if li.split()[:1] == [r["method"]])
            if r["status"] == "ok":
                assert line.split()[1] == r["label"], (line, r["label"])
            else:
                assert r["label"] is None and r["label"] not in line.split()[1:2]


def test_check_names_what_breaks_the_record() -> None:
    answer = schema.answer(
        "simulate", problem="p.json", schedule="s.json", kind="chain", makespan=1.0,
        peak_memory=10, ops=3, budget=None, fits=None, trace=None,
    )  # fmt: skip
    check(answer)
    broken = [
        ({**answer, "version": 2}, "version = 2"),
        ({**answer, "format": "schedir.chain"}, "format = 'schedir.chain'"),
        ({k: v for k, v in answer.items() if k != "ops"}, "ops: missing"),
        ({**answer, "extra": 1}, "unknown field 'extra'"),
        ({**answer, "peak_memory": 1.5}, "peak_memory = 1.5: expected int"),
        ({**answer, "fits": 1}, "fits = 1: expected bool"),
        ({**answer, "trace": {"start": [0.0]}}, "trace.end: missing"),
        ({**answer, "trace": {"start": ["a"], "end": [], "op_peak": [], "resident": []}},
         "trace.start[0] = 'a': expected number"),
    ]  # fmt: skip
    for value, message in broken:
        with pytest.raises(ValueError, match=re.escape(message)):
            check(value)
    with pytest.raises(ValueError, match=r"missing \['trace'\]"):
        schema.answer("simulate", **{k: v for k, v in answer.items() if k not in
                                     ("format", "version", "trace")})  # fmt: skip
    row = json.loads(json.dumps(answer))
    row["format"] = "schedir.cli.solve"
    with pytest.raises(ValueError, match="unknown field"):
        check(row)


def _doc_tables() -> dict[str, list[tuple[str, str]]]:
    """docs/formats.md, section "Command-line answers": record -> [(field, type)]."""
    text = (ROOT / "docs" / "formats.md").read_text().split("## Command-line answers", 1)[1]
    tables = {}
    for title, body in re.findall(r"^### `([\w.]+)`\n\n(.*?)(?=^#|\Z)", text, re.S | re.M):
        rows = re.findall(r"^\| `(\w+)` \| `([\w?\[\]]+)` \|", body, re.M)
        tables[title.removeprefix(schema.PREFIX)] = rows
    return tables


def test_the_documented_records_are_the_schema() -> None:
    documented = _doc_tables()
    declared = {name: [(f.name, f.type) for f in fields] for name, fields in schema.RECORDS.items()}
    assert documented == declared

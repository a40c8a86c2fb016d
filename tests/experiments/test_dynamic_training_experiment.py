"""paper_experiments/dynamic_training.py in quick mode: its table, its checks (the LP
bound of every run, the memory caps), the claim at 30% noise, and its two figures
(tests/figure_checks.py)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

from figure_checks import check_saved, recorded

ROOT = Path(__file__).resolve().parents[2]


def test_dynamic_training_quick(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "dynamic_training", ROOT / "paper_experiments" / "dynamic_training.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    figures = recorded(monkeypatch)
    rows = mod.main(["--quick", "--out", str(tmp_path)])
    check_saved(figures, "dynamic_training.png", "dynamic_training_memory.png")
    printed = capsys.readouterr().out
    for png in ("dynamic_training.png", "dynamic_training_memory.png"):
        assert (tmp_path / png).stat().st_size > 0
    with open(tmp_path / "dynamic_training.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == mod.FIELDS
        saved = list(reader)
    assert len(saved) == len(rows) > 0
    assert {r["method"] for r in saved} == {"1f1b_judge", *mod.STATIC, *mod.DYNAMIC}
    assert {r["heterogeneity"] for r in saved} == set(mod.HETEROGENEITY)
    assert {float(r["noise"]) for r in saved} == set(mod.NOISE)
    for r in saved:
        tp = float(r["throughput"])
        if r["run_bound"]:
            assert tp <= float(r["run_bound"]) * (1 + 1e-9), r
        if float(r["noise"]) == 0:
            assert tp <= float(r["lp_bound"]) * (1 + 1e-9), r
        assert all(int(r[f"peak_d{u}"]) <= int(r["cap"]) for u in range(mod.DEVICES)), r
    # the claim: at 30% noise the best dynamic policy reaches the best static plan
    table = mod.summary(rows)
    assert not mod.check(table), mod.check(table)
    assert "best static" in printed and "at 30% noise" in printed

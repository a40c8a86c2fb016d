"""The ZeRO memory experiment (paper_experiments/zero_memory.py) in --quick mode: the
paper's 7.5B row exactly, our accounting next to the formula, and the largest-model fits
ordered as the levers say (each stage, offload, rotor and 8-bit activation storage only
ever help), and its figure (tests/figure_checks.py)."""

from __future__ import annotations

import csv

from figure_checks import check_saved, load_script, recorded


def test_zero_memory_quick(tmp_path, capsys, monkeypatch):
    figures = recorded(monkeypatch)
    load_script("paper_experiments/zero_memory.py").main(["--quick", "--out", str(tmp_path)])
    check_saved(figures, "zero_memory.png")
    assert "baseline 120.0 GB; stages 1/2/3: 31.4 / 16.6 / 1.9 GB" in capsys.readouterr().out
    with open(tmp_path / "zero_memory.csv") as f:
        rows = list(csv.DictReader(f))
    paper = {int(r["stage"]): r for r in rows
             if r["model"] == "paper-7.5B" and r["devices"] == "64"}  # fmt: skip
    assert [int(paper[s]["ours_bytes"]) for s in range(4)] == [
        120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]  # fmt: skip
    for r in rows:  # our accounting never holds less than the formula (replicated leftovers)
        assert int(r["ours_bytes"]) >= float(r["paper_bytes"]) - 0.5
        if r["peak_bytes"]:
            assert int(r["peak_bytes"]) >= int(r["ours_bytes"])
    with open(tmp_path / "zero_fit.csv") as f:
        fits = {(int(r["stage"]), int(r["offload"]), r["activations"]): r
                for r in csv.DictReader(f)}  # fmt: skip
    size = {key: int(r["parameters"]) for key, r in fits.items()}
    for stage in range(4):
        for offload in (0, 1):
            assert size[stage, offload, "rotor_min"] >= size[stage, offload, "store_all"]
            for mode in ("store_all", "rotor_min"):  # 8-bit storage only ever helps
                assert size[stage, offload, mode + "_8bit"] >= size[stage, offload, mode]
            if stage:
                assert size[stage, offload, "store_all"] >= size[stage - 1, offload, "store_all"]
        assert size[stage, 1, "store_all"] >= size[stage, 0, "store_all"]
    for r in fits.values():
        assert int(r["total_bytes"]) <= 40 * 2**30 and r["capped"] == "0"
    assert (tmp_path / "zero_memory.png").stat().st_size > 10_000
    assert (tmp_path / "zero_memory.md").read_text().count("|") > 100

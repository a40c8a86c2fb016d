"""paper_experiments/remat_offload.py in quick mode: files written (the figure passes
tests/figure_checks.py), shares printed."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from figure_checks import check_saved, recorded

ROOT = Path(__file__).resolve().parents[2]


def test_remat_offload_quick(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "remat_offload", ROOT / "paper_experiments" / "remat_offload.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    figures = recorded(monkeypatch)
    shares = module.main(["--quick", "--out", str(tmp_path)])
    check_saved(figures, "remat_offload.png")
    assert (tmp_path / "remat_offload.csv").stat().st_size > 0
    assert (tmp_path / "remat_offload.png").stat().st_size > 0
    assert "share of rotor's remat overhead removed" in capsys.readouterr().out
    by_bw = {}
    for _, bw, share in shares:
        assert math.isfinite(share) and 0.0 <= share <= 1.0 + 1e-9
        by_bw.setdefault(bw, []).append(share)
    # more bandwidth never removes less overhead; NVLink-C2C removes most of it
    assert min(by_bw["nvlink-c2c"]) >= max(by_bw["pcie3"]) - 1e-9
    assert min(by_bw["nvlink-c2c"]) > 0.5

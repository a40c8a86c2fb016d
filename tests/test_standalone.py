"""The repository stands alone: no reference to a design file outside it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_reference_to_an_outside_design_document() -> None:
    hits = []
    for folder in ("schedir", "solvers", "jax_exec", "docs", "tests", "examples", "benchmarks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md") and path.name != "test_standalone.py":
                text = path.read_text(errors="replace")
                hits += [f"{path.relative_to(ROOT)}:{n}" for n, line in
                         enumerate(text.splitlines(), 1) if "DESIGN" in line]  # fmt: skip
    readme = (ROOT / "README.md").read_text()
    assert "DESIGN" not in readme
    assert not hits, hits

"""Low-bit activation storage on the example models (docs/device_memory.md, "Low-bit
activation storage").

For each example model (examples/auto_models.py) and each storage (bfloat16, float8
e4m3 with a per-tensor scale, int8 with a per-tensor scale): every block recorded
store-all with its saved residuals in that storage; the residual bytes it keeps (exact:
the traced compressed arrays) next to full precision, the bytes saved, and the
gradient's relative error ``||g - g_ref|| / ||g_ref||`` measured on the model's example
batch against the plain gradient. Then the planner itself at the tightest budget full
precision allows plus 10%, with ``activation_tolerance`` 0 (never low bit: checked) and
1e-2: its predicted overhead, the storages it chose, the residual bytes they save and
the error it measured. Estimated temporaries (``exact=False``); every figure is one run
on the example batch.

    PYTHONPATH=. python benchmarks/lowbit_activations.py [--quick] [--out results/lowbit]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from auto_models import MODELS  # noqa: E402

from jax_exec import auto  # noqa: E402
from jax_exec.auto import lowbit  # noqa: E402

FIELDS = ["model", "storage", "residual_bytes", "full_bytes", "saved_bytes", "saved_share",
          "gradient_error"]  # fmt: skip
TOLERANCE = 1e-2


def screen(name: str, quick: bool) -> tuple[list[dict], dict]:
    factory, loss_fn, args = MODELS[name](quick=quick)
    model = factory()
    p = auto.plan(loss_fn, model, *args, budget="100%", exact=False)
    every = lowbit.with_lowbit(p.model, args, math.inf)  # every storage kept: its figures
    full = every.screen[None][1]
    rows = []
    for storage in lowbit.STORAGES:
        error, residual = every.screen[storage]
        rows.append({"model": name, "storage": storage, "residual_bytes": residual,
                     "full_bytes": full, "saved_bytes": full - residual,
                     "saved_share": round((full - residual) / full, 4) if full else 0.0,
                     "gradient_error": error})  # fmt: skip
    # the planner: tolerance 0 never stores low bit; 1e-2 may
    tight = p.replan(p.least_budget() * 11 // 10)
    zero = auto.plan(loss_fn, model, *args, budget=tight.budget, exact=False,
                     activation_tolerance=0)  # fmt: skip
    assert not any(isinstance(o, lowbit.LowBitOption) for opts in zero.model.options for o in opts)
    allowed = lowbit.with_lowbit(p.model, args, TOLERANCE)  # reuses the measured errors
    chosen = replace(p, model=allowed, base=allowed, problem=allowed.problem).replan(tight.budget)
    report = chosen.schedule.meta["lowbit"]
    planner = {"model": name, "budget": tight.budget, "full_overhead": tight.overhead,
               "zero_tolerance_overhead": zero.overhead, "lowbit_overhead": chosen.overhead,
               "storage": report["storage"], "saved_bytes": report["saved_bytes"],
               "gradient_error": report["gradient_error"]}  # fmt: skip
    return rows, planner


def markdown(rows: list[dict], planners: list[dict]) -> str:
    lines = ["# Low-bit activation storage, store-all (every block in one storage)", "",
             "| model | storage | residual bytes | full precision | saved | gradient rel. error |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['model']} | {r['storage']} | {r['residual_bytes']:,} | "
                     f"{r['full_bytes']:,} | {r['saved_share']:.1%} | "
                     f"{r['gradient_error']:.2e} |")  # fmt: skip
    lines += ["", f"# The planner at 110% of full precision's least budget, tolerance "
              f"{TOLERANCE:g}", "",
              "| model | budget B | overhead (full) | overhead (tol. 0) | overhead (low bit) "
              "| storages | saved B | gradient rel. error |",
              "|---|---:|---:|---:|---:|---|---:|---:|"]  # fmt: skip
    for q in planners:
        used = ", ".join(sorted({s for s in q["storage"] if s})) or "none"
        lines.append(f"| {q['model']} | {q['budget']:,} | {q['full_overhead']:+.1%} | "
                     f"{q['zero_tolerance_overhead']:+.1%} | {q['lowbit_overhead']:+.1%} | "
                     f"{used} | {q['saved_bytes']:,} | {q['gradient_error']:.2e} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    parser.add_argument("--out", default="results/lowbit", help="output directory")
    ns = parser.parse_args(argv)
    names = [m for m in ns.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        parser.error(f"--models: {unknown[0]!r} unknown; known: {', '.join(MODELS)}")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, planners = [], []
    for name in names:
        start = time.perf_counter()
        found, planner = screen(name, ns.quick)
        rows += found
        planners.append(planner)
        print(f"{name}: {time.perf_counter() - start:.1f}s", flush=True)
    with open(out / "lowbit.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    text = markdown(rows, planners)
    (out / "lowbit.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Calibration of the planner's memory model against XLA (docs/auto.md, "Calibration").

For each example model, the store-all activation peak the planner predicts (every block
recorded keeping what XLA keeps for a plain step; the op-by-op runtime's exact figure,
measured to the byte) next to XLA's own figure for the plain compiled step:
``memory_analysis().temp_size_in_bytes`` of ``jax.jit`` of
``nnx.value_and_grad(loss_fn)`` (parameters, arguments and outputs are not temporaries
in either). Prints the ratio per model; the target is within 15%.

    PYTHONPATH=. python benchmarks/auto_memory.py [--quick] [--models gpt unet]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from auto_models import MODELS, xla_temp_bytes  # noqa: E402

from jax_exec import auto  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models only")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ns = parser.parse_args(argv)
    print(f"{'model':<12} {'blocks':>6} {'predicted B':>13} {'XLA temp B':>13} {'ratio':>7} "
          f"{'plan s':>7}")  # fmt: skip
    ratios = []
    for name in ns.models:
        factory, loss_fn, args = MODELS[name](quick=ns.quick)
        start = time.perf_counter()
        p = auto.plan(loss_fn, factory(), *args, budget="100%", exact=True)
        seconds = time.perf_counter() - start
        xla = xla_temp_bytes(factory, loss_fn, args)
        ratio = p.store_all_peak / xla
        ratios.append(ratio)
        print(f"{name:<12} {p.problem.length:>6} {p.store_all_peak:>13,} {xla:>13,} "
              f"{ratio:>7.3f} {seconds:>7.1f}")  # fmt: skip
    worst = max(abs(r - 1) for r in ratios)
    print(f"largest deviation from XLA: {worst:.1%} (target: within 15%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""pipeline_1f1b at tight memory: peak relative to the devices' capacity.

- simulated: the profiled chains of ``examples/profiles`` on 4 devices (25 GB/s links,
  10 us), m = 8, at the least memory where ``pipeline_1f1b`` finds a schedule (found by
  bisection, to 1/2000) and at 1.02, 1.05, 1.1, 1.25, 1.5 and 2 times it; each
  schedule is saved under ``--out`` and its simulated per-device peak divided by the
  capacity printed. ``--resimulate DIR`` instead simulates the schedules saved in DIR
  (e.g. by an older version of the library) with this version's simulator;
- executed (``--mlp``): the 6-layer Flax MLP of the tests on 4 CPU devices, 4
  micro-batches of 4, at the given memories: the measured bytes after every op
  (``run_pipeline(block=True)``, parameters excluded) divided by the capacity.

    python benchmarks/pipeline_tight_memory.py [--out DIR] [--resimulate DIR]
    python benchmarks/pipeline_tight_memory.py --mlp 6000 8000 12000 20000

Only public entry points are used, so the script runs on earlier versions too (the
figures of docs/pipelines.md compare one from before issue 15).
"""

from __future__ import annotations

import argparse
import glob
import inspect
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = "PIPELINE_TIGHT_MEMORY_CHILD"


def _platform(schedir, memory: int, p: int = 4):
    devs = [schedir.Device(f"g{k}", 1.0, memory) for k in range(p)]
    return schedir.Platform.fully_connected(devs, 25e9, 1e-5)


def _least(schedir, solvers, chain, m: int) -> int:
    from schedir.pipeline.problem import PipelineProblem

    def fits(memory: int) -> bool:
        pb = PipelineProblem(chain, [0] * chain.length, _platform(schedir, memory), m, True)
        try:
            solvers.solve(pb, None, "pipeline_1f1b")
        except solvers.Infeasible:
            return False
        return True

    lo, hi = 1, int(sum(chain.saved_size) * m + 4 * sum(chain.in_size))
    while not fits(hi):
        hi *= 2
    while hi - lo > max(1, hi // 2000):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def simulated(out: str, resimulate: str | None, m: int = 8) -> None:
    import schedir
    import solvers
    from schedir.pipeline.problem import PipelineProblem

    os.makedirs(out, exist_ok=True)
    for path in sorted(glob.glob(str(ROOT / "examples" / "profiles" / "*.json"))):
        chain, name = schedir.load(path), Path(path).stem
        if resimulate:
            saved = sorted(glob.glob(os.path.join(resimulate, f"{name}_*.json")))
            cases = [(int(Path(f).stem.rsplit("_", 1)[1]), schedir.load(f)) for f in saved]
        else:
            least = _least(schedir, solvers, chain, m)
            cases = []
            for factor in (1.0, 1.02, 1.05, 1.1, 1.25, 1.5, 2.0):
                memory = int(least * factor)
                pb = PipelineProblem(chain, [0] * chain.length, _platform(schedir, memory), m,
                                     True)  # fmt: skip
                s = solvers.solve(pb, None, "pipeline_1f1b")
                schedir.save(s, os.path.join(out, f"{name}_{memory}.json"))
                cases.append((memory, s))
        for memory, s in sorted(cases, key=lambda c: c[0]):
            pb = PipelineProblem(chain, [0] * chain.length, _platform(schedir, memory), m, True)
            peak = max(schedir.simulate_pipeline(pb, s).device_peak.values())
            ratio = peak / memory
            print(f"{name:16s} memory {memory:>11,d}  simulated peak / capacity {ratio:.4f}")


def executed(memories: list[int]) -> None:
    import jax

    import jax_exec
    import schedir
    import solvers
    from jax_exec.pipeline.mpmd import run_pipeline
    from schedir.pipeline.problem import PipelineProblem
    from schedir_cli.models import mlp_stack, mse_loss

    layers = mlp_stack(4, 16, 32, 8, 4)
    x = jax.random.normal(jax.random.key(0), (16, 8))
    y = jax.random.normal(jax.random.key(1), (16, 4))
    prof = jax_exec.parallel.profile_stages(layers, mse_loss, x[:4], y[:4], timing="flops")
    known = inspect.signature(PipelineProblem).parameters
    extra = {"target_bytes": int(y[:4].nbytes)} if "target_bytes" in known else {}
    for memory in memories:
        devs = [schedir.Device(f"d{u}", 1.0, memory) for u in range(4)]
        plat = schedir.Platform.fully_connected(devs, 1e9)
        pb = PipelineProblem(prof, [0] * len(layers), plat, 4, True, **extra)
        try:
            s = solvers.solve(pb, None, "pipeline_1f1b")
        except solvers.Infeasible:
            print(f"mlp memory {memory:>7,d}  no schedule")
            continue
        r = run_pipeline(layers, s, x, y, mse_loss, block=True)
        peak = max(r.device_peaks.values())
        print(f"mlp memory {memory:>7,d}  measured peak / capacity {peak / memory:.4f}  "
              f"(per device {dict(r.device_peaks)})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/pipeline_tight_memory")
    ap.add_argument("--resimulate", default=None)
    ap.add_argument("--mlp", type=int, nargs="+", default=None)
    args = ap.parse_args()
    if args.mlp is None:
        simulated(args.out, args.resimulate)
    elif os.environ.get(CHILD):
        executed(args.mlp)
    else:  # 4 CPU devices: XLA_FLAGS must be set before jax is imported
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
                   JAX_PLATFORMS="cpu", **{CHILD: "1"})  # fmt: skip
        sys.exit(subprocess.call([sys.executable, __file__, *sys.argv[1:]], env=env))


if __name__ == "__main__":
    main()

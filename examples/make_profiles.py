"""Regenerate the chain profiles shipped in ``examples/profiles/`` from Flax models.

Two model families, profiled on CPU with ``jax_exec.stages.profile(..., timing="flops")``
(times from XLA's FLOP counts at 1e11 FLOP/s, so the files are deterministic):

- ``mlp_mixer_like.json``: 24 residual MLP blocks (width 256, hidden 1024), batch 512;
- ``transformer.json``: 16 transformer blocks (dim 128, 4 heads, 64 tokens), batch 32.

    python examples/make_profiles.py [--out DIR] [--quick]

``--quick`` profiles 2-block versions (a smoke run; write them elsewhere with --out).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp

import schedir
from jax_exec.stages import profile
from schedir_cli.models import mlp_stack, mse_loss, transformer_stack

OUT = Path(__file__).resolve().parent / "profiles"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder (default: this one's)")
    parser.add_argument("--quick", action="store_true", help="2 blocks per model")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    mlp_depth, transformer_depth = (2, 2) if args.quick else (24, 16)
    key = jax.random.PRNGKey(0)
    layers = mlp_stack(mlp_depth, 256, 1024, 64, 10)
    x, y = jax.random.normal(key, (512, 64)), jnp.zeros((512, 10))
    chain = profile(layers, mse_loss, x, y, timing="flops", flops_per_second=1e11)
    schedir.save(chain, out / "mlp_mixer_like.json")
    layers = transformer_stack(transformer_depth, 128, 4, 512, 32, 10)
    x, y = jax.random.normal(key, (32, 64, 32)), jnp.zeros((32, 10))
    chain = profile(layers, mse_loss, x, y, timing="flops", flops_per_second=1e11)
    schedir.save(chain, out / "transformer.json")
    for path in sorted(out.glob("*.json")):
        c = schedir.load(path)
        print(f"{path.name}: {c.length} stages, x_0 = {c.in_size[0]} B")


if __name__ == "__main__":
    main()

"""Shared test set-up. Tests mirror the packages: tests/schedir (the IR), tests/solvers,
tests/jax_exec, tests/cli, tests/experiments; the whole-repository checks (docs,
doctests, import contracts) stay here.

The shared generators and oracles live next to this file and are importable from
every test folder (this file puts tests/ on ``sys.path``):

- ``chain_strategies``: random chains in every size regime (``random_chain``,
  hypothesis ``chains``, ``REGIMES``: usual, zeros, large temporaries, abar smaller
  than a, ...), ``homogeneous_chain``;
- ``brute_force``: the exhaustive optimum of a chain at a budget;
- ``graph_cases``: random DAGs; ``pipeline_instances``: random pipeline problems;
- ``fuzz_inputs``: malformed problems, schedules and budgets;
- ``auto_models``, ``jax_reference``: Flax models and the plain-autodiff reference.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from xla_env import suite_flags  # noqa: E402  (needs tests/ on the path)

# Before anything imports jax (tests/xla_env.py says why the suite compiles this way).
os.environ["XLA_FLAGS"] = suite_flags()

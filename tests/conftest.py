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

import gc
import os
import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from xla_env import suite_flags  # noqa: E402  (needs tests/ on the path)

# Before anything imports jax (tests/xla_env.py says why the suite compiles this way).
os.environ["XLA_FLAGS"] = suite_flags()

# A worker's heap grows to a few GB (the process-wide kernel caches, traced programs), and
# CPython's default thresholds (700, 10, 10) walk it often: test_random_models[0-2] spent
# 1.2-2.0 s of each 26-32 s chunk in the cyclic collector (gc callbacks), 0.5-0.6 s with
# these (stop 49). Reference counting still frees everything acyclic at once.
gc.set_threshold(20_000, 20, 20)


# The longest test files first (their tests' summed seconds on the 2-core machine: 369,
# 193, 104, 42). pytest-xdist hands tests out in collection order, so a long test
# collected late keeps one worker busy after the other has run out: the default run
# spent about two minutes so, one worker idle.
LONG_FIRST = (
    "jax_exec/test_random_models.py",
    "jax_exec/test_zoo.py",
    "jax_exec/test_dropin_regressions.py",
    "jax_exec/test_traced_pipeline.py",
)


def pytest_collection_modifyitems(items) -> None:
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, f in enumerate(LONG_FIRST) if path.endswith(f)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: the same order on every worker

"""Malformed problems, schedules and budgets for the fuzz test (tests/cli/test_fuzz_cli.py).

A seeded generator: valid seeds of every problem kind and schedule class (small, so
that every solver is fast on them), mutated 1 to 3 times at random places of their
JSON tree (a value replaced by an odd one, an entry deleted or duplicated, a list cut
or grown, a type swapped), plus broken files and budget strings built from a grammar.
"""

from __future__ import annotations

import copy
import random

import schedir
import solvers

DEEP = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]

# Values that break the usual assumptions: signs, sizes beyond int64 and float, NaN
# (files: written as NaN, which JSON does not have), types, deep nesting.
ODD = [
    None, True, False, 0, -1, 1, 7, 2**31, 2**63, 2**70, 10**30, -(10**30), 10**400,
    0.5, -0.0, 2.5e-324, 1e308, -1e308, 1e300, float("nan"), float("inf"), float("-inf"),
    "", "x", "1", "1e400", "F_all(0)", "Compute(0)", "gpu0", "a" * 300,
    [], {}, [0], [1, 2, 3], [None], {"a": 1}, {"format": "schedir.chain"}, DEEP,
]  # fmt: skip

OPS = [
    "F_ck(0)", "F_n(0)", "F_all(0)", "F_all(1)", "F_all(2)", "Loss()", "B(0)", "B(1)", "B(2)",
    "F_ck(-1)", "B(99)", "F_all(99999999999999999999)", "F_all(1e9)", "F_all()", "Loss(1)",
    "Compute(0)", "Compute(-1)", "Compute(999)", "Free(0)", "Free(x)", "Offload(a[0])",
    "Prefetch(abar[1])", "Wait(a[0])", "Evict(a[1])", "Offload(d[9])", "F(0,0)", "", "()",
]  # fmt: skip


def small_chain() -> schedir.Chain:
    """Three stages with every size and temporary non-zero."""
    return schedir.Chain.from_rotor(
        [1.0, 2.0, 1.5], [2.0, 3.0, 2.5, 0.5], [40, 80, 60, 10], [100, 120, 90, 0],
        [5, 10, 5], [8, 12, 6, 4],
    )  # fmt: skip


def seeds() -> dict[str, dict]:
    """name -> a valid JSON dict of each problem kind and schedule class."""
    chain = small_chain()
    graph = chain.to_graph()
    platform = schedir.Platform.host_offload(1000.0, device_memory=400, host_memory=10_000)
    offload = schedir.OffloadProblem(chain, platform)
    devices = [schedir.Device("gpu0", 1.0, 4000), schedir.Device("gpu1", 2.0, 4000)]
    pipeline = schedir.PipelineProblem(
        chain, (10, 20, 30), schedir.Platform.fully_connected(devices, 100.0), 4, True
    )
    out = {
        "chain": chain.to_dict(),
        "graph": graph.to_dict(),
        "platform": platform.to_dict(),
        "offload": offload.to_dict(),
        "pipeline": pipeline.to_dict(),
        "chain_schedule": solvers.solve(chain, 380, "rotor").to_dict(),  # store-all: 402
        "graph_schedule": solvers.solve(graph, 380, "dtr").to_dict(),
    }
    for name, problem, method, budget in [
        ("offload_schedule", offload, "rotor_offload", 380),
        ("pipeline_schedule", pipeline, "pipeline_1f1b", None),
    ]:
        try:
            out[name] = solvers.solve(problem, budget, method).to_dict()
        except (ValueError, TypeError, RuntimeError):  # a solver that cannot: no such seed
            pass
    return out


def _paths(tree, prefix=()) -> list[tuple]:
    """Every path (tuple of keys and indices) in a JSON tree, the root included."""
    paths = [prefix]
    if isinstance(tree, dict):
        for k, v in tree.items():
            paths += _paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            paths += _paths(v, (*prefix, i))
    return paths


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def odd_value(rng: random.Random, near=None):
    """An odd value; sometimes one derived from ``near`` (scaled, negated, stringified)."""
    if isinstance(near, int | float) and not isinstance(near, bool) and rng.random() < 0.4:
        half = near + 0.5 if abs(near) < 1e300 else near
        return rng.choice([-near, near * 10 ** rng.randint(3, 40), str(near), half, [near]])
    if isinstance(near, str) and rng.random() < 0.3:
        return rng.choice(OPS) if rng.random() < 0.5 else near[: rng.randint(0, len(near))]
    return copy.deepcopy(rng.choice(ODD))


def mutate(rng: random.Random, tree: dict, times: int | None = None) -> dict:
    """``tree`` (deep-copied) with 1 to 3 random mutations."""
    tree = copy.deepcopy(tree)
    for _ in range(times or rng.randint(1, 3)):
        paths = [p for p in _paths(tree) if p]  # never the root itself
        if not paths:
            break
        path = rng.choice(paths)
        parent, key = _get(tree, path[:-1]), path[-1]
        action = rng.random()
        if action < 0.55:
            parent[key] = odd_value(rng, parent[key])
        elif action < 0.7:
            del parent[key]
        elif action < 0.8 and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))  # a list one longer
        elif action < 0.88 and isinstance(parent[key], list):
            parent[key] = parent[key][: rng.randint(0, len(parent[key]))]
        elif action < 0.94 and isinstance(parent, dict):
            parent[rng.choice(["extra", "format", "version", "meta", "ops"])] = odd_value(rng)
        elif isinstance(parent[key], str) and parent[key].startswith("F"):
            parent[key] = rng.choice(OPS)
        else:
            parent[key] = str(parent[key])
    return tree


def budget_text(rng: random.Random) -> str:
    """A budget string from a grammar of numbers, exponents, units and noise; half the
    time one that parses (so that the solvers run)."""
    if rng.random() < 0.5:
        return rng.choice(["90%", "100%", "95.5%", "380", "402", "1KiB", "0.4 kB", "300%"])
    number = rng.choice(
        ["0", "1", "300", "1400", "007", "1.5", ".5", "5.", "1e3", "1E+400", "1e-500", "2.5e-3",
         str(10**30), str(2**63 + 1), "1" * 60, "-5", "+5", "0x10", "1_000", "١٢٣", "nan",
         "inf", "", " ", "1.2.3", "1e", "e3", "12.5"]
    )  # fmt: skip
    unit = rng.choice(["", "", "B", "b", "KiB", "kib", "MiB", "GiB", "TiB", "kB", "MB", "GB",
                       "TB", "%", "%%", "XB", "furlongs", " %", "% ", "PiB", "i"])  # fmt: skip
    return f"{number}{unit}" if rng.random() < 0.95 else rng.choice(["", "%", "GiB", "--", "-1%"])


def budget_value(rng: random.Random):
    """A budget for the Python API: ints of any size, floats, odd types."""
    return rng.choice(
        [0, 1, 361, 362, 380, 402, 600, 10**4, 2**62, 10**30, -1, 380.0, 380.5, 1e300,
         float("nan"), float("inf"), None, "300", True, [300]]
    )  # fmt: skip


def broken_text(rng: random.Random, valid: str) -> str:
    """A file body that is not a valid problem: cut, garbled, empty or deep."""
    choice = rng.random()
    if choice < 0.4:
        return valid[: rng.randint(0, len(valid))]
    if choice < 0.6:
        i = rng.randint(0, max(len(valid) - 1, 0))
        return valid[:i] + rng.choice(["}", "]", ",", '"', "\\", "NaN", "\x00", "é"]) + valid[i:]
    return rng.choice(
        ["", "null", "[]", "{}", "0", '"x"', "[" * 5000 + "]" * 5000, "{" * 3 + "}" * 3,
         '{"format": "schedir.chain", "version": 1}', '{"format": null}', "\ufeff{}",
         '{"format": "schedir.schedule", "version": 1, "ops": [], "meta": {"budget": "x"}}']
    )  # fmt: skip


def changes(seed, tree, path: str = "", limit: int = 4) -> list[str]:
    """Where ``tree`` differs from ``seed``: ``['chain.in_size[1]: 80 -> -80', ...]``."""
    if type(seed) is type(tree) and isinstance(tree, dict):
        out = [f"{path}.{k}: deleted" for k in seed if k not in tree]
        out += [f"{path}.{k}: added {_brief(tree[k])}" for k in tree if k not in seed]
        for k in tree:
            if k in seed:
                out += changes(seed[k], tree[k], f"{path}.{k}", limit)
        return out[:limit]
    if type(seed) is type(tree) and isinstance(tree, list) and len(seed) == len(tree):
        out = []
        for i, (a, b) in enumerate(zip(seed, tree, strict=True)):
            out += changes(a, b, f"{path}[{i}]", limit)
        return out[:limit]
    if type(seed) is type(tree) and isinstance(tree, list):  # a list cut or grown
        i = next((i for i, (a, b) in enumerate(zip(seed, tree)) if a != b), None)  # noqa: B905
        i = min(len(seed), len(tree)) if i is None else i
        old, new = (_brief(x[i]) if i < len(x) else "-" for x in (seed, tree))
        return [
            f"{path}: {len(seed)} -> {len(tree)} entries, first difference at [{i}]: {old} -> {new}"
        ]
    if type(seed) is type(tree) and seed == tree:
        return []
    return [f"{path or '.'}: {_brief(seed)} -> {_brief(tree)}"]


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

"""Random small graphs for the graph solver tests (seeded, with corner regimes)."""

from __future__ import annotations

import numpy as np

from schedir import Graph, Node


def random_dag(seed: int, n: int = 7, *, regime: str = "plain") -> Graph:
    """A random training-like DAG of ``n`` nodes: 1-2 inputs, then forward nodes, then
    backward nodes (each reads 1-3 earlier nodes, the last node reads a forward node).

    ``regime``: ``"plain"`` (sizes 1..12, tmp 0..3), ``"zeros"`` (about half the sizes
    and tmp are 0, some costs 0) or ``"tmp"`` (tmp up to 5x the largest size).
    """
    rng = np.random.default_rng(seed)
    n_in = int(rng.integers(1, 3))
    n_fwd = max(1, (n - n_in) // 2)
    nodes: list[Node] = []
    for i in range(n):
        if i < n_in:
            kind, inputs = "input", ()
        else:
            kind = "forward" if i < n_in + n_fwd else "backward"
            k = int(rng.integers(1, min(3, i) + 1))
            inputs = tuple(sorted({int(j) for j in rng.choice(i, size=k, replace=False)}))
            if i == n_in:
                inputs = tuple(sorted({*inputs, 0}))
        size = int(rng.integers(1, 13))
        tmp = int(rng.integers(0, 4))
        cost = float(rng.integers(1, 8)) / 2
        if regime == "zeros":
            size = size if rng.random() < 0.5 else 0
            tmp = tmp if rng.random() < 0.5 else 0
            cost = cost if rng.random() < 0.8 else 0.0
        elif regime == "tmp":
            tmp = int(rng.integers(0, 61))
        if kind == "input":
            cost, tmp = 0.0, 0
        nodes.append(Node(f"n{i}", cost, size, inputs, kind, tmp))
    return Graph(tuple(nodes))

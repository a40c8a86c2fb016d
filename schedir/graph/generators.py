"""Training graphs from forward DAGs, and random skip-connection graphs (tests, demos)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from schedir.errors import InvalidProblem
from schedir.graph.problem import Graph, build_graph


def forward_backward_graph(
    inputs: Mapping[str, int],
    forward: Sequence[Mapping],
    loss_cost: float = 0.0,
    loss_tmp: int = 0,
) -> Graph:
    """The training graph of a forward DAG (reverse-mode autodiff, one backward node per
    forward node).

    ``inputs`` maps input names to bytes. Each forward entry has ``name``, ``cost``
    (seconds), ``size`` (bytes), ``inputs`` (names), and optionally ``bwd_cost``
    (seconds, default 2 * cost), ``tmp`` and ``bwd_tmp`` (bytes). The loss node reads
    every forward node that no forward node reads (size: the sum of their sizes, the
    gradient). Backward node ``B{name}`` reads the gradient producers of its output
    (the backward nodes of its forward users, or the loss), its forward node and that
    node's inputs, and produces the gradients of its inputs (size: their sum). For a
    sequence this is exactly :func:`chain_to_graph`'s layout without residual nodes.
    """
    spec: list[dict] = [
        {"name": n, "kind": "input", "cost": 0.0, "size": s} for n, s in inputs.items()
    ]
    sizes = dict(inputs)
    users: dict[str, list[str]] = {n: [] for n in inputs}
    for f in forward:
        spec.append(
            {
                "name": f["name"],
                "kind": "forward",
                "cost": f["cost"],
                "size": f["size"],
                "tmp": f.get("tmp", 0),
                "inputs": list(f["inputs"]),
            }
        )
        sizes[f["name"]] = f["size"]
        users[f["name"]] = []
        for i in f["inputs"]:
            if i not in users:
                raise InvalidProblem(f"forward node {f['name']!r}: unknown input {i!r}")
            users[i].append(f["name"])
    sinks = [f["name"] for f in forward if not users[f["name"]]]
    spec.append(
        {
            "name": "loss",
            "kind": "backward",
            "cost": loss_cost,
            "size": sum(sizes[s] for s in sinks),
            "tmp": loss_tmp,
            "inputs": sinks,
        }
    )
    for f in reversed(forward):
        grads = [f"B{u}" for u in users[f["name"]]] or ["loss"]
        spec.append(
            {
                "name": f"B{f['name']}",
                "kind": "backward",
                "cost": f.get("bwd_cost", 2 * f["cost"]),
                "size": sum(sizes[i] for i in f["inputs"]),
                "tmp": f.get("bwd_tmp", 0),
                "inputs": grads + [f["name"]] + list(f["inputs"]),
            }
        )
    return build_graph(spec)


def skip_graph(layers: int, *, skip: int = 2, seed: int = 0, unet: bool = False) -> Graph:
    """A synthetic training graph with skip connections (tests and experiments).

    Layer i reads layer i-1 and, every ``skip`` layers, layer i-skip (residual
    blocks); with ``unet``, layer i of the second half reads its mirror layer of the
    first half instead. Costs in [1, 3) seconds, sizes in [4, 16) bytes, seeded.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    forward = []
    prev = "x"
    for i in range(layers):
        ins = [prev]
        if unet and i >= (layers + 1) // 2:
            mirror = layers - 1 - i
            if 0 <= mirror < i - 1:
                ins.append(f"L{mirror}")
        elif not unet and i >= skip and i % skip == 0:
            ins.append(f"L{i - skip}")
        cost = float(rng.uniform(1, 3))
        forward.append(
            {
                "name": f"L{i}",
                "cost": round(cost, 3),
                "bwd_cost": round(2 * cost, 3),
                "size": int(rng.integers(4, 16)),
                "inputs": ins,
            }
        )
        prev = f"L{i}"
    return forward_backward_graph({"x": int(rng.integers(4, 16))}, forward, loss_cost=1.0)

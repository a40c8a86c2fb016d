"""Graph problem, graph ops, graph simulator, chain_to_graph (schedir only)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedir
from schedir import (
    Chain,
    Compute,
    Free,
    Graph,
    GraphSchedule,
    InvalidProblem,
    InvalidSchedule,
    Node,
    build_graph,
    chain_ops_to_graph,
    chain_to_graph,
    parse_graph_op,
    simulate,
    simulate_chain,
)
from schedir.chain.ops import B, F_all, F_ck, F_n, Loss
from schedir.graph.convert import chain_nodes
from schedir.graph.generators import skip_graph


def tiny() -> Graph:
    return build_graph(
        [
            {"name": "x", "kind": "input", "cost": 0, "size": 4},
            {"name": "y", "cost": 1.0, "size": 8, "inputs": ["x"], "tmp": 3},
            {"name": "z", "cost": 2.0, "size": 2, "inputs": ["x", "y"]},
            {"name": "g", "kind": "backward", "cost": 0.5, "size": 1, "inputs": ["z"]},
        ]
    )


def test_validation_errors() -> None:
    with pytest.raises(InvalidProblem, match="dangling"):
        Graph((Node("a", 1.0, 1, (3,)),))
    with pytest.raises(InvalidProblem, match="cycle"):
        Graph((Node("a", 1.0, 1, (1,)), Node("b", 1.0, 1, (0,))))
    with pytest.raises(InvalidProblem, match="topological"):
        Graph((Node("a", 1.0, 1, (1,)), Node("b", 1.0, 1, ())))
    with pytest.raises(InvalidProblem, match="non-negative"):
        Graph((Node("a", -1.0, 1),))
    with pytest.raises(InvalidProblem, match="non-negative"):
        Graph((Node("a", 1.0, -1),))
    with pytest.raises(InvalidProblem, match="also names"):
        Graph((Node("a", 1.0, 1), Node("a", 1.0, 1)))
    with pytest.raises(InvalidProblem, match="kind"):
        Graph((Node("a", 1.0, 1, kind="sideways"),))
    with pytest.raises(InvalidProblem, match="dangling"):
        build_graph([{"name": "a", "cost": 1, "size": 1, "inputs": ["nope"]}])


def test_json_round_trip(tmp_path) -> None:
    g = skip_graph(5, unet=True)
    assert Graph.from_dict(json.loads(json.dumps(g.to_dict()))) == g
    schedir.save(g, tmp_path / "g.json")
    assert schedir.load(tmp_path / "g.json") == g
    s = GraphSchedule((Compute(1), Free(1)), {"method": "x"})
    assert GraphSchedule.from_json(s.to_json()) == s
    schedir.save(s, tmp_path / "s.json")
    assert schedir.load(tmp_path / "s.json") == s
    assert parse_graph_op("Compute(7)") == Compute(7)
    with pytest.raises(InvalidSchedule):
        parse_graph_op("F_ck(1)")


def test_simulator_semantics() -> None:
    g = tiny()
    t = simulate(g, ["Compute(1)", "Compute(2)", "Free(1)", "Compute(3)", "Free(0)"])
    assert t.makespan == 3.5
    assert t.initial_memory == 4
    assert t.op_peak == (15, 14, 6, 7, 3)
    assert t.peak_memory == 15
    with pytest.raises(InvalidSchedule, match="op 2: Compute\\(2\\).*needs y"):
        simulate(g, ["Compute(1)", "Free(1)", "Compute(2)"])
    with pytest.raises(InvalidSchedule, match="already resident"):
        simulate(g, ["Compute(1)", "Compute(1)"])
    with pytest.raises(InvalidSchedule, match="not resident"):
        simulate(g, ["Free(1)"])
    with pytest.raises(InvalidSchedule, match="input"):
        simulate(g, ["Compute(0)"])
    with pytest.raises(InvalidSchedule, match="never computed: g"):
        simulate(g, ["Compute(1)", "Compute(2)"])
    with pytest.raises(InvalidSchedule, match="chain Schedule"):
        simulate(g, schedir.Schedule((Loss(),)))


def random_chain(rng: np.random.Generator, L: int, residuals: bool = True) -> Chain:
    x = [int(v) for v in rng.integers(1, 20, L + 1)]
    extra = rng.integers(0, 10, L) if residuals else np.zeros(L, dtype=int)
    saved = [x[k + 1] + int(extra[k]) for k in range(L)]
    return Chain.from_rotor(
        [float(v) for v in rng.uniform(0.5, 3, L)],
        [float(v) for v in rng.uniform(0.5, 3, L + 1)],
        x,
        [0, *saved],
        [int(v) for v in rng.integers(0, 5, L)],
        [int(v) for v in rng.integers(0, 5, L + 1)],
    )


def random_chain_schedule(rng: np.random.Generator, chain: Chain) -> list:
    """A random valid persistent chain schedule (random checkpoints, rotor's shape)."""
    L = chain.length
    ops: list = []

    def solve(i: int, t: int) -> None:  # a_i resident and stays; ends with d_i
        if i == L:
            ops.append(Loss())
        elif i == t or rng.random() < 0.5:
            ops.append(F_all(i))
            if i + 1 <= t:
                solve(i + 1, t)
            ops.append(B(i))
        else:
            j = int(rng.integers(i + 1, t + 1))
            ops.append(F_ck(i))
            ops.extend(F_n(k) for k in range(i + 1, j))
            solve(j, t)
            solve(i, j - 1)

    solve(0, L)
    return ops


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 6), st.booleans())
def test_chain_schedules_translate(seed: int, L: int, residuals: bool) -> None:
    """Every chain schedule runs on the chain's graph with a peak no larger; the graph
    pays one more forward per recording forward of a stage with residuals (R{k} and
    F{k} each run the forward), and nothing else."""
    rng = np.random.default_rng(seed)
    chain = random_chain(rng, L, residuals)
    graph = chain_to_graph(chain)
    ops = random_chain_schedule(rng, chain)
    ct = simulate_chain(chain, ops)
    gt = simulate(graph, chain_ops_to_graph(chain, ops))
    has_res = [chain.saved_size[k] > chain.in_size[k + 1] for k in range(L)]
    extra = sum(chain.fwd_time[op.index] for op in ops if type(op) is F_all and has_res[op.index])
    assert gt.makespan == pytest.approx(ct.makespan + extra)
    assert gt.peak_memory <= ct.peak_memory


def test_chain_to_graph_layout() -> None:
    chain = Chain.from_rotor([1, 2], [3, 4, 1], [10, 20, 30], [0, 25, 30], [1, 2], [3, 4, 5])
    g = chain_to_graph(chain)
    names = [n.name for n in g.nodes]
    assert names == ["a0", "R0", "F0", "F1", "loss", "B1", "B0"]
    w = chain_nodes(chain)
    assert w.res == (1, None) and w.fwd == (2, 3) and w.d == (6, 5, 4)
    assert g.nodes[4].cost == 1 and g.nodes[4].tmp == 5
    assert [g.nodes[j].name for j in g.nodes[6].inputs] == ["B1", "F0", "R0", "a0"]
    # the recording forward is two runs of the forward: F_all(0) costs one more forward
    assert g.store_all_time() == chain.store_all_time() + chain.fwd_time[0]
    store_all = [F_all(0), F_all(1), Loss(), B(1), B(0)]
    ct = simulate_chain(chain, store_all)
    gt = simulate(g, chain_ops_to_graph(chain, store_all))
    assert (gt.makespan, gt.peak_memory) == (ct.makespan + chain.fwd_time[0], ct.peak_memory)


def test_residual_node_costs_a_forward() -> None:
    """Issue 11, item 4: R{k} is a run of stage k's forward that keeps the residuals
    (its output a_{k+1} a temporary): it costs fwd_time[k], reads only a_k, and needs
    what F_all(k) needs (s_k + fwd_tmp[k] above what is resident)."""
    chain = Chain.from_rotor([1.5, 2.0], [3, 4, 1], [10, 20, 30], [0, 25, 40], [1, 2], [3, 4, 5])
    g = chain_to_graph(chain)
    for k in range(chain.length):
        r = g.nodes[g.index(f"R{k}")]
        assert r.cost == chain.fwd_time[k]
        assert [g.nodes[j].name for j in r.inputs] == [f"F{k - 1}" if k else "a0"]
        assert r.size + r.tmp == chain.saved_size[k] + chain.fwd_tmp[k]
    # F_all(0) alone: the chain needs x0 + s0 + fwd_tmp0; the graph (R0 then F0) as much
    need = chain.in_size[0] + chain.saved_size[0] + chain.fwd_tmp[0]
    ops = chain_ops_to_graph(chain, [F_all(0), F_all(1), Loss(), B(1), B(0)])
    assert ops[:2] == (Compute(g.index("R0")), Compute(g.index("F0")))
    assert simulate(g, ops).op_peak[:2] == (need, need)


def test_sizes_are_exact_integers_costs_floats() -> None:
    big = 10**400
    assert Graph((Node("a", 1.0, big),)).nodes[0].size == big
    assert Graph((Node("a", 1.0, 2.0**70),)).nodes[0].size == 2**70
    for bad in (1.5, float("nan"), float("inf")):
        with pytest.raises(InvalidProblem, match="size.*integers"):
            Graph((Node("a", 1.0, bad),))
    with pytest.raises(InvalidProblem, match=r"nodes\[0\] \(a\)\.cost.*too large"):
        Graph((Node("a", big, 1),))


def test_costs_whose_sums_overflow_are_refused() -> None:
    with pytest.raises(InvalidProblem, match=r"nodes\[\*\]\.cost.*overflow"):
        Graph((Node("a", 1e308, 1), Node("b", 1e308, 1, (0,))))
    with pytest.raises(InvalidProblem, match="overflow"):  # the sum of one use is finite
        Graph((Node("a", 1e308, 1), Node("b", 0.5e308, 1, (0,))))
    g = Graph((Node("a", 1e300, 1), Node("b", 1e300, 1, (0,))))
    assert g.store_all_time() == 2e300


def test_forward_backward_graph_of_sequence_is_chain_layout() -> None:
    g = skip_graph(4, skip=100)
    names = [n.name for n in g.nodes]
    assert names == ["x", "L0", "L1", "L2", "L3", "loss", "BL3", "BL2", "BL1", "BL0"]
    assert [g.nodes[i].name for i in g.nodes[-1].inputs] == ["BL1", "L0", "x"]

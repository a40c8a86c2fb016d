"""The whole-graph save-set MILP against brute force on tiny chains, corner regimes
included (zero sizes, zero costs, a base above the budget, shared groups)."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

import solvers
from schedir import InvalidProblem
from solvers.blocks.options import OptionGraph, recompute_set
from solvers.blocks.whole_milp import SaveSetChain, model_needs, whole_save_sets


def random_graph(rng: random.Random, n: int) -> OptionGraph:
    """n nodes in order; each node makes one candidate (node 0: maybe not), reads
    earlier values; some backwards read values, some nodes recompute themselves."""
    cand = [i for i in range(n) if i > 0 or rng.random() < 0.5]
    cpos = {node: c for c, node in enumerate(cand)}

    def ref(node: int) -> int:
        return cpos[node] if node in cpos else -1 - node

    inputs, needs = [], []
    for i in range(n):
        earlier = rng.sample(range(i), k=min(i, rng.randint(0, 2)))
        inputs.append(tuple(sorted({ref(j) for j in earlier})))
        read = rng.sample(range(i + 1), k=min(i + 1, rng.randint(0, 2)))
        needs.append(tuple(sorted({ref(j) for j in read})))
    return OptionGraph(
        cost=tuple(rng.choice([0.0, 1.0, 2.5, 7.0]) for _ in range(n)),
        inputs=tuple(inputs),
        values=tuple(cand),
        value_sizes=tuple(rng.choice([0, 1, 3, 8]) for _ in cand),
        needs=tuple(needs),
        self_recompute=tuple(rng.random() < 0.15 for _ in range(n)),
    )


def brute_force(chain: SaveSetChain, budget: int) -> float | None:
    """Least recomputation (plus the host copies' cost) over every save set of every
    group and, with a host link, every choice of positions keeping their residuals in
    host memory (None: none fits)."""
    groups = sorted(set(chain.groups))
    graph_of = {g: chain.graphs[chain.groups.index(g)] for g in groups}
    best = None
    per_group = [
        [frozenset(s) for r in range(len(graph_of[g].values) + 1)
         for s in itertools.combinations(range(len(graph_of[g].values)), r)]
        for g in groups
    ]  # fmt: skip
    hosts = [(False, True) if chain.host_cost is not None else (False,)] * chain.length
    for choice, on_host in itertools.product(itertools.product(*per_group),
                                             itertools.product(*hosts)):  # fmt: skip
        by_group = dict(zip(groups, choice, strict=True))
        sets = [by_group[g] for g in chain.groups]
        recs = [recompute_set(gr, s) for gr, s in zip(chain.graphs, sets, strict=True)]
        fwd, bwd, loss = model_needs(chain, sets, recs, on_host)
        if max(fwd + bwd + [loss]) > budget:
            continue
        held = host_bytes(chain, sets, on_host)
        if chain.host_memory is not None and held > chain.host_memory:
            continue
        t = sum(sum(gr.cost[i] for i in r) for gr, r in zip(chain.graphs, recs, strict=True))
        t += (chain.host_cost or 0.0) * held
        best = t if best is None else min(best, t)
    return best


def host_bytes(chain: SaveSetChain, sets, on_host) -> int:
    return sum(sum(g.value_sizes[c] for c in s)
               for g, s, h in zip(chain.graphs, sets, on_host, strict=True) if h)  # fmt: skip


def random_chain(rng: random.Random) -> SaveSetChain:
    L = rng.randint(1, 3)
    graphs, groups = [], []
    for k in range(L):
        if k and rng.random() < 0.4:  # share the previous position's save set
            graphs.append(graphs[-1])
            groups.append(groups[-1])
        else:
            graphs.append(random_graph(rng, rng.randint(1, 4)))
            groups.append(k)
    return SaveSetChain(
        graphs=tuple(graphs),
        groups=tuple(groups),
        node_bytes=tuple(tuple(rng.choice([0, 1, 4, 20]) for _ in g.cost) for g in graphs),
        fwd_base=tuple(rng.randint(0, 10) for _ in graphs),
        bwd_base=tuple(rng.randint(0, 30) for _ in graphs),  # large temporaries too
        loss_base=rng.randint(0, 10),
    )


@pytest.mark.parametrize("seed", range(60))
def test_whole_milp_equals_brute_force(seed):
    rng = random.Random(seed)
    chain = random_chain(rng)
    for budget in (0, 10, 25, 40, 80):
        best = brute_force(chain, budget)
        if best is None:
            with pytest.raises(solvers.Infeasible) as err:
                whole_save_sets(chain, budget)
            assert err.value.min_budget is None  # the model is an estimate: no least claimed
            continue
        answer = whole_save_sets(chain, budget)
        assert answer.optimal
        assert answer.recompute_time == pytest.approx(best, abs=1e-9)
        recs = [recompute_set(g, s) for g, s in zip(chain.graphs, answer.save_sets, strict=True)]
        fwd, bwd, loss = model_needs(chain, answer.save_sets, recs)
        assert max(fwd + bwd + [loss]) <= budget
        for k, j in itertools.combinations(range(chain.length), 2):
            if chain.groups[k] == chain.groups[j]:
                assert answer.save_sets[k] == answer.save_sets[j]


@pytest.mark.parametrize("seed", range(40))
def test_whole_milp_with_host_memory_equals_brute_force(seed):
    """Each position may keep all its saved residuals in host memory (the all-on-host
    variant): off the device between its recording and its backward, at a cost per
    byte, under a host memory limit."""
    rng = random.Random(500 + seed)
    L = rng.randint(2, 3)  # recomputation never free, small bases: where host memory pays
    graphs = [random_graph(rng, rng.randint(1, 3)) for _ in range(L)]
    graphs = [dataclasses.replace(g, cost=tuple(rng.choice([1.0, 2.5, 7.0]) for _ in g.cost))
              for g in graphs]  # fmt: skip
    chain = SaveSetChain(
        graphs=tuple(graphs),
        groups=tuple(range(L)),
        node_bytes=tuple(tuple(rng.choice([0, 1, 4]) for _ in g.cost) for g in graphs),
        fwd_base=tuple(rng.randint(0, 6) for _ in graphs),
        bwd_base=tuple(rng.randint(0, 6) for _ in graphs),
        loss_base=rng.randint(0, 6),
        host_cost=rng.choice([0.0, 0.05, 0.5]),
        host_memory=rng.choice([None, 0, 4, 12]),
    )
    for budget in (0, 6, 10, 14, 20, 30):
        best = brute_force(chain, budget)
        if best is None:
            with pytest.raises(solvers.Infeasible):
                whole_save_sets(chain, budget)
            continue
        answer = whole_save_sets(chain, budget)
        assert answer.optimal and len(answer.on_host) == chain.length
        sets, on_host = answer.save_sets, answer.on_host
        held = host_bytes(chain, sets, on_host)
        cost = answer.recompute_time + chain.host_cost * held
        assert cost == pytest.approx(best, abs=1e-5)
        recs = [recompute_set(g, s) for g, s in zip(chain.graphs, sets, strict=True)]
        fwd, bwd, loss = model_needs(chain, sets, recs, on_host)
        assert max(fwd + bwd + [loss]) <= budget
        assert chain.host_memory is None or held <= chain.host_memory
    plain = dataclasses.replace(chain, host_cost=None, host_memory=None)
    assert whole_save_sets(plain, 80).on_host == ()  # no host link: no such choice


def test_host_memory_spares_a_recomputation_by_hand():
    """Two blocks saving 8 bytes each under an 8-byte budget: the first keeps its
    residual in host memory (0.4 s of copies) rather than recomputing it (7 s)."""
    g = OptionGraph(cost=(7.0,), inputs=((),), values=(0,), value_sizes=(8,), needs=((0,),),
                    self_recompute=(False,))  # fmt: skip
    chain = SaveSetChain((g, g), (0, 1), ((8,), (8,)), (0, 0), (0, 0), 0, host_cost=0.05)
    answer = whole_save_sets(chain, 8)
    assert answer.on_host == (True, False) and answer.recompute_time == 0.0
    assert answer.save_sets == (frozenset({0}),) * 2
    tight = dataclasses.replace(chain, host_memory=7)  # no room on the host: recompute
    assert whole_save_sets(tight, 8).recompute_time == 7.0
    with pytest.raises(InvalidProblem, match="host_cost = -1"):
        dataclasses.replace(chain, host_cost=-1)


def test_zero_sizes_save_everything_for_free():
    g = OptionGraph(cost=(1.0, 2.0), inputs=((), (-1,)), values=(1,), value_sizes=(0,),
                    needs=((), (0,)), self_recompute=(False, False))  # fmt: skip
    chain = SaveSetChain((g, g), (0, 1), ((5, 5), (5, 5)), (0, 0), (0, 0), 0)
    answer = whole_save_sets(chain, 0)
    assert answer.recompute_time == 0.0 and answer.save_sets == (frozenset({0}),) * 2


def test_malformed_chains_name_the_field():
    g = OptionGraph(cost=(1.0,), inputs=((),), values=(0,), value_sizes=(4,), needs=((0,),),
                    self_recompute=(False,))  # fmt: skip
    h = OptionGraph(cost=(1.0, 1.0), inputs=((), ()), values=(0,), value_sizes=(4,),
                    needs=((0,), ()), self_recompute=(False, False))  # fmt: skip
    with pytest.raises(InvalidProblem, match="node_bytes"):
        SaveSetChain((g,), (0,), ((1, 2),), (0,), (0,), 0)
    with pytest.raises(InvalidProblem, match="share group"):
        SaveSetChain((g, h), (0, 0), ((1,), (1, 1)), (0, 0), (0, 0), 0)
    with pytest.raises(InvalidProblem, match="bwd_base"):
        SaveSetChain((g,), (0,), ((1,),), (0,), (), 0)

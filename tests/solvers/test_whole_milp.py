"""The whole-graph save-set MILP against brute force on tiny chains, corner regimes
included (zero sizes, zero costs, a base above the budget, shared groups)."""

from __future__ import annotations

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
    """Least recomputation over every save set of every group (None: none fits)."""
    groups = sorted(set(chain.groups))
    graph_of = {g: chain.graphs[chain.groups.index(g)] for g in groups}
    best = None
    per_group = [
        [frozenset(s) for r in range(len(graph_of[g].values) + 1)
         for s in itertools.combinations(range(len(graph_of[g].values)), r)]
        for g in groups
    ]  # fmt: skip
    for choice in itertools.product(*per_group):
        by_group = dict(zip(groups, choice, strict=True))
        sets = [by_group[g] for g in chain.groups]
        recs = [recompute_set(gr, s) for gr, s in zip(chain.graphs, sets, strict=True)]
        fwd, bwd, loss = model_needs(chain, sets, recs)
        if max(fwd + bwd + [loss]) > budget:
            continue
        t = sum(sum(gr.cost[i] for i in r) for gr, r in zip(chain.graphs, recs, strict=True))
        best = t if best is None else min(best, t)
    return best


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

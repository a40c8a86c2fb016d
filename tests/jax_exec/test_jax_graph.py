"""DAG models in jax_exec: profile_graph's layout and the graph runtime's exactness.

For a small residual DAG (skip adds and a long concat skip) and every graph method at
several budgets: ``run_graph`` gives the loss and gradients of plain
``jax.value_and_grad`` of the same DAG (float32, rtol 1e-5, atol 1e-6); the live bytes
after every op and each op's need equal the simulator's ``resident`` and ``op_peak``
exactly; the measured peak never exceeds the budget.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_exec
import jax_exec.graph.profile as gp
import schedir
import solvers
from jax_exec.graph.model import dag_loss, dag_params, sequential_dag
from jax_exec.graph.profile import profile_graph
from jax_exec.graph.runtime import run_graph
from schedir_cli.models import Add, Block, Concat, mse_loss, residual_dag

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)

RTOL, ATOL = 1e-5, 1e-6
METHODS = ("store_all", "chen_sqrt", "dtr", "checkmate_lp", "checkmate_milp")
FRACTIONS = (1.0, 0.5, 0.2, 0.0)  # budget = least + f * (store-all peak - least)


def _batch(shapes, out_dim, seed=0):
    keys = jax.random.split(jax.random.key(seed), len(shapes) + 1)
    inputs = {
        n: jax.random.normal(k, s, jnp.float32)
        for (n, s), k in zip(shapes.items(), keys[:-1], strict=True)
    }
    return inputs, jax.random.normal(keys[-1], (next(iter(shapes.values()))[0], out_dim))


def _reference(nodes, inputs, y):
    return jax.jit(jax.value_and_grad(dag_loss(nodes, mse_loss)))(dag_params(nodes), inputs, y)


def least_budget(graph):
    try:
        solvers.solve(graph, 1, method="dtr")
    except solvers.Infeasible as err:
        return err.min_budget
    raise AssertionError("a budget of 1 byte cannot be feasible")


def check_run(nodes, graph, schedule, inputs, y, ref, budget=None):
    result = run_graph(nodes, mse_loss, graph, schedule, inputs, y)
    trace = schedir.simulate(graph, schedule)
    assert result.resident_bytes == trace.resident
    assert result.op_peak_bytes == trace.op_peak
    assert result.peak_bytes == trace.peak_memory
    assert result.initial_bytes == trace.initial_memory
    if budget is not None:
        assert result.peak_bytes <= budget
    ref_loss, ref_grads = ref
    np.testing.assert_allclose(result.loss, ref_loss, rtol=RTOL, atol=ATOL)
    assert set(result.grads) == set(ref_grads)
    for name in ref_grads:
        got, want = (
            jax.tree_util.tree_leaves(result.grads[name]),
            jax.tree_util.tree_leaves(ref_grads[name]),
        )
        assert jax.tree_util.tree_structure(result.grads[name]) == jax.tree_util.tree_structure(
            ref_grads[name]
        )
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    return result


@pytest.fixture(scope="module")
def model():
    nodes = residual_dag(depth=2, width=16, hidden=32, in_dim=8, out_dim=4, seed=1)
    inputs, y = _batch({"x": (8, 8)}, 4)
    graph = profile_graph(nodes, mse_loss, inputs, y, timing="flops")
    peak = schedir.simulate(graph, solvers.solve(graph, 10**12, method="store_all")).peak_memory
    return {"nodes": nodes, "inputs": inputs, "y": y, "graph": graph, "peak": peak,
            "least": least_budget(graph), "ref": _reference(nodes, inputs, y)}  # fmt: skip


def test_layout(model):
    g = model["graph"]
    names = [n.name for n in g.nodes]
    assert names == [
        "x", "embed", "Rblock0", "block0", "add0", "Rblock1", "block1", "add1", "cat", "head",
        "loss", "Bhead", "Bcat", "Badd1", "Bblock1", "Badd0", "Bblock0", "Bembed",
    ]  # fmt: skip
    node = {n.name: n for n in g.nodes}

    def reads(name):
        return [g.nodes[j].name for j in node[name].inputs]

    f32 = 4
    assert node["x"].kind == "input" and node["x"].size == 8 * 8 * f32
    assert node["embed"].size == node["add0"].size == 8 * 16 * f32
    assert (
        node["cat"].size == 8 * 32 * f32 and node["loss"].size == node["head"].size == 8 * 4 * f32
    )
    assert node["Rblock0"].size > 0 and reads("Rblock0") == ["embed"]
    # the gradients of a module's inputs, one array per input
    assert node["Badd0"].size == node["embed"].size + node["block0"].size
    assert node["Bembed"].size == node["x"].size
    # a backward node reads its users' backward nodes, its node, its residuals, its inputs
    assert reads("Bembed") == ["Bblock0", "Badd0", "Bcat", "embed", "x"]
    assert reads("Bblock1") == ["Badd1", "block1", "Rblock1", "add0"]
    assert reads("Bhead") == ["loss", "head", "cat"] and reads("loss") == ["head"]
    assert all(node[n].cost > 0 for n in ("embed", "block0", "Rblock0", "Bblock0", "head"))
    assert schedir.Graph.from_dict(g.to_dict()) == g


@pytest.mark.parametrize("method", METHODS)
def test_methods_exact(model, method):
    g, least, peak = model["graph"], model["least"], model["peak"]
    ran = 0
    for f in FRACTIONS:
        budget = int(least + f * (peak - least))
        try:
            schedule = solvers.solve(g, budget, method=method)
        except solvers.Infeasible:
            assert method != "dtr"  # DTR succeeds down to its least budget
            continue
        check_run(model["nodes"], g, schedule, model["inputs"], model["y"], model["ref"], budget)
        ran += 1
    assert ran >= (len(FRACTIONS) if method in ("dtr", "checkmate_milp") else 1)


def test_recompute_and_free_inputs(model):
    """A hand-written schedule: recomputes forward nodes, computes residual nodes late,
    frees everything it can, the input x last."""
    g = model["graph"]
    i = {n.name: k for k, n in enumerate(g.nodes)}
    C, F = schedir.Compute, schedir.Free
    ops = [C(i["embed"]), C(i["block0"]), C(i["add0"]), F(i["block0"]), C(i["block1"]),
           C(i["add1"]), C(i["cat"]), F(i["add1"]), C(i["head"]), F(i["cat"]), C(i["loss"]),
           C(i["add1"]), C(i["cat"]), C(i["Bhead"]), F(i["loss"]), F(i["head"]),
           C(i["Bcat"]), F(i["cat"]), F(i["Bhead"]), C(i["Rblock1"]), C(i["Badd1"]),
           F(i["add1"]), C(i["Bblock1"]), F(i["Rblock1"]), F(i["block1"]), C(i["block0"]),
           C(i["Rblock0"]), C(i["Badd0"]), F(i["Bblock1"]), F(i["Badd1"]), F(i["add0"]),
           C(i["Bblock0"]), F(i["Rblock0"]), F(i["block0"]), C(i["Bembed"]), F(i["Bblock0"]),
           F(i["Badd0"]), F(i["Bcat"]), F(i["embed"]), F(i["x"])]  # fmt: skip
    result = check_run(model["nodes"], g, ops, model["inputs"], model["y"], model["ref"])
    assert result.resident_bytes[-1] == g.nodes[i["Bembed"]].size
    assert not model["inputs"]["x"].is_deleted()  # the caller's array is never deleted


def count_launches(monkeypatch) -> Counter:
    """Wrap every cached node kernel and loss kernel so that each launch is counted:
    ``counts[(kind, cache key)]``, kind "fwd", "res", "bwd" or "loss"."""
    import jax_exec.kernels as kernels

    counts: Counter = Counter()

    def counted(kernel, key):
        def call(*args):
            counts[key] += 1
            return kernel.call(*args)

        return replace(kernel, call=call)

    for key, k in list(gp._KERNELS.items()):
        wrapped = {kind: counted(getattr(k, kind), (kind, key)) for kind in ("fwd", "res", "bwd")}
        monkeypatch.setitem(gp._KERNELS, key, replace(k, **wrapped))
    for key, k in list(kernels._LOSS_CACHE.items()):
        monkeypatch.setitem(kernels._LOSS_CACHE, key, counted(k, ("loss", key)))
    return counts


def test_every_compute_launches_its_nodes_kernel(model, monkeypatch):
    """Issue 11, item 4: op by op, a schedule runs exactly the kernels the simulator
    priced: one launch per Compute (counted by wrapping the compiled kernels), of that
    node's kernel, and the costs of the launched kernels sum to the makespan."""
    import jax_exec.kernels as kernels

    g, nodes = model["graph"], model["nodes"]
    schedule = solvers.solve(g, model["least"], method="dtr")  # with recomputations
    dk = gp.dag_kernels(nodes, mse_loss, model["inputs"], model["y"])
    cache = {id(k): key for key, k in gp._KERNELS.items()}
    (loss_key,) = [key for key, k in kernels._LOSS_CACHE.items() if k is dk.loss]
    kernel_of, flops, label = {"loss": ("loss", loss_key)}, {"loss": dk.loss.flops}, {}
    for node in dk.dag:
        k, key = dk.kernels[node.name], cache[id(dk.kernels[node.name])]
        for kind, name in (("fwd", node.name), ("res", "R" + node.name), ("bwd", "B" + node.name)):
            kernel_of[name], flops[name] = (kind, key), getattr(k, kind).flops
            label[name] = f"{kind} {node.name}"
    label["loss"] = "loss"
    computed = [g.nodes[op.node].name for op in schedule.ops if isinstance(op, schedir.Compute)]
    assert len(computed) > len(g.computed)  # some nodes run twice
    counts = count_launches(monkeypatch)
    result = run_graph(nodes, mse_loss, g, schedule, model["inputs"], model["y"])
    assert counts == Counter(kernel_of[name] for name in computed)  # modules may share kernels
    assert [k for k in result.op_kernels if k is not None] == [label[n] for n in computed]
    # costs (timing="flops") are the launched kernels' FLOPs: their sum is the makespan
    spent = sum(flops[name] for name in computed) / 1e10
    assert spent == pytest.approx(schedir.simulate(g, schedule).makespan, rel=1e-9)


def test_sequential_model_is_the_chain_case():
    """A sequence of modules profiled as a DAG has chain_to_graph's layout (names aside):
    same kinds, edges, sizes. The chain's graph charges R{k} the whole forward and the
    forward's temporaries plus a_{k+1}; the residual kernel that runs costs no more: the
    chain's graph is never cheaper than what runs."""
    rngs = nnx.Rngs(0)
    layers = [nnx.Linear(8, 16, rngs=rngs), Block(16, 32, rngs=rngs), Block(16, 32, rngs=rngs),
              nnx.Linear(16, 4, rngs=rngs)]  # fmt: skip
    x, y = jnp.ones((8, 8)), jnp.zeros((8, 4))
    # the stage kernels' profiler (the pipelines', whose a[0] is the batch, as here)
    chain = jax_exec.parallel.profile_stages(layers, mse_loss, x, y, timing="flops")
    chain_graph = schedir.chain_to_graph(chain)
    dag_graph = profile_graph(sequential_dag(layers), mse_loss, {"x": x}, y, timing="flops")
    assert len(chain_graph) == len(dag_graph)
    for a, b in zip(chain_graph.nodes, dag_graph.nodes, strict=True):
        assert (a.kind, a.size, a.inputs) == (b.kind, b.size, b.inputs), (a.name, b.name)
        if a.name.startswith("R"):
            assert a.cost >= b.cost > 0 and a.tmp >= b.tmp
        else:
            assert (a.cost, a.tmp) == pytest.approx((b.cost, b.tmp)), (a.name, b.name)
    assert sum(n.name.startswith("R") for n in dag_graph.nodes) == 2
    # Issue 11's acceptance on the graph of a profiled chain: a schedule solved on it
    # runs op by op on the model, one kernel per Compute (the node's: a residual node
    # launches the residual kernel, which costs at most the forward it is charged), the
    # gradients of plain autodiff, the predicted bytes after every op and at most the
    # predicted need while each op runs (the chain's graph counts a whole forward's
    # temporaries for a residual node).
    dag, inputs = sequential_dag(layers), {"x": x}
    ref = _reference(dag, inputs, y)
    least = least_budget(chain_graph)
    names = [n.name for n in chain_graph.nodes]
    priced = dict(zip(names, (n.cost for n in dag_graph.nodes), strict=True))
    for method, budget in (("dtr", least), ("checkmate_milp", least)):
        schedule = solvers.solve(chain_graph, budget, method=method)
        trace = schedir.simulate(chain_graph, schedule)
        result = check_run(dag, dag_graph, schedule, inputs, y, ref, budget)
        assert result.resident_bytes == trace.resident
        assert all(m <= p for m, p in zip(result.op_peak_bytes, trace.op_peak, strict=True))
        computed = [op.node for op in schedule.ops if isinstance(op, schedir.Compute)]
        launched = [k for k in result.op_kernels if k is not None]
        assert len(launched) == len(computed)
        for i, label in zip(computed, launched, strict=True):
            node = dag_graph.nodes[i]
            kind = (
                "res" if node.name.startswith("R") else "bwd" if node.kind == "backward" else "fwd"
            )
            assert label == ("loss" if node.name == "loss" else f"{kind} {node.name.lstrip('RB')}")
            assert priced[names[i]] <= chain_graph.nodes[i].cost * (1 + 1e-12)
        assert sum(priced[names[i]] for i in computed) <= trace.makespan * (1 + 1e-12)


def test_run_dispatches_graph_schedules(model):
    schedule = solvers.solve(model["graph"], model["peak"], method="dtr")
    result = jax_exec.run(model["nodes"], mse_loss, schedule, model["inputs"], model["y"])
    assert isinstance(result, jax_exec.RunResult)
    assert result.resident_bytes == schedir.simulate(model["graph"], schedule).resident
    np.testing.assert_allclose(result.loss, model["ref"][0], rtol=RTOL, atol=ATOL)


def test_two_inputs_concat():
    rngs = nnx.Rngs(3)
    nodes = {
        "a": (nnx.Linear(6, 8, rngs=rngs), ["u"]),
        "b": (nnx.Linear(5, 8, rngs=rngs), ["v"]),
        "s": (Add(), ["a", "b"]),
        "c": (Concat(), ["s", "a", "v"]),
        "head": (nnx.Linear(21, 3, rngs=rngs), ["c"]),
    }
    inputs, y = _batch({"u": (4, 6), "v": (4, 5)}, 3, seed=5)
    g = profile_graph(nodes, mse_loss, inputs, y, timing="flops")
    assert [n.name for n in g.nodes if n.kind == "input"] == ["u", "v"]
    ref = _reference(nodes, inputs, y)
    least = least_budget(g)
    for method, budget in (("store_all", 10**9), ("dtr", least), ("checkmate_milp", least)):
        schedule = solvers.solve(g, budget, method=method)
        check_run(nodes, g, schedule, inputs, y, ref, budget)


def test_measured_timing_same_layout(model):
    g = profile_graph(
        model["nodes"], mse_loss, model["inputs"], model["y"], timing="measure", repeats=1
    )
    flops = model["graph"]
    assert [(n.name, n.size, n.tmp, n.inputs) for n in g.nodes] == [
        (n.name, n.size, n.tmp, n.inputs) for n in flops.nodes
    ]
    assert all(n.cost > 0 for n in g.nodes if n.kind != "input")


def test_errors(model):
    nodes, inputs, y, g = model["nodes"], model["inputs"], model["y"], model["graph"]
    with pytest.raises(ValueError, match="unknown input 'z'"):
        profile_graph({"a": (nnx.Linear(8, 4, rngs=nnx.Rngs(0)), ["z"])}, mse_loss, inputs, y)
    dead = {"a": (nnx.Linear(8, 4, rngs=nnx.Rngs(0)), ["x"]),
            "b": (nnx.Linear(8, 4, rngs=nnx.Rngs(1)), ["x"])}  # fmt: skip
    with pytest.raises(ValueError, match="read by no node"):
        profile_graph(dead, mse_loss, inputs, y)
    with pytest.raises(TypeError, match="nnx.Module"):
        profile_graph({"a": (lambda x: x, ["x"])}, mse_loss, inputs, y)
    with pytest.raises(ValueError, match="timing"):
        profile_graph(nodes, mse_loss, inputs, y, timing="guess")
    with pytest.raises(schedir.InvalidSchedule, match="not resident"):
        run_graph(nodes, mse_loss, g, [schedir.Compute(2)], inputs, y)
    schedule = solvers.solve(g, 10**9, method="store_all")
    other = schedir.Graph(
        tuple(replace(n, size=n.size + 4) if n.name == "add0" else n for n in g.nodes)
    )
    with pytest.raises(ValueError, match="add0.*profile the model"):
        run_graph(nodes, mse_loss, other, schedule, inputs, y)


@pytest.mark.slow
def test_deeper_dag_every_method():
    nodes = residual_dag(depth=4, width=32, hidden=64, in_dim=16, out_dim=8, seed=2)
    inputs, y = _batch({"x": (16, 16)}, 8, seed=2)
    g = profile_graph(nodes, mse_loss, inputs, y, timing="flops")
    ref = _reference(nodes, inputs, y)
    least = least_budget(g)
    peak = schedir.simulate(g, solvers.solve(g, 10**12, method="store_all")).peak_memory
    for method in METHODS:
        for f in (1.0, 0.6, 0.3, 0.1, 0.0):
            budget = int(least + f * (peak - least))
            options = {"time_limit": 30} if method == "checkmate_milp" else {}
            try:
                schedule = solvers.solve(g, budget, method=method, **options)
            except solvers.Infeasible:
                continue
            check_run(nodes, g, schedule, inputs, y, ref, budget)


def test_dag_nodes_that_change_state_or_share_parameters_are_refused():
    """A DAG node with BatchNorm in training mode, or a parameter read by two nodes,
    is refused with the node named (never run with frozen state or split gradients)."""
    rngs = nnx.Rngs(0)
    x = {"x": jnp.ones((4, 3))}
    y = jnp.ones((4, 3))
    bn = nnx.Sequential(nnx.Linear(3, 3, rngs=rngs), nnx.BatchNorm(3, rngs=rngs))
    with pytest.raises(TypeError, match="changes its state"):
        profile_graph({"a": (bn, ["x"])}, mse_loss, x, y, timing="flops")
    first = nnx.Linear(3, 3, rngs=rngs)
    second = nnx.Linear(3, 3, rngs=rngs)
    second.kernel = first.kernel  # tied weights across two nodes
    with pytest.raises(TypeError, match="share a parameter"):
        profile_graph({"a": (first, ["x"]), "b": (second, ["a"])}, mse_loss, x, y)

"""Acceptance tests of jax_exec: every chain method, several budgets, two model families.

For each (model, method, budget): the op-by-op runtime and the compiled path give the
loss and gradients of plain ``jax.value_and_grad``; the runtime's live bytes after every
op equal the simulator's, exactly, and its measured peak stays within the budget; the
residuals JAX saves at the top level of the compiled step are the buffers the schedule
holds at the loss.
"""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_reference import plain_value_and_grad

import jax_exec
import schedir
import solvers
from schedir_cli.models import mlp_stack, mse_loss, transformer_stack

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)

RTOL, ATOL = 1e-5, 1e-6


def _model(family):
    kx, ky = jax.random.split(jax.random.key(42))
    if family == "mlp":
        layers = mlp_stack(depth=4, width=32, hidden=64, in_dim=16, out_dim=8, seed=1)
        x = jax.random.normal(kx, (16, 16), jnp.float32)
        y = jax.random.normal(ky, (16, 8), jnp.float32)
    else:
        layers = transformer_stack(depth=2, dim=32, heads=4, hidden=64, in_dim=8, out_dim=4, seed=2)
        x = jax.random.normal(kx, (8, 8, 8), jnp.float32)
        y = jax.random.normal(ky, (8, 4), jnp.float32)
    chain = jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops")
    loss, grads = plain_value_and_grad(layers, mse_loss)(x, y)
    found = schedules(chain)
    return {"layers": layers, "x": x, "y": y, "chain": chain, "loss": loss, "grads": grads,
            "schedules": found}  # fmt: skip


@pytest.fixture(scope="module", params=["mlp", "transformer"])
def model(request):
    return _model(request.param)


def min_budget(chain):
    """The least budget rotor reports, raised a little until rotor actually solves it."""
    try:
        solvers.solve(chain, 1, method="rotor")
    except solvers.Infeasible as err:
        least = err.min_budget
    else:
        raise AssertionError("a budget of 1 byte cannot be feasible")
    for factor in (1.0, 1.01, 1.02, 1.05, 1.1):
        try:
            solvers.solve(chain, int(least * factor), method="rotor")
            return int(least * factor)
        except solvers.Infeasible:
            continue
    raise AssertionError(f"rotor solves nothing within 10% of its minimum {least}")


def budgets(chain):
    full = schedir.simulate_chain(chain, solvers.solve(chain, 10**12, "store_all")).peak_memory
    low = min_budget(chain)
    return {"store_all": full, "half": (full + low) // 2, "min": low}


def assert_same(got_loss, got_grads, want_loss, want_grads):
    np.testing.assert_allclose(got_loss, want_loss, rtol=RTOL, atol=ATOL)
    got_leaves, got_tree = jax.tree_util.tree_flatten(list(got_grads))
    want_leaves, want_tree = jax.tree_util.tree_flatten(list(want_grads))
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def schedules(chain):
    """(method, budget name, budget, schedule) for every chain method and budget that fits."""
    out = []
    for method in solvers.available(chain):
        for name, budget in budgets(chain).items():
            try:
                schedule = solvers.solve(chain, budget, method=method.name)
            except solvers.Infeasible:
                continue
            out.append((method.name, name, budget, schedule))
    return out


def test_every_method_runtime_matches_simulator_and_plain_gradients(model):
    chain, layers, x, y = model["chain"], model["layers"], model["x"], model["y"]
    found = model["schedules"]
    assert {m for m, *_ in found} == {m.name for m in solvers.available(chain)}
    for method, name, budget, schedule in found:
        trace = schedir.simulate_chain(chain, schedule)
        result = jax_exec.run(layers, mse_loss, schedule, x, y)
        where = f"{method} at {name} budget {budget}"
        assert result.resident_bytes == trace.resident, where
        assert result.initial_bytes == trace.initial_memory, where
        assert result.peak_bytes <= budget, where
        assert result.peak_bytes <= trace.peak_memory, where
        assert all(m <= p for m, p in zip(result.op_peak_bytes, trace.op_peak, strict=True))
        assert len(result.op_times) == len(schedule.ops)
        assert_same(result.loss, result.grads, model["loss"], model["grads"])


def check_compiled(model, selected):
    layers, x, y = model["layers"], model["x"], model["y"]
    checked = set()
    for method, name, budget, schedule in selected:
        where = f"{method} at {name} budget {budget}"
        lowered = jax_exec.stages.lower(layers, mse_loss, schedule)
        saved = jax_exec.stages.saved_activations(lowered, x, y)
        got = Counter((r.shape, r.dtype) for r in saved)
        want = jax_exec.stages.expected_activations(layers, mse_loss, schedule, x, y)
        assert got == want, f"{where}: extra {got - want}, missing {want - got}"
        if schedule.ops not in checked:  # methods often agree: compile each sequence once
            checked.add(schedule.ops)
            loss, grads = jax_exec.stages.value_and_grad(layers, mse_loss, schedule)(x, y)
            assert_same(loss, grads, model["loss"], model["grads"])


def test_compiled_path_rotor_budgets_and_every_method_once(model):
    """Rotor at every budget, every other method at its tightest budget (compiles are slow)."""
    found = model["schedules"]
    selected = [s for s in found if s[0] == "rotor"]
    for method in {m for m, *_ in found} - {"rotor"}:
        selected.append([s for s in found if s[0] == method][-1])
    assert {s[0] for s in selected} == {m.name for m in solvers.available(model["chain"])}
    check_compiled(model, selected)


@pytest.mark.slow
def test_compiled_path_every_method_every_budget(model):
    check_compiled(model, model["schedules"])


def test_saved_residuals_every_method_every_budget(model):
    """Cheap (tracing only): the residual check for every method and budget."""
    layers, x, y = model["layers"], model["x"], model["y"]
    for method, name, budget, schedule in model["schedules"]:
        lowered = jax_exec.stages.lower(layers, mse_loss, schedule)
        got = Counter((r.shape, r.dtype) for r in jax_exec.stages.saved_activations(lowered, x, y))
        want = jax_exec.stages.expected_activations(layers, mse_loss, schedule, x, y)
        assert got == want, f"{method} at {name} budget {budget}"


def test_saved_bytes_at_loss_equal_simulated_buffers(model):
    """The byte total of the top-level residuals equals the simulator's buffers at the
    loss, plus the loss stage's own residuals (its output and new residuals: the core
    lowers the loss stage like a recorded block)."""
    chain, layers, x, y = model["chain"], model["layers"], model["x"], model["y"]
    for _, _, _, schedule in model["schedules"]:
        trace = schedir.simulate_chain(chain, schedule, record_buffers=True)
        at = next(i for i, op in enumerate(schedule.ops) if isinstance(op, schedir.Loss))
        lowered = jax_exec.stages.lower(layers, mse_loss, schedule)
        saved = sum(r.nbytes for r in jax_exec.stages.saved_activations(lowered, x, y))
        # Resident bytes right before the loss op (the loss adds d[L], frees a[L]).
        before = trace.resident[at - 1]
        program = lowered.step(x, y)[0].model
        loss_stage = program.functions(program.length, 0).recipe.new_bytes + 4  # + the loss
        assert saved == before + loss_stage


# Hand-written sequences on the 6-stage MLP: tree-shaped with nested recomputation,
# and one valid sequence that is not tree-shaped.
F_ck, F_n, F_all, B, Loss = schedir.F_ck, schedir.F_n, schedir.F_all, schedir.B, schedir.Loss
NESTED = [
    F_ck(0), F_n(1), F_n(2), F_ck(3), F_n(4), F_n(5), Loss(),
    F_all(3), F_ck(4), F_all(5), B(5), F_all(4), B(4), B(3),
    F_all(0), F_ck(1), F_all(2), B(2), F_all(1), B(1), B(0),
]  # fmt: skip
RECOMPUTE_TWICE = [
    F_ck(0), F_n(1), F_n(2), F_n(3), F_n(4), F_n(5), Loss(),
    F_ck(0), F_n(1), F_n(2), F_n(3), F_all(4), F_all(5), B(5), B(4),
    F_ck(0), F_n(1), F_all(2), F_all(3), B(3), B(2),
    F_all(0), F_all(1), B(1), B(0),
]  # fmt: skip
NOT_A_TREE = [
    F_all(0), F_n(1), F_all(2), F_all(3), F_all(4), F_all(5), Loss(),
    B(5), B(4), B(3), B(2), F_all(0), F_all(1), B(1), B(0),
]  # fmt: skip


@pytest.fixture(scope="module")
def mlp():
    return _model("mlp")


@pytest.mark.parametrize("ops", [NESTED, RECOMPUTE_TWICE], ids=["nested", "twice"])
def test_hand_written_tree_schedules(mlp, ops):
    chain, layers, x, y = mlp["chain"], mlp["layers"], mlp["x"], mlp["y"]
    trace = schedir.simulate_chain(chain, ops)
    result = jax_exec.run(layers, mse_loss, ops, x, y)
    assert result.resident_bytes == trace.resident
    assert result.peak_bytes <= trace.peak_memory
    assert_same(result.loss, result.grads, mlp["loss"], mlp["grads"])
    loss, grads = jax_exec.stages.value_and_grad(layers, mse_loss, ops)(x, y)
    assert_same(loss, grads, mlp["loss"], mlp["grads"])
    lowered = jax_exec.stages.lower(layers, mse_loss, ops)
    got = Counter((r.shape, r.dtype) for r in jax_exec.stages.saved_activations(lowered, x, y))
    assert got == jax_exec.stages.expected_activations(layers, mse_loss, ops, x, y)


def test_runtime_runs_sequences_that_are_not_trees(mlp):
    chain, layers, x, y = mlp["chain"], mlp["layers"], mlp["x"], mlp["y"]
    trace = schedir.simulate_chain(chain, NOT_A_TREE)
    result = jax_exec.run(layers, mse_loss, NOT_A_TREE, x, y)
    assert result.resident_bytes == trace.resident
    assert_same(result.loss, result.grads, mlp["loss"], mlp["grads"])
    with pytest.raises(schedir.InvalidSchedule, match=r"op 1: F_n\(1\): not tree-shaped"):
        jax_exec.stages.lower(layers, mse_loss, NOT_A_TREE)


def test_runtime_frees_buffers(mlp):
    """Buffers dropped by the schedule are deleted; the batch (an argument) survives."""
    layers, x, y = mlp["layers"], mlp["x"], mlp["y"]
    result = jax_exec.run(layers, mse_loss, NESTED, x, y)
    assert result.resident_bytes[-1] == 0  # the batch is an argument: no d[0]
    assert not x.is_deleted()
    assert result.param_bytes == result.grad_bytes > 0
    assert result.batch_bytes == x.nbytes + y.nbytes

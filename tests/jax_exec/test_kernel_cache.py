"""The process-wide kernel cache (jax_exec.program.compiled): a function whose traced
program was lowered before is not lowered again, and what the traced program does not
say (constants, argument shardings, callbacks) keeps programs apart."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_exec.program import compiled
from jax_exec.program.compiled import clear_caches, kernels_of

SPEC = jax.ShapeDtypeStruct((4, 8), jnp.float32)
X = jnp.arange(32.0).reshape(4, 8)


def lowerings(fns, spec=SPEC) -> list[bool]:
    """Per function (compiled in turn), whether it was lowered (else known by its
    traced program), counted through ``compiled._lowered``."""
    lowered = []
    original = compiled._lowered

    def counting(*args, **kwargs):
        key, low = original(*args, **kwargs)
        lowered.append(low is not None)
        return key, low

    compiled._lowered = counting
    try:
        for fn in fns:
            kernels_of([((fn, spec), None)])
    finally:
        compiled._lowered = original
    return lowered


def test_a_program_traced_again_is_not_lowered_again():
    clear_caches()
    # two function objects (two blocks, two options) that trace to the same program
    first, second = (lambda x: jnp.tanh(x) @ x.T for _ in range(2))
    assert lowerings([first, second]) == [True, False]
    a, b = kernels_of([((first, SPEC), None), ((second, SPEC), None)])
    assert a is b  # one executable
    np.testing.assert_array_equal(b.call(X), jnp.tanh(X) @ X.T)


def test_constants_shardings_and_types_keep_programs_apart():
    clear_caches()
    ones, twos = np.ones((4, 8), np.float32), np.full((4, 8), 2.0, np.float32)
    # the same jaxpr text, other constants (closed over: not printed in the text)
    assert lowerings([lambda x: x * ones, lambda x: x * twos]) == [True, True]
    a, b = kernels_of([((lambda x: x * ones, SPEC), None), ((lambda x: x * twos, SPEC), None)])
    np.testing.assert_array_equal(b.call(X), X * 2.0)
    key = jax.random.key(1)  # a typed PRNG key constant: its bits count
    assert lowerings([lambda x: x + jax.random.normal(key, x.shape)] * 2) == [True, False]
    other = jax.random.key(2)
    assert lowerings([lambda x: x + jax.random.normal(other, x.shape)]) == [True]
    weak = jax.ShapeDtypeStruct((), jnp.float32, weak_type=True)
    strong = jax.ShapeDtypeStruct((), jnp.float32)
    assert lowerings([lambda x: x * 3], weak) + lowerings([lambda x: x * 3], strong) == [True, True]
    on_host = jax.ShapeDtypeStruct(
        (4, 8), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(
            jax.devices()[0], memory_kind="pinned_host")
    )  # fmt: skip
    assert lowerings([jnp.sin]) + lowerings([jnp.sin], on_host) == [True, True]


def test_a_callback_is_always_lowered():
    """A callback's lowering embeds the Python object, which the jaxpr names by its
    address only (an address a later object may reuse): never known by the text."""
    clear_caches()

    def with_callback(x):
        jax.debug.callback(lambda v: None, x)
        return x + 1

    assert lowerings([with_callback, with_callback]) == [True, True]


@pytest.mark.slow  # a clear in a default-run worker compiles again what its later tests share
def test_plans_made_before_a_clear_run_and_replan_the_same():
    """docs/auto.md ("Planning exactly"): the caches are never evicted, and a process
    that plans many models clears them; a plan made before runs, replans and plans
    through ``value_and_grad`` as it did (its kernels compile again)."""
    import zoo

    import jax_exec

    case = zoo.case("vae")
    p = jax_exec.plan(case.loss_fn, case.factory(), *case.args, budget="65%")
    before = p.run(case.factory(), *case.args)
    smaller = p.replan("50%")
    clear_caches()
    after = p.run(case.factory(), *case.args)
    assert after.peak_bytes == before.peak_bytes == p.schedule.meta["peak_memory"]
    np.testing.assert_array_equal(after.loss, before.loss)
    again = p.replan("50%")
    assert (again.options, again.schedule.ops) == (smaller.options, smaller.schedule.ops)
    clear_caches()
    step = jax_exec.value_and_grad(case.loss_fn, budget=p.budget)
    loss, _ = step(case.factory(), *case.args)
    np.testing.assert_allclose(loss, before.loss, rtol=1e-6)


def test_the_caches_are_kept_below_half_the_mapping_limit(monkeypatch):
    """:func:`compiled.bound_caches` reads this process's mappings (Linux) and keeps the
    caches while they are under half the limit."""
    count = compiled.mapping_count()
    if count is not None:  # Linux
        held, limit = count
        assert 0 < held and 0 < limit
    compiled._KERNELS["a kept kernel"] = None
    try:
        monkeypatch.setattr(compiled, "mapping_count", lambda: (100, 201))
        assert not compiled.bound_caches()
        assert "a kept kernel" in compiled._KERNELS
    finally:
        del compiled._KERNELS["a kept kernel"]


def test_past_half_the_mapping_limit_the_caches_are_cleared_with_a_warning(monkeypatch, caplog):
    """The decision and its message (the clear itself is a recorder here: a real one in
    a default-run worker compiles again what its later tests share; the slow test below
    clears for real)."""
    cleared = []
    monkeypatch.setattr(compiled, "clear_caches", lambda: cleared.append(True))
    monkeypatch.setattr(compiled, "mapping_count", lambda: (102, 201))
    with caplog.at_level("WARNING", logger="jax_exec"):
        assert compiled.bound_caches()
    assert cleared == [True]
    assert "held 102 of the 201 memory mappings" in caplog.text


@pytest.mark.slow  # a clear in a default-run worker compiles again what its later tests share
def test_a_process_near_the_mapping_limit_clears_the_caches_and_plans_the_same(monkeypatch, caplog):
    """Past half the memory mappings the system allows (each kernel holds some; past the
    limit LLVM fails and the process crashes), a new model's planning clears the caches
    first, says so, and plans as it did; a plan made before still runs."""
    import zoo

    import jax_exec

    case = zoo.case("vae")
    p = jax_exec.plan(case.loss_fn, case.factory(), *case.args, budget="65%")
    before = p.run(case.factory(), *case.args)
    compiled._KERNELS["a stale kernel"] = None
    monkeypatch.setattr(compiled, "mapping_count", lambda: (40_000, 65_530))
    with caplog.at_level("WARNING", logger="jax_exec"):
        again = jax_exec.plan(case.loss_fn, case.factory(), *case.args, budget="65%")
    assert "a stale kernel" not in compiled._KERNELS
    assert "40000 of the 65530 memory mappings" in caplog.text
    assert (again.options, again.schedule.ops) == (p.options, p.schedule.ops)
    assert again.schedule.meta["peak_memory"] == p.schedule.meta["peak_memory"]
    after = p.run(case.factory(), *case.args)
    np.testing.assert_array_equal(after.loss, before.loss)
    assert after.peak_bytes == before.peak_bytes

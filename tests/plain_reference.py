"""Plain ``nnx.value_and_grad``, the reference every executed schedule is checked against,
and the comparison it is checked with.

Gradients are compared with a tolerance relative to the largest gradient leaf's norm,
not to each leaf's own: a leaf whose exact gradient is zero by symmetry (an attention
key bias, a bias ahead of a normalization) holds rounding noise of the size of the other
leaves' rounding, which a per-leaf relative test would call an error. float32 sums
reassociated by another schedule (recomputation, loops, other fusions) differ by a few
ulps of the largest terms: 1e-5 of the largest norm is what rounding explains on these
tiny models (the largest difference seen on the zoo and the random models is 2e-6).
Ill-conditioned models amplify rounding beyond that: :func:`assert_within_rounding`
judges them against the float64 result (:func:`float64_reference`) instead."""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

RTOL = 1e-5

# How much further from the exact (float64) result a schedule's float32 result may be
# than plain autodiff's own: where a step is ill-conditioned (a BatchNorm over a tiny
# batch whose variance nearly cancels: 4 random models of 1,100 at XLA's default level)
# rounding is amplified, and another association of the same sums (recomputation, other
# fusions, the op-by-op kernels) lands elsewhere near the exact result, about as far from
# it as plain does (0.74x to 1.94x there); a wrong result is off by a share of the
# scale, far beyond.
ROUNDING_FACTOR = 4


def plain(factory, loss_fn, args, has_aux: bool = False):
    """``(loss, aux, grads, state)`` of plain ``nnx.value_and_grad`` under ``nnx.jit``
    on a fresh model (``state``: :func:`model_state` after the call)."""
    model = factory()
    out, grads = nnx.jit(nnx.value_and_grad(loss_fn, has_aux=has_aux))(model, *args)
    loss, aux = out if has_aux else (out, None)
    return loss, aux, grads, model_state(model)


def model_state(model):
    """The model's variables other than its parameters (BatchNorm statistics, RNG
    counters...): what a training step updates besides the gradients."""
    return nnx.split(model, nnx.Param, ...)[2]


def distance(a, b=0.0) -> float:
    """The norm of ``a - b`` computed in float64 (complex128 where either is complex:
    both parts count)."""
    a, b = np.asarray(a), np.asarray(b)
    wide = np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(b) else np.float64
    return float(np.linalg.norm(a.astype(wide) - b.astype(wide)))


def scale_of(tree) -> float:
    norms = [distance(x) for x in jax.tree.leaves(tree)]
    return max(norms, default=0.0) or 1.0


def assert_tree_close(got, want, what: str, rtol: float = RTOL) -> None:
    """Same structure; every leaf within ``rtol`` of the largest leaf's norm."""
    gl, wl = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(gl) == len(wl), f"{what}: {len(gl)} leaves, expected {len(wl)}"
    scale = scale_of(want)
    for i, (g, w) in enumerate(zip(gl, wl, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: leaf {i} {g.shape} {w.shape}"
        if not np.issubdtype(w.dtype, np.inexact):
            np.testing.assert_array_equal(g, w, err_msg=f"{what}: leaf {i}")
            continue
        err = distance(g, w)
        assert err <= rtol * scale, f"{what}: leaf {i} off by {err / scale:.2e} of the scale"


def state_arrays(state) -> list:
    """The arrays of an ``nnx.State`` (RNG keys as their key data)."""
    out = []
    for leaf in jax.tree.leaves(state):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out.append(leaf)
    return out


def assert_matches(
    got_loss, got_grads, got_state, reference, what: str, got_aux=None, exact=None
) -> None:
    """Loss, gradients, state (and aux) equal plain autodiff's (``reference`` from
    :func:`plain`). With ``exact`` (a callable giving :func:`float64_reference`'s
    result), a figure that differs from plain's by more than ``RTOL`` passes if it is
    no further from the exact result than ``ROUNDING_FACTOR`` times plain's own float32
    result is (:func:`assert_within_rounding`)."""
    loss, aux, grads, state = reference
    try:
        np.testing.assert_allclose(float(got_loss), float(loss), rtol=RTOL, err_msg=f"{what}: loss")
        assert_tree_close(got_grads, grads, f"{what}: gradients")
        if got_state is not None:
            assert_tree_close(state_arrays(got_state), state_arrays(state), f"{what}: state")
        if aux is not None:
            assert_tree_close(got_aux, aux, f"{what}: aux")
    except AssertionError:
        if exact is None:
            raise
        got = (got_loss, got_aux, got_grads, got_state)
        assert_within_rounding(got, reference, exact(), what)


def float64_reference(factory, loss_fn, args, has_aux: bool = False):
    """:func:`plain`'s ``(loss, aux, grads, state)`` in float64 (the float leaves of the
    parameters, the state and the arguments cast): the exact result that float32
    rounding departs from."""

    def wide(tree):  # (a Python scalar argument stays as it is)
        return jax.tree.map(
            lambda x: (
                x.astype(jnp.float64)
                if jnp.issubdtype(jnp.result_type(x), jnp.floating) and hasattr(x, "astype")
                else x
            ),
            tree,
        )

    with jax.enable_x64(True):
        graphdef, params, rest = nnx.split(factory(), nnx.Param, ...)
        model = nnx.merge(graphdef, wide(params), wide(rest))
        out, grads = nnx.value_and_grad(loss_fn, has_aux=has_aux)(model, *wide(tuple(args)))
        loss, aux = out if has_aux else (out, None)
        return loss, aux, grads, model_state(model)


def assert_within_rounding(got, plain_result, exact, what: str) -> None:
    """Each float leaf of ``got`` (``(loss, aux, grads, state)``, as :func:`plain` gives)
    is no further from ``exact``'s (:func:`float64_reference`) than ``ROUNDING_FACTOR``
    times the largest distance of ``plain_result``'s leaves of the same part from theirs
    (the rounding this model's part shows), or than ``RTOL`` of the part's scale (its
    largest leaf's norm); other leaves equal. Per part, not per leaf: where plain's
    rounding happens to cancel on one leaf, the schedule's need not."""

    parts = ("loss", "aux", "gradients", "state")
    for part, g, p, e in zip(parts, got, plain_result, exact, strict=True):
        if part == "state":
            if g is None:
                continue
            g, p, e = state_arrays(g), state_arrays(p), state_arrays(e)
        g, p, e = jax.tree.leaves(g), jax.tree.leaves(p), jax.tree.leaves(e)
        assert len(g) == len(p) == len(e), f"{what}: {part}: {len(g)} leaves, expected {len(p)}"
        inexact = [np.issubdtype(np.asarray(x).dtype, np.inexact) for x in p]
        scale = scale_of(e)
        pairs = zip(p, e, inexact, strict=True)
        rounding = max((distance(x, y) for x, y, f in pairs if f), default=0.0)
        allowed = max(ROUNDING_FACTOR * rounding, RTOL * scale)
        for i, (gl, pl, el, f) in enumerate(zip(g, p, e, inexact, strict=True)):
            if not f:
                np.testing.assert_array_equal(gl, pl, err_msg=f"{what}: {part} leaf {i}")
                continue
            assert distance(gl, el) <= allowed, (
                f"{what}: {part} leaf {i} is {distance(gl, el) / scale:.2e} of the scale from the "
                f"float64 result; plain's leaves up to {rounding / scale:.2e}"
            )


def check_plan(case, p, reference, what: str, exact=None, compiled: bool = True):
    """Plan ``p`` of ``case`` op by op (measured peak = predicted <= budget) and
    compiled (unless ``compiled`` is False: a caller that runs the same plan compiled
    otherwise, as ``value_and_grad`` does): loss, gradients and state equal
    ``reference`` (:func:`plain`; ``exact``: see :func:`assert_matches`). Returns the
    op-by-op run's result."""
    model = case.factory()
    result = p.run(model, *case.args)  # (modifies no argument: the model serves again)
    assert result.peak_bytes == p.schedule.meta["peak_memory"] <= p.budget, what
    assert_matches(
        result.loss, result.grads, result.new_state, reference, f"{what}, op by op",
        exact=exact,
    )  # fmt: skip
    if not compiled:
        return result
    _, params, rest = nnx.split(model, nnx.Param, ...)
    step = jax.jit(jax.value_and_grad(p.lowered(), has_aux=True))
    (loss, (_, new_rest)), grads = step(params, rest, case.args)
    assert_matches(loss, grads, new_rest, reference, f"{what}, compiled", exact=exact)
    return result


def saved_in_host(fn, *args) -> Counter:
    """``(shape, dtype)`` of what JAX saves at the top level of ``jax.vjp(fn, *args)`` in
    host memory (``pinned_host``; on CPU the same RAM, so the placement is what can be
    checked)."""
    from jax_exec.execute.residuals import saved_residuals

    return Counter(
        (tuple(int(d) for d in aval.shape), str(aval.dtype))
        for aval, _ in saved_residuals(fn, *args)
        if "host" in str(getattr(aval, "memory_space", "")).lower()
    )


def host_residuals(case, p) -> Counter:
    """:func:`saved_in_host` of plan ``p``'s compiled step."""
    _, params, rest = nnx.split(case.factory(), nnx.Param, ...)
    lowered = p.lowered()
    return saved_in_host(lambda q, r, a: lowered(q, r, a)[0], params, rest, case.args)


def expected_host(plan) -> Counter:
    """``(shape, dtype)`` of the residuals in host memory (host-memory variants') of the
    recordings held at the plan's ``Loss`` op: what its compiled step saves at its top
    level in host memory (no whole buffer offloaded)."""
    from schedir import Loss
    from schedir.blocks.simulate import simulate_blocks

    model, schedule = plan.model, plan.schedule
    trace = simulate_blocks(model.problem, schedule, record_buffers=True)
    at = next(i for i, op in enumerate(schedule.ops) if isinstance(op, Loss))
    found = Counter()
    for name in trace.buffers[at - 1]:
        kind, c = name.rstrip("]").split("[")
        if kind == "abar":
            k = int(c) - 1
            new = model.functions(k, plan.options[k]).recipe.new
            for i in model.host_residuals(k, plan.options[k]):
                found[(tuple(int(d) for d in new[i].shape), str(new[i].dtype))] += 1
    return found

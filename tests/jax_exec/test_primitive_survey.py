"""Every primitive that ``jax.numpy``, ``jax.nn``, ``jax.lax``, ``jax.random``,
``jax.scipy.special``, ``jax.image`` and Flax's layers emit is classified by the planner
(jax_exec/program/primitives.py): the survey calls every public function of those modules
on a few argument patterns, and every layer forward and backward, collects the primitives of
their jaxprs, and fails on one the planner does not know. A new JAX release that adds a
primitive shows up here, not in a user's model. (Unknown primitives are charged as stored
by XLA with a warning, a conservative fallback tested below; effects and collectives are
refused.)"""

from __future__ import annotations

import inspect
import warnings

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jax_exec import auto
from jax_exec.program import primitives

# Not the planner's: refused by name (collectives, regions of several devices) or as
# side effects (dce_sink carries an effect), inlined by the trace (jit), or JAX tokens.
NOT_PLANNED = primitives.COLLECTIVE | primitives.MULTI_DEVICE | {"jit", "pjit", "dce_sink"}
TOKENS = {"create_token"}  # a token has no shape: only effectful code (refused) uses one
MODULES = {
    "jnp": jnp,
    "jax.nn": jax.nn,
    "jax.lax": jax.lax,
    "jnp.linalg": jnp.linalg,
    "jnp.fft": jnp.fft,
    "jax.scipy.special": jax.scipy.special,
    "jax.image": jax.image,
    "jax.lax.linalg": jax.lax.linalg,
}


def _arguments():
    x = jnp.linspace(0.1, 0.9, 16).reshape(4, 4)
    v = jnp.linspace(0.1, 0.9, 4)
    i = jnp.arange(16, dtype=jnp.int32).reshape(4, 4) % 4
    iv = jnp.arange(4, dtype=jnp.int32)
    b = x > 0.5
    return [
        (x,), (x, x), (i,), (i, i), (x, i), (b,), (x, 2), (x, 0), (x, 1), (x, -1),
        (x, (4, 4)), (x, x, x), ((4, 4),), (4,), (x, 1.5), (x, 0.5), (b, x, x), ((x, x),),
        (v,), (v, v), (v, 2.0), (iv,), (v, x), (x + 1j * x,), (v, iv), (x, iv), (iv, v),
    ]  # fmt: skip


def _primitives(jaxpr, found: set) -> set:
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(item, "jaxpr", item)
                if hasattr(inner, "eqns"):
                    _primitives(inner, found)
    return found


def _fitting(fn, patterns: list) -> list:
    """The patterns whose number of arguments ``fn``'s signature accepts."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return patterns
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return patterns
    required = sum(1 for p in positional if p.default is p.empty)
    return [a for a in patterns if required <= len(a) <= len(positional)]


def _survey_functions(per_function: int | None) -> dict[str, set[str]]:
    """Primitives by the functions that emit them, from at most ``per_function``
    argument patterns each function accepts (None: every pattern)."""
    found: dict[str, set[str]] = {}
    key = jax.random.key(0)
    x = jnp.ones((4, 4))
    random_args = [(key,), (key, (4,)), (key, x), (key, 0.5), (key, x, x), (key, 3, (4,)),
                   (key, (4,), 0, 3)]  # fmt: skip
    modules = {**MODULES, "jax.random": jax.random}
    for label, module in modules.items():
        patterns = random_args if label == "jax.random" else _arguments()
        for name in sorted(dir(module)):
            fn = getattr(module, name)
            if name.startswith("_") or not callable(fn) or inspect.isclass(fn):
                continue
            accepted = 0
            for args in _fitting(fn, patterns):
                if per_function is not None and accepted >= per_function:
                    break
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        closed = jax.make_jaxpr(lambda fn=fn, args=args: fn(*args))()
                except Exception:  # noqa: BLE001 - a pattern the function does not take
                    continue
                accepted += 1
                for p in _primitives(closed.jaxpr, set()):
                    found.setdefault(p, set()).add(f"{label}.{name}")
    return found


def _survey_layers() -> dict[str, set[str]]:
    rngs = nnx.Rngs(0)
    img, seq = jnp.ones((2, 8, 8, 4)), jnp.ones((2, 6, 8))
    tok = jnp.zeros((2, 6), jnp.int32)
    layers = {
        "Linear": (nnx.Linear(8, 8, rngs=rngs), seq),
        "Conv": (nnx.Conv(4, 4, (3, 3), rngs=rngs), img),
        "depthwise Conv": (nnx.Conv(4, 4, (3, 3), feature_group_count=4, rngs=rngs), img),
        "ConvTranspose": (nnx.ConvTranspose(4, 4, (3, 3), strides=2, rngs=rngs), img),
        "BatchNorm": (nnx.BatchNorm(4, rngs=rngs), img),
        "LayerNorm": (nnx.LayerNorm(8, rngs=rngs), seq),
        "RMSNorm": (nnx.RMSNorm(8, rngs=rngs), seq),
        "GroupNorm": (nnx.GroupNorm(4, num_groups=2, rngs=rngs), img),
        "Embed": (nnx.Embed(10, 8, rngs=rngs), tok),
        "Dropout": (nnx.Dropout(0.5, rngs=rngs), seq),
        "MultiHeadAttention": (nnx.MultiHeadAttention(2, 8, decode=False, rngs=rngs), seq),
        "Einsum": (nnx.Einsum("btd,dh->bth", (8, 4), rngs=rngs), seq),
        "LinearGeneral": (nnx.LinearGeneral(8, (2, 4), rngs=rngs), seq),
        "LSTM": (nnx.RNN(nnx.OptimizedLSTMCell(8, 8, rngs=rngs)), seq),
        "GRU": (nnx.RNN(nnx.GRUCell(8, 8, rngs=rngs)), seq),
    }
    found: dict[str, set[str]] = {}
    for name, (layer, arg) in layers.items():
        graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

        def loss(params, rest, arg, graphdef=graphdef):
            out = nnx.merge(graphdef, params, rest, copy=True)(arg)
            return jnp.sum(out.astype(jnp.float32) ** 2)

        for what, fn in (("", loss), (" backward", jax.grad(loss))):
            for p in _primitives(jax.make_jaxpr(fn)(params, rest, arg).jaxpr, set()):
                found.setdefault(p, set()).add(f"nnx.{name}{what}")
    for name in ("avg_pool", "max_pool", "min_pool"):
        pool = getattr(nnx, name)
        closed = jax.make_jaxpr(jax.grad(lambda x, pool=pool: pool(x, (2, 2), (2, 2)).sum()))(img)
        for p in _primitives(closed.jaxpr, set()):
            found.setdefault(p, set()).add(f"nnx.{name}")
    return found


def _check(found: dict[str, set[str]], least: int) -> None:
    assert len(found) > least  # the survey reaches the libraries
    unknown = {
        p: sorted(where)[:3]
        for p, where in found.items()
        if primitives.classified(p) is None and p not in NOT_PLANNED | TOKENS
    }
    assert not unknown, f"primitives the planner does not classify (add them): {unknown}"


def test_every_primitive_of_jax_and_flax_is_classified():
    """The first argument pattern each function takes (every pattern: below)."""
    found = _survey_functions(per_function=1)
    for p, where in _survey_layers().items():
        found.setdefault(p, set()).update(where)
    _check(found, 120)  # 155 primitives with JAX 0.10, as with every pattern


@pytest.mark.slow
def test_every_primitive_of_every_argument_pattern_is_classified():
    _check(_survey_functions(per_function=None), 140)  # 155 with the layers, JAX 0.10


def test_an_unknown_primitive_is_charged_as_stored_with_a_warning(monkeypatch):
    """A primitive missing from the tables (tile, here) plans with a warning naming it
    and runs exactly; the class token of a ViT is made with jnp.tile."""
    monkeypatch.setattr(primitives, "LAYOUT", primitives.LAYOUT - {"tile"})
    monkeypatch.setattr(primitives, "_WARNED", set())

    class ClassToken(nnx.Module):
        def __init__(self, rngs):
            self.token = nnx.Param(jnp.zeros((1, 1, 8)))
            self.dense = nnx.Linear(8, 8, rngs=rngs)

        def __call__(self, x):
            cls = jnp.tile(self.token[...], (x.shape[0], 1, 1))
            return self.dense(jnp.concatenate([cls, x], axis=1))

    def loss_fn(model, x):
        return jnp.mean(model(x) ** 2)

    x = jnp.ones((2, 4, 8))
    with pytest.warns(UserWarning, match="operation tile at .* not known to the planner"):
        p = auto.plan(loss_fn, ClassToken(nnx.Rngs(0)), x, budget="100%")
    result = p.run(ClassToken(nnx.Rngs(0)), x)
    assert result.peak_bytes == p.schedule.meta["peak_memory"] <= p.budget
    loss, grads = nnx.value_and_grad(loss_fn)(ClassToken(nnx.Rngs(0)), x)
    assert jnp.allclose(result.loss, loss)
    for a, b in zip(jax.tree.leaves(result.grads), jax.tree.leaves(grads), strict=True):
        assert jnp.allclose(a, b, atol=1e-6)


def test_every_primitive_of_jax_experimental_sparse_is_classified():
    """The primitives that ``jax.experimental.sparse``'s formats define (found in its
    modules, not listed by hand): a graph network over a ``BCOO`` adjacency plans
    without a warning (tests/feature_models_science.py's ``sparse_gcn``)."""
    from jax.experimental.sparse import bcoo, bcsr, coo, csr

    found = {
        value.name
        for module in (bcoo, bcsr, coo, csr)
        for value in vars(module).values()
        if isinstance(value, jax.extend.core.Primitive)
    }
    assert len(found) > 20
    unknown = sorted(p for p in found if primitives.classified(p) is None)
    assert not unknown, f"sparse primitives the planner does not classify (add them): {unknown}"

"""jax_exec on models written the way Flax NNX users write them (issue 11, items 1-5).

Whole modules with their own ``__call__`` (refused), BatchNorm and Dropout (eval mode
accepted and read at call time; training mode refused), a layer reading an RNG key
held in a variable, tied weights (an embedding reused as the output projection),
integer token inputs. The oracle is ``nnx.value_and_grad`` of the whole model,
gradients matched per ``nnx.Param`` object.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jax_exec
import schedir
import solvers
from schedir import B, F_all, F_ck, F_n, Loss, Offload, OffloadProblem, Platform, Prefetch, Wait
from schedir_cli.models import mse_loss

# one worker runs this file's tests: its module fixture is built once (make test: xdist)
pytestmark = pytest.mark.xdist_group(__name__)

RTOL, ATOL = 1e-5, 1e-6


class Block(nnx.Module):
    """x + dropout(gelu(BatchNorm(W x))): eval mode unless ``train``."""

    def __init__(self, width: int, *, rngs: nnx.Rngs, train: bool = False) -> None:
        self.lin = nnx.Linear(width, width, rngs=rngs)
        self.bn = nnx.BatchNorm(width, use_running_average=not train, rngs=rngs)
        self.drop = nnx.Dropout(0.5, deterministic=not train, rngs=rngs)
        key = rngs.params()  # statistics that are not the initial 0 / 1
        self.bn.mean.set_value(0.1 * jax.random.normal(key, (width,)))
        self.bn.var.set_value(1.0 + jax.random.uniform(key, (width,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.drop(jax.nn.gelu(self.bn(self.lin(x))))


class TiedHead(nnx.Module):
    """Logits against the embedding table: the embedding is the output projection."""

    def __init__(self, embed: nnx.Embed, width: int, *, rngs: nnx.Rngs) -> None:
        self.embed = embed
        self.norm = nnx.LayerNorm(width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.embed.attend(self.norm(x))


class Noise(nnx.Module):
    """Adds noise drawn from a key held in a variable (read, never advanced)."""

    def __init__(self, seed: int) -> None:
        self.key = nnx.Variable(jax.random.key(seed))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + 0.1 * jax.random.normal(self.key.get_value(), x.shape)


class LM(nnx.Module):
    """A model as users write it: embedding, ``self.layers``, a head, its own __call__."""

    def __init__(self, vocab: int, width: int, *, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(vocab, width, rngs=rngs)
        self.layers = nnx.List([Block(width, rngs=rngs) for _ in range(2)])
        self.head = nnx.Linear(width, vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Stack(nnx.Module):
    """The plain model of a stage list: the reference for nnx.value_and_grad."""

    def __init__(self, layers: list) -> None:
        self.layers = nnx.List(layers)

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return x


VOCAB, WIDTH = 11, 8


def xent(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()


def tied_lm(seed: int = 0, train: bool = False) -> list:
    rngs = nnx.Rngs(seed)
    embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
    blocks = [Block(WIDTH, rngs=rngs, train=train) for _ in range(2)]
    return [embed, *blocks, TiedHead(embed, WIDTH, rngs=rngs)]


def tokens(seed: int) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (4, 6), 0, VOCAB, jnp.int32)


def is_variable(v) -> bool:
    return isinstance(v, nnx.Variable)


def reference(layers, loss_fn, x, y):
    """Loss and {id(nnx.Param): gradient} of the whole model, by nnx.value_and_grad."""
    stack = Stack(layers)
    loss, grads = nnx.value_and_grad(lambda m: loss_fn(m(x), y))(stack)
    params = nnx.to_flat_state(nnx.state(stack, nnx.Param))
    flat = nnx.to_flat_state(grads)
    assert [p for p, _ in params] == [p for p, _ in flat]
    return loss, {id(v): g.get_value() for (_, v), (_, g) in zip(params, flat, strict=True)}


def owned_params(layers) -> list[list]:
    """Per layer, the nnx.Param objects it reads that no earlier layer reads."""
    seen, out = set(), []
    for layer in layers:
        flat = nnx.to_flat_state(nnx.state(layer, nnx.Param)) if is_module(layer) else []
        out.append([v for _, v in flat if id(v) not in seen])
        seen |= {id(v) for _, v in flat}
    return out


def is_module(layer) -> bool:
    return isinstance(layer, nnx.Module)


def by_variable(layers, per_layer):
    """{id(nnx.Param): leaf} of a per-layer list shaped like the API's parameter list."""
    out = {}
    for owned, tree in zip(owned_params(layers), per_layer, strict=True):
        leaves = jax.tree.leaves(tree)
        assert len(owned) == len(leaves), "not one leaf per parameter the layer owns"
        for v, leaf in zip(owned, leaves, strict=True):
            out[id(v)] = leaf
    return out


def assert_matches(layers, loss, grads, want_loss, want):
    np.testing.assert_allclose(loss, want_loss, rtol=RTOL, atol=ATOL)
    got = by_variable(layers, grads)
    assert got.keys() == want.keys()
    for k, g in got.items():
        np.testing.assert_allclose(g, want[k], rtol=RTOL, atol=ATOL)


# A segment over the embedding and a block, so the tied table enters a checkpoint
# region and a record (the head); and a nested recomputation.
SEGMENT = [F_ck(0), F_n(1), F_all(2), F_all(3), Loss(), B(3), B(2), F_all(0), F_all(1), B(1), B(0)]
NESTED = [
    F_ck(0), F_n(1), F_n(2), F_all(3), Loss(), B(3),
    F_ck(0), F_n(1), F_all(2), B(2), F_all(0), F_all(1), B(1), B(0),
]  # fmt: skip
STORE_ALL = [F_all(0), F_all(1), F_all(2), F_all(3), Loss(), B(3), B(2), B(1), B(0)]


# Item 1: a module with its own __call__ is refused at every entry point.


def entry_points(layers, loss_fn, x, y):
    ops = STORE_ALL
    yield "as_stages", lambda: jax_exec.stages.as_stages(layers)
    yield "profile", lambda: jax_exec.stages.profile(layers, loss_fn, x, y, timing="flops")
    yield "plan_stages", lambda: jax_exec.stages.plan(layers, loss_fn, x, y, 10**9, timing="flops")
    yield "lower", lambda: jax_exec.stages.lower(layers, loss_fn, ops)
    yield "stages_value_and_grad", lambda: jax_exec.stages.value_and_grad(layers, loss_fn, ops)
    yield "run", lambda: jax_exec.run(layers, loss_fn, ops, x, y)
    yield (
        "expected_activations",
        lambda: jax_exec.stages.expected_activations(layers, loss_fn, ops, x, y),
    )
    yield "run with copies", lambda: jax_exec.run(layers, loss_fn, OFFLOAD, x, y)


def test_module_with_its_own_call_is_refused_everywhere():
    model = LM(VOCAB, WIDTH, rngs=nnx.Rngs(0))
    x, y = tokens(1), tokens(2)
    for _, call in entry_points(model, xent, x, y):
        with pytest.raises(
            TypeError, match=r"layers is a LM \(an nnx.Module with its own __call__\)"
        ):
            call()
        with pytest.raises(
            TypeError, match="or an nnx.Sequential whose __call__ is not overridden"
        ):
            call()


class Residual(nnx.Sequential):
    def __call__(self, x):
        return x + super().__call__(x)


def test_sequential_subclass_with_call_and_other_containers_are_refused():
    rngs = nnx.Rngs(0)
    with pytest.raises(TypeError, match="Residual, an nnx.Sequential that overrides __call__"):
        jax_exec.stages.as_stages(Residual(nnx.Linear(4, 4, rngs=rngs)))
    with pytest.raises(TypeError, match="layers is a dict: a DAG model"):
        jax_exec.stages.as_stages({"a": nnx.Linear(4, 4, rngs=rngs)})
    with pytest.raises(TypeError, match="layers is a Linear"):
        jax_exec.run(nnx.Linear(4, 4, rngs=rngs), mse_loss, [F_all(0), Loss(), B(0)], 1, 1)
    with pytest.raises(TypeError, match="layers is a generator"):
        jax_exec.stages.as_stages(m for m in [nnx.Linear(4, 4, rngs=rngs)])


def test_real_sequential_with_functions_matches_nnx():
    rngs = nnx.Rngs(0)
    model = nnx.Sequential(
        nnx.Linear(4, 8, rngs=rngs), jax.nn.relu, nnx.Linear(8, 8, rngs=rngs), jnp.tanh,
        nnx.Linear(8, 2, rngs=rngs),
    )  # fmt: skip
    x = jax.random.normal(jax.random.key(0), (5, 4))
    y = jax.random.normal(jax.random.key(1), (5, 2))
    want_loss, want = nnx.value_and_grad(lambda m: mse_loss(m(x), y))(model)
    want_leaves = jax.tree.leaves(want)
    chain = jax_exec.stages.profile(model, mse_loss, x, y, timing="flops")
    assert chain.names[:5] == ("0:Linear", "1:relu", "2:Linear", "3:tanh", "4:Linear")
    schedule = solvers.solve(chain, solvers.chain.rotor.min_memory(chain) * 3 // 2, method="rotor")
    result = jax_exec.run(model, mse_loss, schedule, x, y)
    assert result.resident_bytes == schedir.simulate_chain(chain, schedule).resident
    loss, grads = jax_exec.stages.value_and_grad(model, mse_loss, schedule)(x, y)
    for got_loss, got in ((result.loss, result.grads), (loss, grads)):
        np.testing.assert_allclose(got_loss, want_loss, rtol=RTOL, atol=ATOL)
        assert jax.tree.leaves(got[1]) == [] and jax.tree.leaves(got[3]) == []
        for g, w in zip(jax.tree.leaves(got), want_leaves, strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


# Item 2: state is read when a step runs; state changed while running is refused.


def noisy_mlp(seed: int = 0) -> list:
    rngs = nnx.Rngs(seed)
    return [nnx.Linear(6, WIDTH, rngs=rngs), Block(WIDTH, rngs=rngs), Noise(seed + 1),
            Block(WIDTH, rngs=rngs), nnx.Linear(WIDTH, 3, rngs=rngs)]  # fmt: skip


def test_state_is_read_at_call_time_on_both_paths():
    layers = noisy_mlp()
    x = jax.random.normal(jax.random.key(0), (5, 6))
    y = jax.random.normal(jax.random.key(1), (5, 3))
    ops = [F_ck(0), F_n(1), F_n(2), F_all(3), F_all(4), Loss(), B(4), B(3),
           F_all(0), F_ck(1), F_all(2), B(2), F_all(1), B(1), B(0)]  # fmt: skip
    step = jax_exec.stages.value_and_grad(layers, mse_loss, ops)
    lowered = jax_exec.stages.lower(layers, mse_loss, ops)
    params = lowered.params()
    loss0, _ = step(x, y)
    # change batch statistics and the noise key after the step was built
    layers[1].bn.mean.set_value(layers[1].bn.mean.get_value() + 0.5)
    layers[3].bn.var.set_value(2.0 * layers[3].bn.var.get_value())
    layers[2].key.set_value(jax.random.key(99))
    want_loss, want = reference(layers, mse_loss, x, y)
    assert abs(float(want_loss) - float(loss0)) > 1e-3  # the change matters
    loss, grads = step(x, y)
    assert_matches(layers, loss, grads, want_loss, want)
    result = jax_exec.run(layers, mse_loss, ops, x, y)
    assert_matches(layers, result.loss, result.grads, want_loss, want)
    chain = jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops")
    assert result.resident_bytes == schedir.simulate_chain(chain, ops).resident
    np.testing.assert_allclose(lowered.loss(params, x, y), want_loss, rtol=RTOL)  # state now
    old_state = lowered.state()  # an explicit state argument is used as given
    layers[2].key.set_value(jax.random.key(5))
    np.testing.assert_allclose(lowered.loss(params, x, y, old_state), want_loss, rtol=RTOL)
    # the state is an argument of the compiled step, not an activation it saves
    saved = jax_exec.stages.saved_activations(lowered, x, y)
    got = {(r.shape, r.dtype) for r in saved}
    assert got == set(jax_exec.stages.expected_activations(layers, mse_loss, ops, x, y))


@pytest.mark.parametrize(
    "mode, variable",
    [("batchnorm", r"bn\.mean \(BatchStat\)"), ("dropout", r"drop\.rngs\.count \(RngCount\)")],
)
def test_layers_that_change_their_state_are_refused(mode, variable):
    layers = noisy_mlp()
    if mode == "batchnorm":
        layers[1].bn.use_running_average = False
    else:
        layers[1].drop.deterministic = False
    x = jax.random.normal(jax.random.key(0), (5, 6))
    y = jax.random.normal(jax.random.key(1), (5, 3))
    ops = [F_all(k) for k in range(5)] + [Loss()] + [B(k) for k in range(4, -1, -1)]
    message = rf"layer 1:Block changes its state while running: {variable}"
    count = layers[1].drop.rngs.count.get_value()
    block = jax_exec.stages.as_stages(layers)[1]
    lowered = jax_exec.stages.lower(layers, mse_loss, ops)  # builds; tracing refuses
    for call in (
        lambda: jax_exec.stages.profile(layers, mse_loss, x, y, timing="flops"),
        lambda: jax_exec.run(layers, mse_loss, ops, x, y),
        lambda: jax_exec.stages.value_and_grad(layers, mse_loss, ops)(x, y),
        lambda: lowered.loss(lowered.params(), x, y),
        lambda: jax_exec.stages.expected_activations(layers, mse_loss, ops, x, y),
        lambda: block.apply(block.params, block.rest, jnp.ones((5, WIDTH))),  # eager
    ):
        with pytest.raises(TypeError, match=message):
            call()
    assert layers[1].drop.rngs.count.get_value() == count  # an eager call did not write into it


def test_switching_to_training_mode_after_building_the_step_is_refused():
    layers = noisy_mlp()
    x = jax.random.normal(jax.random.key(0), (5, 6))
    y = jax.random.normal(jax.random.key(1), (5, 3))
    step = jax_exec.stages.value_and_grad(layers, mse_loss, [F_all(k) for k in range(5)] + [Loss()]
                                   + [B(k) for k in range(4, -1, -1)])  # fmt: skip
    step(x, y)
    for layer in layers:
        layer.train()
    with pytest.raises(TypeError, match="layer 1:Block changes its state while running"):
        step(x, y)


# Items 3 and 4: tied weights and integer token inputs.


@pytest.fixture(scope="module")
def lm():
    layers = tied_lm()
    x, y = tokens(1), tokens(2)
    chain = jax_exec.stages.profile(layers, xent, x, y, timing="flops")
    loss, want = reference(layers, xent, x, y)
    return layers, x, y, chain, loss, want


def test_tied_weights_are_held_once(lm):
    layers = lm[0]
    model = jax_exec.stages.split_layers(layers)
    assert [s.path for s in model.sharing.shared] == ["embed.embedding"]
    head = jax.tree.leaves(model.params()[3], is_leaf=is_variable)
    assert head == [layers[3].norm.bias, layers[3].norm.scale]
    with pytest.raises(TypeError, match=r"layer 3:TiedHead reads the parameter embed\.embedding "
                       r"of layer 0:Embed \(embedding\).*train the copies apart"):  # fmt: skip
        jax_exec.stages.as_stages(layers)


def test_tied_weights_and_tokens_on_every_path(lm):
    layers, x, y, chain, want_loss, want = lm
    assert chain.in_size[0] == 0 and x.dtype == jnp.int32  # the batch is an argument
    rotor = solvers.solve(chain, solvers.chain.rotor.min_memory(chain), method="rotor")
    for ops in (STORE_ALL, SEGMENT, NESTED, rotor.ops):
        trace = schedir.simulate_chain(chain, ops)
        result = jax_exec.run(layers, xent, ops, x, y)
        assert_matches(layers, result.loss, result.grads, want_loss, want)
        assert result.resident_bytes == trace.resident
        assert result.peak_bytes <= trace.peak_memory
        loss, grads = jax_exec.stages.value_and_grad(layers, xent, ops)(x, y)
        assert_matches(layers, loss, grads, want_loss, want)
        lowered = jax_exec.stages.lower(layers, xent, ops)
        saved = jax_exec.stages.saved_activations(lowered, x, y)
        got = {(r.shape, r.dtype) for r in saved}
        assert got == set(jax_exec.stages.expected_activations(layers, xent, ops, x, y))


# An offload schedule (rotor_offload's on this model, when the tokens were a[0]): a[0]
# (empty: the tokens are an argument) and abar[1] go to host memory; the embedding's
# abar[1] record and a segment both offload.
OFFLOAD = [
    Offload("a[0]"), F_all(0), Wait("a[0]"), Offload("abar[1]"), F_ck(1), Wait("abar[1]"),
    F_ck(2), F_all(3), Loss(), B(3), F_all(2), Prefetch("abar[1]"), B(2), Wait("abar[1]"),
    F_all(1), Prefetch("a[0]"), B(1), Wait("a[0]"), B(0),
]  # fmt: skip


def test_tied_weights_offload_paths(lm):
    layers, x, y, chain, want_loss, want = lm
    problem = OffloadProblem(chain, Platform.host_offload(1e9))
    schedule = schedir.OffloadSchedule(OFFLOAD)
    trace = schedir.simulate_offload(problem, schedule)
    result = jax_exec.run(layers, xent, schedule, x, y)
    assert_matches(layers, result.loss, result.grads, want_loss, want)
    assert result.host_bytes == trace.host_resident and max(trace.host_resident) > 0
    assert result.resident_bytes == trace.resident
    loss, grads = jax_exec.stages.value_and_grad(layers, xent, schedule)(x, y)
    assert_matches(layers, loss, grads, want_loss, want)
    lowered = jax_exec.stages.lower(layers, xent, schedule)
    host = jax_exec.stages.saved_activations(lowered, x, y, host=True)
    assert host and all(r.host for r in host)  # abar[1], the embedding's output


def test_optax_training_with_tied_weights_equals_the_plain_model():
    layers = tied_lm(seed=3)
    x, y = tokens(4), tokens(5)
    optimizer = optax.adamw(1e-2)

    def train(loss_fn, params, steps=4):
        state = optimizer.init(params)

        @jax.jit
        def step(params, state):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, state = optimizer.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss

        losses = []
        for _ in range(steps):
            params, state, loss = step(params, state)
            losses.append(float(loss))
        return params, losses

    lowered = jax_exec.stages.lower(layers, xent, NESTED)
    trained, losses = train(lowered.loss, lowered.params())
    stack = Stack(layers)
    graphdef, plain_params, rest = nnx.split(stack, nnx.Param, ...)
    live = [v for _, v in nnx.to_flat_state(plain_params)]
    plain, plain_losses = train(lambda p, x, y: xent(nnx.merge(graphdef, p, rest, copy=True)(x), y),
                  jax.tree.map(lambda v: v, plain_params))  # fmt: skip
    np.testing.assert_allclose(losses, plain_losses, rtol=RTOL)
    assert losses[-1] < losses[0]
    want = {id(v): p for v, p in zip(live, jax.tree.leaves(plain), strict=True)}
    got = by_variable(layers, trained)
    assert got.keys() == want.keys()
    for k, g in got.items():
        np.testing.assert_allclose(g, want[k], rtol=RTOL, atol=ATOL)
    for layer, p in zip(layers, trained, strict=True):  # write back: the table once
        nnx.update(layer, p)
    np.testing.assert_allclose(layers[3].embed.embedding.get_value(), got[id(layers[0].embedding)])


def test_integer_output_of_a_stage_is_refused():
    class ArgMax(nnx.Module):
        def __call__(self, x):
            return jnp.argmax(x, axis=-1)

    layers = [nnx.Linear(4, 4, rngs=nnx.Rngs(0)), ArgMax()]
    x = jnp.ones((2, 4))
    with pytest.raises(TypeError, match="layer 1:ArgMax's output is int32: a stage's output"):
        jax_exec.stages.profile(layers, lambda a, y: jnp.sum(a), x, None, timing="flops")


# Item 5: the compiled step splits the layers once and still reads current values.


def test_value_and_grad_splits_once_and_follows_updates(monkeypatch):
    layers = noisy_mlp()
    x = jax.random.normal(jax.random.key(0), (5, 6))
    y = jax.random.normal(jax.random.key(1), (5, 3))
    step = jax_exec.stages.value_and_grad(layers, mse_loss, STORE_ALL[:4] + [F_all(4), Loss(), B(4)]
                                   + STORE_ALL[5:])  # fmt: skip
    step(x, y)
    splits = []
    split = nnx.split
    monkeypatch.setattr(nnx, "split", lambda *a, **k: splits.append(1) or split(*a, **k))
    for _ in range(3):
        params = nnx.state(layers[0], nnx.Param)
        nnx.update(layers[0], jax.tree.map(lambda a: a * 1.1, params))
        want_loss, want = reference(layers, mse_loss, x, y)
        before = len(splits)
        loss, grads = step(x, y)
        assert len(splits) == before, "the step split the layers again"
        assert_matches(layers, loss, grads, want_loss, want)
    # a Variable object replaced (not updated in place) is seen: split again
    layers[4].bias = nnx.Param(layers[4].bias.get_value() + 1.0)
    want_loss, want = reference(layers, mse_loss, x, y)
    loss, grads = step(x, y)
    assert_matches(layers, loss, grads, want_loss, want)

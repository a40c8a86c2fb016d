"""Where the values of a sharded model live (docs/auto.md, "Sharded models").

A model whose parameters, state or arguments are sharded over several devices (``nnx.
with_partitioning`` under a mesh, ``NamedSharding``, GSPMD) runs every kernel of the
op-by-op runtime under GSPMD on those devices. Each value of the traced program gets
one sharding, read, not guessed: :func:`value_shardings` compiles the forward program
once on the sharded arguments, every value an output, and takes the shardings XLA's
partitioner gave them. Kernels are then compiled for their inputs where they live and
their program outputs placed there (:class:`~jax_exec.program.model.BlockModel`);
what only a kernel makes (saved residuals, a backward's intermediates) takes the
sharding its compiled kernel gives it, cotangents their primal's. A value's bytes on
one device are its largest shard's (:func:`jax_exec.program.trace.aval_bytes`).
"""

from __future__ import annotations

from typing import Any

import jax

from jax_exec.program.trace import Program, evaluate, read


def spread(tree: Any) -> list:
    """The concrete arrays of ``tree`` sharded over several devices (a traced array,
    under jit, has no concrete sharding to read)."""
    return [x for x in jax.tree.leaves(tree)
            if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
            and len(x.sharding.device_set) > 1]  # fmt: skip


def spread_devices(tree: Any) -> int:
    """The most devices one array of ``tree`` is sharded over (1: none is)."""
    return max((len(x.sharding.device_set) for x in spread(tree)), default=1)


def value_shardings(
    program: Program, params: Any, rest: Any, args: tuple
) -> tuple[dict[int, Any], dict[int, Any]]:
    """Where ``program``'s values and its parameters' gradients live when it runs on
    ``params``, ``rest`` and ``args`` (concrete arrays, some sharded over several
    devices): value id -> sharding of every value (inputs, constants, slices of
    stacked globals, every equation's results), and parameter id -> sharding of its
    gradient. Read from the training step compiled once under GSPMD, every value an
    output besides the loss and the gradients, as XLA's partitioner placed them (the
    gradients where a plain ``jax.jit`` of ``jax.value_and_grad`` puts them)."""
    inputs = program.param_ids + program.rest_ids + program.arg_ids
    n = len(program.param_ids)
    consts = tuple(program.consts)
    made = tuple(sorted(program.derived)) + tuple(v for e in program.eqns for v in e.outs)

    def step(flat: list, const_values: list) -> tuple:
        def loss(differentiated: list) -> tuple:
            env = dict(zip(inputs, [*differentiated, *flat[n:]], strict=True))
            env.update(zip(consts, const_values, strict=True))
            for vid, (src, i) in sorted(program.derived.items()):
                env[vid] = env[src][i]
            evaluate(program, program.eqns, env)
            return read(env, program.loss), [env[v] for v in made]

        (_, values), grads = jax.value_and_grad(loss, has_aux=True)(flat[:n])
        return values, grads

    leaves = jax.tree.leaves((params, rest, tuple(args)))
    lowered = jax.jit(step).lower(leaves, [program.consts[c] for c in consts])
    compiled = lowered.compile()
    (given, const_given), _ = compiled.input_shardings
    values, grads = compiled.output_shardings
    found = dict(zip(inputs, given, strict=True))
    found.update(zip(consts, const_given, strict=True))
    found.update(zip(made, values, strict=True))
    return found, dict(zip(program.param_ids, grads, strict=True))


def place(value: Any, sharding: Any) -> Any:
    """``value`` where ``sharding`` says (the array itself when it is there already)."""
    if isinstance(value, jax.Array) and value.sharding.is_equivalent_to(sharding, value.ndim):
        return value
    return jax.device_put(value, sharding)


def device_bytes(arrays: Any) -> dict[Any, int]:
    """Measured bytes of distinct ``arrays`` on each device they live on: an array's
    ``addressable_shards`` (a single-device array: its ``nbytes``)."""
    out: dict[Any, int] = {}
    for a in arrays:
        if len(a.sharding.device_set) == 1:
            (device,) = a.sharding.device_set
            out[device] = out.get(device, 0) + int(a.nbytes)
            continue
        for shard in a.addressable_shards:
            out[shard.device] = out.get(shard.device, 0) + int(shard.data.nbytes)
    return out

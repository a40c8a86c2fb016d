"""Where the values of a sharded model live (docs/auto.md, "Sharded models").

A model whose parameters, state or arguments are sharded over several devices (``nnx.
with_partitioning`` under a mesh, ``NamedSharding``, GSPMD) runs every kernel of the
op-by-op runtime under GSPMD on those devices. Each value of the traced program gets
one sharding, read, not guessed: :func:`value_shardings` compiles the training step once
on the sharded arguments, every forward value an output besides the gradients, and
takes the shardings XLA's partitioner gave them. Kernels are then compiled for their
inputs where they live and their program outputs placed there (:func:`out_shardings`,
:func:`phase_source`); what only a kernel makes (saved residuals, a backward's
intermediates) takes the sharding its compiled kernel gives it, cotangents their
primal's, parameters' gradients the plain step's. A value's bytes on one device are
its largest shard's (:func:`jax_exec.program.flat.aval_bytes`); the op-by-op runtime
measures the shards on each device (:func:`device_bytes`).
"""

from __future__ import annotations

from typing import Any

import jax

from jax_exec.program.flat import Program, aval_bytes, evaluate, read


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
                env[vid] = jax.lax.index_in_dim(env[src], i, keepdims=False)
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


# Where a sharded model's kernels take and put their values. ``model`` is a
# :class:`~jax_exec.program.model.BlockModel` (which imports this module); ``flags`` its
# block's ``through_flags``.


def out_shardings(model: Any, kind: str, k: int, o: int = 0) -> Any:
    """Where a ``"forward"``, ``"record"`` or ``"loss"`` kernel of block k puts its
    outputs: program values where they live, parameters' gradients where the plain step
    puts them (:func:`grad_shardings`), cotangents where their primal lives, saved
    residuals where XLA places them (None); None for a model on one device (XLA's
    default, as every kernel of such a model is compiled)."""
    if not model.sharded:
        return None
    where, lay = model.program.shardings, model.layouts[k]
    outs, results = tuple(where[v] for v in lay.outs), tuple(where[v] for v in lay.results)
    if kind == "forward":
        return outs, results
    if kind == "record":
        return outs, results, (None,) * len(model.functions(k, o).recipe.new)
    active = [v for v, a in zip(lay.ins, lay.act_in, strict=True) if a]
    return (*outs, results, grad_shardings(model, k), tuple(where[v] for v in active))


def grad_shardings(model: Any, k: int) -> tuple:
    """Where block k's parameters' gradients go: where the plain step puts each
    parameter's (a slice of a scanned stack's: where the slice lives)."""
    where = {**model.program.shardings, **model.program.grad_shardings}
    return tuple(where[v] for v in model.layouts[k].params)


def residual_shardings(model: Any, k: int, o: int) -> tuple:
    """Where block k's record kernel under option o (compiled) put its saved residuals
    (its last outputs)."""
    placed = model.kernel("record", k, o).out_shardings
    return placed[len(placed) - len(model.functions(k, o).recipe.new) :]


def phase_shardings(model: Any, k: int, o: int, upto: int, flags: tuple) -> dict | None:
    """value id -> sharding in block k's phased backward under option o: its arguments
    (saved residuals where its record kernel put them, cotangents where their primal
    lives), its results (parameters' gradients, cotangents) and what phases
    ``0..upto-1`` return, where their kernels put it; None while one of those kernels
    is not compiled."""
    key = model.kernel_key("backward", k, o)
    done = [model.compiled((*key, j)) for j in range(upto)]
    if model.compiled(model.kernel_key("record", k, o)) is None or None in done:
        return None
    pb, lay, where = model.phased(k, o), model.layouts[k], model.program.shardings
    active = [v for v, a in zip(lay.ins, lay.act_in, strict=True) if a]
    groups = {
        "p": lay.params, "g": lay.others, "x": lay.ins, "outs": lay.outs,
        "results": lay.results,
        "d_outs": [v for v, a in zip(lay.outs, lay.act_out, strict=True) if a],
        "through": [v for v, f in zip(active, flags, strict=True) if f],
    }  # fmt: skip
    new = residual_shardings(model, k, o)
    found = {
        vid: new[i] if group == "new" else where[groups[group][i]]
        for vid, (group, i) in zip(pb.flat.in_ids, pb.groups, strict=True)
    }
    placed = (*grad_shardings(model, k), *(where[v] for v in active))
    found.update(zip(pb.results, placed, strict=True))
    for phase, kernel in zip(pb.phases, done, strict=False):
        made = (*phase.outs, *(vid for vid, _ in phase.extras))
        found.update(zip(made, kernel.out_shardings, strict=True))
    return found


def phase_source(model: Any, k: int, o: int, j: int, flags: tuple) -> tuple | None:
    """``((function, *shapes), out_shardings)`` of phase j of block k's backward under
    option o: its inputs where they live, its results placed (what else it returns
    where XLA places it); None until the kernels it reads from are compiled."""
    where = phase_shardings(model, k, o, j, flags)
    if where is None:
        return None
    pb = model.phased(k, o)
    phase = pb.phases[j]
    specs = tuple(
        jax.ShapeDtypeStruct(pb.avals[v].shape, pb.avals[v].dtype, sharding=where[v])
        for v in phase.ins
    )
    made = (*phase.outs, *(vid for vid, _ in phase.extras))
    return (pb.function(j), *specs), tuple(where.get(v) for v in made)


def per_device(model: Any, k: int, o: int, flags: tuple) -> Any:
    """Block k's phased backward under option o with its figures per device once its
    phases are compiled (None before, or when they already are)."""
    pb = model.phased(k, o)
    where = phase_shardings(model, k, o, len(pb.phases), flags)
    if pb.sizes is not None or where is None:
        return None
    return pb.per_device({v: aval_bytes(pb.avals[v], s) for v, s in where.items()})

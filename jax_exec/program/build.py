"""Building a :class:`~jax_exec.program.model.BlockModel` from a model (docs/auto.md,
"Tracing" to "Options"): :func:`block_model` traces ``loss_fn(model, *args)`` and hands
the traced step to :func:`program_model`, which every front end calls (the automatic
planner, the stage lists, the traced pipelines): analysis, cuts, blocks, each block's
save options, the problem."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from flax import nnx

from jax_exec.program.analysis import CostModel, analyze_program
from jax_exec.program.blocks import build_blocks, find_cuts
from jax_exec.program.compiled import BLOCK_TABLES, bound_caches
from jax_exec.program.kernels import layout
from jax_exec.program.model import BlockModel
from jax_exec.program.placement import spread, value_shardings
from jax_exec.program.problem import build_problem
from jax_exec.program.trace import Traced, trace


def block_model(
    loss_fn: Callable,
    model: Any,
    args: tuple,
    *,
    has_aux: bool = False,
    cost_model: CostModel | None = None,
    max_anchors: int = 4,
    options: Callable | None = None,
    ahead: bool = False,
    wrt: Any = nnx.Param,
) -> BlockModel:
    """Trace, analyze and cut ``loss_fn(model, *args)``; give each block its options
    and build the problem (module docstring; ``ahead``: :func:`program_model`'s;
    ``wrt``: the parameters differentiated, :func:`jax_exec.program.trace.split_model`)."""
    start = time.perf_counter()
    traced = trace(loss_fn, model, args, has_aux=has_aux, wrt=wrt)
    if spread((traced.params, traced.rest, tuple(args))):  # where each value lives
        where, grads = value_shardings(traced.program, traced.params, traced.rest, args)
        program = replace(traced.program, shardings=where, grad_shardings=grads)
        traced = replace(traced, program=program)
    seconds = time.perf_counter() - start
    return program_model(traced, cost_model=cost_model, max_anchors=max_anchors,
                         options=options, trace_seconds=seconds, ahead=ahead)  # fmt: skip


def program_model(
    traced: Traced,
    *,
    cost_model: CostModel | None = None,
    max_anchors: int = 4,
    cuts: Callable | None = None,
    options: Callable | None = None,
    trace_seconds: float = 0.0,
    ahead: bool = False,
) -> BlockModel:
    """The :class:`BlockModel` of a traced step: analyzed, cut into blocks (``cuts(program,
    analysis)``: the cut positions, default :func:`~jax_exec.program.blocks.find_cuts`
    with ``max_anchors``), each block given its options (``options(model, k)``, default
    :func:`~jax_exec.program.options.block_options`), and its problem built. ``ahead``
    (exact planning, which compiles the store-all reference's kernels first): those
    kernels are compiled in the background while the options are made
    (:func:`compile_ahead`; the planner's own solves take as exact only what they ask
    for, so a plan does not depend on it)."""
    from jax_exec.program.options import block_options, distinct_options

    cost_model = cost_model or CostModel()
    bound_caches()  # a new model: the process-wide caches may be cleared here, not later
    clock = [time.perf_counter()]
    timings: dict[str, float] = {"trace": trace_seconds}

    def lap(name: str) -> None:
        now = time.perf_counter()
        timings[name] = now - clock[0]
        clock[0] = now

    program = traced.program
    analysis = analyze_program(program, cost_model)
    lap("analysis")
    if cuts is None:
        positions = find_cuts(program, analysis, max_anchors=max_anchors)
    else:
        positions = cuts(program, analysis)
    blocks = build_blocks(program, analysis, positions)
    lap("blocks")
    L = blocks.length
    layouts = tuple(
        layout(program, analysis, b, is_loss=k == L) for k, b in enumerate(blocks.blocks)
    )
    cut_ids = sorted({v for c in blocks.cuts for v in c})
    value_index = {v: i for i, v in enumerate(cut_ids)}
    bm = BlockModel(traced, analysis, blocks, layouts, (), value_index, None, cost_model)
    if ahead and options is None and not bm.sharded:
        bm.ahead = compile_ahead(bm)
    choose = options or block_options
    opts = []
    for k in range(L):
        key = (bm.identity(k), cost_model, choose)  # the options' times need the cost model
        if key not in BLOCK_TABLES["options"]:
            bm.options = (*opts, tuple(choose(bm, k)))
            BLOCK_TABLES["options"][key] = distinct_options(bm, k)
        opts.append(BLOCK_TABLES["options"][key])
    bm.options = tuple(opts)
    lap("options")
    bm.problem = build_problem(bm)
    lap("problem")
    bm.timings = timings
    return bm


def compile_ahead(model: BlockModel) -> Future:
    """Compile the store-all reference's kernels
    (:func:`~jax_exec.program.options.store_all_options`) in the
    background, into the process-wide tables, on a copy of ``model`` whose blocks have
    those options alone (the model's own are being made meanwhile)."""
    from jax_exec.program.options import store_all_options

    reference = tuple((option,) for option in store_all_options(model))
    units = [("loss", model.length, 0)]
    for k in range(model.length):
        units += [("record", k, 0), ("backward", k, 0)]
    return dataclasses.replace(model, options=reference)._in_background(units)

"""The block chain problem of a :class:`~jax_exec.program.model.BlockModel`
(:func:`build_problem`, docs/auto.md): cut values and cotangents from their shapes
(exact); saved residuals from the traced ``record`` function of each option and
temporaries from the compiled kernels the op-by-op runtime runs (``memory_analysis()``),
both exact once the option is traced / the kernel compiled and estimated before (the
planner makes exact what a schedule uses, :func:`jax_exec.auto.plan.plan`). Times come
from the roofline model (:class:`~jax_exec.program.analysis.CostModel`).
"""

from __future__ import annotations

from typing import Any

from jax_exec.program.blocks import Block
from jax_exec.program.kernels import HOST_VARIANTS
from jax_exec.program.options import recompute_cost
from schedir.blocks.problem import BlockChain, BlockOption, BlockStage


def stage_times(model: Any, block: Block) -> tuple[float, float]:
    """Roofline (forward, backward) seconds of a block's equations, no recomputation."""
    infos = model.analysis.infos[block.start : block.stop]
    return sum(i.fwd_cost for i in infos), sum(i.bwd_cost for i in infos)


def build_problem(model: Any, lower: bool = False) -> BlockChain:
    """The :class:`BlockChain` of ``model`` (a :class:`~jax_exec.program.model.BlockModel`):
    exact bytes of values and saved residuals (traced shapes); temporaries of the
    compiled kernels, or estimates for kernels not compiled yet (its ``temp_bytes``), or
    with ``lower`` lower bounds of them (every figure of the problem then bounds the
    exact one from below, once its ``trace_options()`` made the saved bytes exact). A
    host-memory variant (:func:`~jax_exec.program.host_variants.with_host_variants`)
    keeps ``host`` bytes out of ``saved``; its recording holds them on the device before
    their copy out (``rec_tmp``), and its copies each way, at the host link's
    bandwidths, are part of its recording's and its backward's times (``copy_out``,
    ``copy_back``: the block DP charges them whole, an upper bound; the simulator
    overlaps them with compute)."""
    program, L = model.program, model.length
    ids = sorted(model.value_index, key=model.value_index.get)
    sizes = tuple(program.nbytes(v) for v in ids)
    grads = tuple(program.nbytes(v) if v in model.analysis.active else 0 for v in ids)
    stages = []
    for k in range(L):
        block = model.blocks.blocks[k]
        fwd, bwd = stage_times(model, block)
        options = []
        for o, option in enumerate(model.options[k]):
            extra = recompute_cost(model, k, option.on_device())
            bwd_tmp, bwd_release, _ = model.backward_bytes(k, o, lower)
            held = model.host_residuals(k, o)
            host, out, back = sum(held.values()), 0.0, 0.0
            if held:
                if model.host_link is None:
                    raise ValueError(f"block {k} option {o}: a host-memory variant "
                                     f"needs a host link (with_host_variants)")  # fmt: skip
                out = sum(model.host_link.offload.time(n) for n in held.values())
                back = sum(model.host_link.prefetch.time(n) for n in held.values())
            options.append(
                BlockOption(
                    name=option.label + HOST_VARIANTS.get(option.host, ""),
                    saved=model.saved_bytes(k, o)[0] - host,
                    rec_time=fwd + out,
                    rec_tmp=model.temp_bytes("record", k, o, lower)[0] + host,
                    bwd_time=bwd + extra + back,
                    bwd_tmp=bwd_tmp,
                    bwd_release=bwd_release,
                    host=host,
                    copy_out=out,
                    copy_back=back,
                )
            )
        stages.append(
            BlockStage(
                name=f"block {k} (equations {block.start}..{block.stop - 1})",
                fwd_time=fwd,
                fwd_tmp=model.temp_bytes("forward", k, 0, lower)[0],
                reads=tuple(model.value_index[v] for v in block.ins),
                options=tuple(options),
            )
        )
    tail = model.blocks.blocks[L]
    fwd, bwd = stage_times(model, tail)
    loss_tmp = model.temp_bytes("loss", L, 0, lower)[0]
    cuts = tuple(tuple(model.value_index[v] for v in c) for c in model.blocks.cuts)
    return BlockChain(sizes, grads, cuts, tuple(stages), fwd + bwd, loss_tmp)

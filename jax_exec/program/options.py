"""Save options of a block (docs/auto.md, "Options").

An option is a save set S of the block's materialized values (lowered as
``save_only_these_names(S)``), or one of JAX's policies. Every block offers:

- ``save all``: S = every materialized value (XLA's own plain-autodiff behaviour,
  minus the cheap elementwise residuals it would fuse);
- ``save none``: S = {} (the block is recomputed from its inputs in its backward,
  ``nothing_saveable``);
- ``checkpoint_dots``: JAX's policy (matmul results saved);
- ``everything_saveable``: plain autodiff (every residual saved, elementwise ones too);
- ``xla_fused``: every residual but those of cheap elementwise and layout operations
  (what XLA stores for a plain step: its fusion recomputes cheap producers inside their
  consumers, never transcendentals, matmuls or reductions);
- the Pareto-optimal save sets between those, from a small MILP per distinct block
  (:func:`solvers.blocks.options.pareto_save_sets`) over the block's graph: a value
  the backward reads is saved or recomputed, a recomputed equation's inputs are
  saved, recomputed or block inputs; minimize the recomputation time under a cap on
  the saved bytes, swept from all to nothing.

:func:`recompute_cost` prices what an option recomputes in the backward (roofline
seconds), with the same rules.
"""

from __future__ import annotations

from typing import Any

from jax_exec.program.flat import Lit
from jax_exec.program.kernels import FUSED, SaveOption
from solvers.blocks.options import OptionGraph, pareto_save_sets, read_values, recompute_set

MAX_PARETO = 4


def _free(model: Any, k: int) -> set[int]:
    """Values block k's backward has without recomputing them: its inputs and outputs
    (but tied ones, which no option saves: :mod:`jax_exec.program.ties`), and the
    program's inputs."""
    lay = model.layouts[k]
    return (set(lay.outs) - lay.tied) | set(lay.ins) | set(model.program.input_ids)


def option_graph(model: Any, k: int) -> tuple[OptionGraph, list]:
    """The block's :class:`~solvers.blocks.options.OptionGraph` and, per candidate value
    of the graph, its local key (equation offset, output index); cached per distinct
    block."""
    return model.cached(("graph", model.identity(k)), lambda: _option_graph(model, k))


def _option_graph(model: Any, k: int) -> tuple[OptionGraph, list]:
    program, analysis = model.program, model.analysis
    block = model.blocks.blocks[k]
    lay = model.layouts[k]
    eqns = list(range(block.start, block.stop))
    pos = {i: n for n, i in enumerate(eqns)}
    free = _free(model, k)
    cand_ids = [
        v for i in eqns for v in program.eqns[i].outs if lay.local[v] in lay.named and v not in free
    ]
    cand_pos = {v: c for c, v in enumerate(cand_ids)}

    def ref(v: int) -> int:
        return cand_pos[v] if v in cand_pos else -1 - pos[program.producer[v]]

    inputs, needs, costs, selfs = [], [], [], []
    for i in eqns:
        eqn, info = program.eqns[i], analysis.infos[i]
        arrays = [r for r in eqn.ins if not isinstance(r, Lit) and r not in free]
        inputs.append(tuple(sorted({ref(r) for r in arrays})))
        costs.append(info.fwd_cost)
        own = info.has_backward and bool(info.needs_out or info.new_bytes)
        selfs.append(own)
        read = [eqn.ins[j] for j in info.needs_in] if info.has_backward else []
        needs.append(
            tuple(sorted({ref(r) for r in read if not isinstance(r, Lit) and r not in free}))
        )
    graph = OptionGraph(
        cost=tuple(costs),
        inputs=tuple(inputs),
        values=tuple(pos[program.producer[v]] for v in cand_ids),
        value_sizes=tuple(program.nbytes(v) for v in cand_ids),
        needs=tuple(needs),
        self_recompute=tuple(selfs),
    )
    return graph, [lay.local[v] for v in cand_ids]


# What XLA keeps for a plain step, and plain autodiff's residuals: the options the
# store-all reference records blocks with (store_all_options)
XLA_FUSED = SaveOption("fused", label="xla_fused")
EVERYTHING = SaveOption("everything", label="everything_saveable")


def block_options(model: Any, k: int, max_pareto: int = MAX_PARETO) -> list[SaveOption]:
    """The save options of block k (module docstring)."""
    graph, keys = option_graph(model, k)
    every = frozenset(keys)
    options = [
        SaveOption("names", every, "save all"),
        SaveOption("names", frozenset(), "nothing_saveable"),
        SaveOption("dots", label="checkpoint_dots"),
        EVERYTHING,
        XLA_FUSED,
    ]
    seen = {every, frozenset()}
    for saved in pareto_save_sets(graph, max_pareto):
        names = frozenset(keys[c] for c in saved)
        if names not in seen:
            seen.add(names)
            options.append(SaveOption("names", names, f"save {len(names)}/{len(keys)}"))
    return options


def distinct_options(model: Any, k: int) -> tuple[SaveOption, ...]:
    """Block k's options, without MILP save sets that save the same bytes for the same
    recomputation as an earlier option (they may differ only in values the backward
    does not read). Named options (``save all`` and JAX's policies) always stay."""
    kept, seen = [], set()
    for o, option in enumerate(model.options[k]):
        sig = (model.saved_bytes(k, o)[0], round(recompute_cost(model, k, option), 18))
        if option.label.startswith("save ") and option.label != "save all" and sig in seen:
            continue
        seen.add(sig)
        kept.append(option)
    return tuple(kept)


def store_all_options(model: Any) -> tuple[SaveOption, ...]:
    """Per block, the option the store-all reference records it with: what XLA keeps
    for a plain step (``xla_fused``), ``everything_saveable`` in a scanned stack, whose
    iterations XLA cannot fuse across (docs/auto.md, "Planning exactly")."""
    in_scan = set()
    for scan in model.program.scans:
        lo, hi = scan.starts[0], scan.starts[-1]
        in_scan |= {b.index for b in model.blocks.blocks[:-1] if lo <= b.start < hi}
    return tuple(EVERYTHING if k in in_scan else XLA_FUSED for k in range(model.length))


def saved_candidates(model: Any, k: int, option: SaveOption) -> set[int]:
    """The candidates of block k's graph (:func:`option_graph`) that a save set
    (``"names"``) or ``checkpoint_dots`` (``"dots"``: the matmul results) keeps."""
    graph, keys = option_graph(model, k)
    if option.kind == "dots":
        program, block = model.program, model.blocks.blocks[k]
        names = {
            (i - block.start, j)
            for i in range(block.start, block.stop)
            if program.eqns[i].name == "dot_general"
            for j in range(len(program.eqns[i].outs))
        }
    else:
        names = option.names
    return {c for c, key in enumerate(keys) if key in names}


def recompute_cost(model: Any, k: int, option: SaveOption) -> float:
    """Roofline seconds the block's backward spends recomputing under ``option`` (and
    encoding and decoding low-bit residuals, :mod:`jax_exec.auto.lowbit`)."""
    key = ("recompute", model.identity(k), option)
    codec = getattr(model, "codec_seconds", None)
    extra = (lambda: codec(k, option)) if codec else (lambda: 0.0)
    return model.cached(key, lambda: _recompute_cost(model, k, option) + extra())


def _recompute_cost(model: Any, k: int, option: SaveOption) -> float:
    # plain autodiff recomputes nothing; xla_fused recomputes cheap elementwise work
    # inside its consumers' fusions, which is how XLA runs the plain step itself: both
    # cost the plain step's time, so store-all is the fastest schedule ("100%")
    if option.kind in ("everything", "fused"):
        return 0.0
    graph, _ = option_graph(model, k)
    return sum(graph.cost[i] for i in recompute_set(graph, saved_candidates(model, k, option)))


def temp_estimate(model: Any, kind: str, k: int, option: SaveOption | None) -> int:
    """An estimate of a kernel's temporary bytes (cached per distinct block, see
    :func:`_temp_estimate`)."""
    key = ("temp", kind, model.identity(k), option)
    return model.cached(key, lambda: _temp_estimate(model, kind, k, option))


def _temp_estimate(model: Any, kind: str, k: int, option: SaveOption | None) -> int:
    """An estimate of a kernel's temporary bytes before it is compiled (a liveness scan
    of the block's materialized values, docs/auto.md "Temporaries").

    - forward / record: the peak, in program order, of the materialized values the
      kernel makes and does not return, while they still have a reader;
    - backward: the materialized values it recomputes, plus the peak of the
      cotangents of the block's own materialized active values in the reverse sweep.
    """
    program, analysis = model.program, model.analysis
    block, lay = model.blocks.blocks[k], model.layouts[k]
    eqns = range(block.start, block.stop)
    made = [v for i in eqns for v in program.eqns[i].outs if v in analysis.materialized]
    made_set = set(made)
    last: dict[int, int] = {}
    for i in eqns:
        for r in program.eqns[i].ins:
            if not isinstance(r, Lit) and r in made_set:
                last[r] = i
    returned = set(lay.outs) | set(lay.results)
    if kind == "record" and option is not None:
        if option.kind == "names":
            returned |= {v for v in made if lay.local[v] in option.names}
        elif option.kind == "dots":
            returned |= {v for v in made if program.eqns[program.producer[v]].name == "dot_general"}
        elif option.kind == "fused":
            returned |= fused_saved(model, k)
        else:
            returned |= made_set
    nbytes = program.nbytes
    if kind in ("forward", "record", "loss"):
        live, peak = 0, 0
        ends: dict[int, list[int]] = {}
        for i in eqns:
            for v in program.eqns[i].outs:
                if v in made_set and v not in returned:
                    live += nbytes(v)
                    ends.setdefault(last.get(v, i), []).append(v)
            peak = max(peak, live)
            for v in ends.pop(i, []):
                live -= nbytes(v)
        return peak
    graph, keys = option_graph(model, k)
    if option.kind in ("everything", "fused"):
        recomputed: set[int] = set()
    else:
        saved_keys = (
            {key for key in keys if key in option.names}
            if option.kind == "names"
            else {
                lay.local[v]
                for v in made
                if program.eqns[program.producer[v]].name == "dot_general"
            }
        )
        saved = {c for c, key in enumerate(keys) if key in saved_keys}
        nodes = recompute_set(graph, saved)
        recomputed = {v for n in nodes for v in program.eqns[block.start + n].outs} & made_set
    extra = sum(nbytes(v) for v in recomputed - returned)
    live, peak = 0, 0
    active = [v for v in made if v in analysis.active and v not in set(lay.outs)]
    first_read = {}
    for i in eqns:
        for r in program.eqns[i].ins:
            if not isinstance(r, Lit) and r in made_set and r not in first_read:
                first_read[r] = i
    for i in reversed(eqns):  # a cotangent lives from its last reader to its maker
        for v in active:
            if last.get(v) == i:
                live += nbytes(v)
        peak = max(peak, live)
        for v in program.eqns[i].outs:
            if v in active and v in last:
                live -= nbytes(v)
    return extra + peak


def fused_saved(model: Any, k: int) -> frozenset[int]:
    """The values of block k that ``xla_fused`` keeps (an estimate before its recording
    is traced; cached per distinct block): walking back from what the backward reads,
    a value made by an operation XLA does not fuse is kept, one made by a fused
    (cheap elementwise or layout) operation is recomputed from its inputs; an
    unfused operation whose backward reads its own output keeps it."""
    return model.cached(("fused", model.identity(k)), lambda: _fused_saved(model, k))


def _fused_saved(model: Any, k: int) -> frozenset[int]:
    program, analysis, block = model.program, model.analysis, model.blocks.blocks[k]
    lay, free = model.layouts[k], _free(model, k)
    graph, _ = option_graph(model, k)
    eqns = program.eqns[block.start : block.stop]

    def fused(n: int) -> bool:  # recomputed (so is a tied value)
        return eqns[n].name in FUSED or not lay.tied.isdisjoint(eqns[n].outs)

    kept: set[int] = set()
    todo = [r for refs in graph.needs for r in refs]
    recomputed: set[int] = set()
    for n, own in enumerate(graph.self_recompute):
        if own and fused(n):
            recomputed.add(n)
            todo.extend(graph.inputs[n])
        elif own:
            kept.update(eqns[n].outs[j] for j in analysis.infos[block.start + n].needs_out)
    while todo:
        node = graph.maker(todo.pop())
        if not fused(node):
            kept.update(eqns[node].outs)
        elif node not in recomputed:
            recomputed.add(node)
            todo.extend(graph.inputs[node])
    return frozenset(v for v in kept if v not in free)


def saved_estimate(model: Any, k: int, option: SaveOption) -> int:
    """Cached per distinct block: see :func:`_saved_estimate`."""
    key = ("saved", model.identity(k), option)
    return model.cached(key, lambda: _saved_estimate(model, k, option))


def _saved_estimate(model: Any, k: int, option: SaveOption) -> int:
    """Bytes the recording of block k keeps under ``option`` beyond its outputs, from
    the equations' residuals (before the option's function is traced): for a save set,
    the saved values its backward reads (:func:`solvers.blocks.options.read_values`);
    for plain autodiff, every residual of every equation (inputs and outputs it reads,
    new JVP values), each value once; for ``xla_fused``, :func:`fused_saved`'s values
    and the new JVP values of the operations XLA does not fuse."""
    program, analysis, block = model.program, model.analysis, model.blocks.blocks[k]
    if option.kind == "fused":
        return sum(map(program.nbytes, fused_saved(model, k))) + sum(
            analysis.infos[i].new_bytes for i in range(block.start, block.stop)
            if analysis.infos[i].has_backward and program.eqns[i].name not in FUSED
        )  # fmt: skip
    if option.kind == "everything":
        free = _free(model, k)
        values: set[int] = set()
        new = 0
        for i in range(block.start, block.stop):
            eqn, info = program.eqns[i], analysis.infos[i]
            if not info.has_backward:
                continue
            values.update(eqn.ins[j] for j in info.needs_in)
            values.update(eqn.outs[j] for j in info.needs_out)
            new += info.new_bytes
        return new + sum(
            program.nbytes(v) for v in values if not isinstance(v, Lit) and v not in free
        )
    graph, _ = option_graph(model, k)
    saved = saved_candidates(model, k, option)
    return sum(graph.value_sizes[c] for c in read_values(graph, saved))

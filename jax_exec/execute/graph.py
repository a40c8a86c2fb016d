"""The one op-by-op interpreter of graph schedules (docs/jax_exec.md, "The execution
core"), and its front end for the planner's block model (docs/auto.md, "Graph methods").

:func:`run_graph_ops` runs the ``Compute``/``Free`` ops of a ``schedir.GraphSchedule``
for a :class:`GraphProgram`, which says what ``Compute(i)`` launches and which arrays
node i holds; the interpreter does the rest, once for every front end. Node i is the
buffer ``("node", i)`` of a :class:`~jax_exec.execute.buffers.Buffers` (read it with
:func:`node_arrays`). ``Compute`` stores the arrays its kernel(s) made there, ``Free``
deletes them (an input node's arrays are the caller's: never deleted, ``Free`` only
stops counting them). After every op the live bytes (distinct arrays, ``nbytes``) are
measured, and each compute's need (live bytes right after its outputs plus its
kernel's temporary bytes): for a program whose graph gives the exact bytes of its
buffers, they equal ``simulate_graph``'s ``resident`` and ``op_peak``.

Two front ends implement :class:`GraphProgram`: a hand-written DAG of Flax NNX modules
(:func:`jax_exec.graph.run_graph`; one kernel per node) and the planner's block model
(:func:`run_graph_schedule`, here). A graph method (``checkmate_milp``, ``dtr``, ...)
schedules the graph of the block chain (:func:`schedir.blocks.graph.block_graph`):
``F{k}`` holds the values block k makes (its ``forward`` kernel), ``R{k}`` its saved
residuals under the option (its ``record`` kernel, whose outputs are dropped: counted
in the need, then deleted), ``loss`` and ``B{k}`` cotangents (the loss kernel; block
k's backward phases, which free nothing: the inputs are nodes, freed by ``Free`` ops).
The model state after the step comes from the first forward of each block, and the
parameters' gradients from the first run of each backward node.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jax

from jax_exec.execute.buffers import Buffers
from jax_exec.execute.interpreter import run_backward, step_result
from jax_exec.execute.result import OpMeter, RunResult
from jax_exec.program.model import BlockModel, global_values, through_flags
from schedir import Compute, Free, Graph, simulate_graph
from schedir.blocks.graph import BlockNodes, block_graph


@dataclass(frozen=True)
class Computed:
    """What one ``Compute`` made (a :class:`GraphProgram` answers it).

    Attributes:
        arrays: key -> array: node i's buffer from now on.
        temp: temporary bytes of the kernel launched (``memory_analysis``).
        kernel: what it launched (``RunResult.op_kernels``), e.g. ``"fwd v"``.
        dropped: fresh arrays the kernel made that the node does not hold: counted in
            the need, then deleted.
        need: the need when the front end measured it itself (a phased backward: the
            largest over its phases), else None: live bytes + ``dropped`` + ``temp``.
        scratch: a buffer of intermediates (the phases') to drop once ``arrays`` are in
            place (they may be among them), or None.
    """

    arrays: dict
    temp: int
    kernel: str
    dropped: tuple = ()
    need: int | None = None
    scratch: Hashable | None = None


class GraphProgram(Protocol):
    """What a front end gives :func:`run_graph_ops`."""

    def inputs(self) -> Mapping[int, Mapping]:
        """Input node -> its arrays (key -> array), placed before the first op; the
        caller's: never deleted."""
        ...

    def compute(self, i: int, buf: Buffers) -> Computed:
        """Launch node i's kernel(s) on the arrays of the nodes it reads
        (:func:`node_arrays`); ``buf`` also holds a phased kernel's intermediates."""
        ...

    def result(self, meter: OpMeter, ops: tuple) -> RunResult:
        """The step's result once every op ran (its buffers dropped): loss, grads,
        state, from what ``compute`` kept, and what ``meter`` recorded."""
        ...


def node_arrays(buf: Buffers, i: int) -> dict:
    """The arrays node i holds (key -> array)."""
    return buf.table["node", i]


def run_graph_ops(program: GraphProgram, graph: Graph, ops: tuple) -> RunResult:
    """Run ``ops`` (``Compute``/``Free`` ops of ``graph``) op by op for ``program``
    (module docstring).

    Raises:
        schedir.InvalidSchedule: the simulator rejects ``ops`` on ``graph``.
    """
    simulate_graph(graph, ops)  # every op valid, the step complete, or a clear error
    buf = Buffers()
    for i, arrays in program.inputs().items():
        buf.table["node", i] = dict(arrays)
        buf.keep.update(id(a) for a in arrays.values())
    meter = OpMeter(buf.nbytes(), kernels=True)
    for op in ops:
        start = time.perf_counter()
        if isinstance(op, Compute):
            made = program.compute(op.node, buf)
            jax.block_until_ready((list(made.arrays.values()), made.dropped))
            seconds = time.perf_counter() - start
            buf.table["node", op.node] = made.arrays
            need = made.need
            if need is None:
                need = buf.nbytes() + sum(int(a.nbytes) for a in made.dropped) + made.temp
            for a in made.dropped:
                a.delete()
            if made.scratch is not None:
                buf.drop(made.scratch)
            temp, kernel = made.temp, made.kernel
        elif isinstance(op, Free):
            buf.drop(("node", op.node))
            seconds, temp, kernel = time.perf_counter() - start, 0, None
            need = buf.nbytes()
        else:  # pragma: no cover - simulate_graph rejects foreign ops
            raise TypeError(f"not a graph op: {op!r}")
        meter.record(seconds, temp, need, buf.nbytes(), kernel=kernel)
    meter.stop()
    buf.clear()  # what the schedule left (e.g. the inputs' gradients): results are kept
    return program.result(meter, tuple(ops))


# ------------------------------------------------------------ the block model


@dataclass
class _BlockGraph:
    """The :class:`GraphProgram` of a block model's graph (module docstring)."""

    model: BlockModel
    where: BlockNodes
    call: tuple  # (params, rest, args)
    gv: dict  # global value id -> array (parameters, state, arguments)

    def __post_init__(self) -> None:
        self.results: dict[int, Any] = {}  # value id -> the state after the step, ...
        self.grads: dict[int, Any] = {}
        self.forwarded: set[int] = set()
        self.differentiated: set[int] = set()
        self.loss: Any = None

    def inputs(self) -> Mapping[int, Mapping]:
        return {}  # a traced program's first cut is empty (run_graph_schedule checks)

    def _value(self, buf: Buffers, v: int) -> Any:  # node keys are the problem's value ids
        return node_arrays(buf, self.where.maker[self.model.value_index[v]])[v]

    def _grad(self, buf: Buffers, v: int, after: int) -> Any:
        """The cotangent of value v from the first block after ``after`` reading it."""
        model = self.model
        r = next((j for j in range(after, model.length) if v in model.blocks.blocks[j].ins),
                 model.length)  # fmt: skip
        return node_arrays(buf, self.where.grad[model.value_index[v], r])[v]

    def _args(self, buf: Buffers, k: int) -> tuple:
        lay = self.model.layouts[k]
        p = tuple(self.gv[v] for v in lay.params)
        g = tuple(self.gv[v] for v in lay.others)
        return p, g, tuple(self._value(buf, v) for v in lay.ins)

    def _keep_results(self, buf: Buffers, k: int, res: tuple) -> None:
        if k in self.forwarded:  # the state after the step comes from the first forward
            for r in res:
                r.delete()
            return
        self.forwarded.add(k)
        self.results.update(zip(self.model.layouts[k].results, res, strict=True))
        buf.keep.update(id(r) for r in res)

    def _add_grads(self, i: int, k: int, d_p: tuple) -> None:
        if i in self.differentiated:  # a backward run again makes the same gradients
            return
        self.differentiated.add(i)
        for vid, d in zip(self.model.layouts[k].params, d_p, strict=True):
            self.grads[vid] = d if vid not in self.grads else self.grads[vid] + d

    def compute(self, i: int, buf: Buffers) -> Computed:
        model, where = self.model, self.where
        role, k = where.role(i)
        lay = model.layouts[k]
        active = [v for v, a in zip(lay.ins, lay.act_in, strict=True) if a]
        if role == "fwd":
            kernel = model.kernel("forward", k)
            outs, res = kernel.call(*self._args(buf, k))
            self._keep_results(buf, k, res)
            return Computed(dict(zip(lay.outs, outs, strict=True)), kernel.temp_bytes, f"fwd {k}")
        if role == "res":
            kernel = model.kernel("record", k, where.options[k])
            outs, res, new = kernel.call(*self._args(buf, k))
            self._keep_results(buf, k, res)
            saved = {("new", j): a for j, a in enumerate(new)}
            # the outputs are F{k}'s; here they are temporaries
            return Computed(saved, kernel.temp_bytes, f"res {k}", dropped=tuple(outs))
        if role == "loss":
            kernel = model.kernel("loss", k)
            self.loss, res, d_p, d_x = kernel.call(*self._args(buf, k))
            self.results.update(zip(lay.results, res, strict=True))
            buf.keep.update(id(r) for r in res)
            self._add_grads(i, k, d_p)
            return Computed(dict(zip(active, d_x, strict=True)), kernel.temp_bytes, "loss")
        # "bwd"
        o = where.options[k]
        p, g, x = self._args(buf, k)
        made = node_arrays(buf, where.fwd[k])
        outs = tuple(made[v] for v in lay.outs)
        res = tuple(self.results[v] for v in lay.results)
        saved = node_arrays(buf, where.res[k]) if where.res[k] is not None else {}
        new = tuple(saved[("new", j)] for j in range(len(model.functions(k, o).recipe.new)))
        d_outs = tuple(
            self._grad(buf, v, k + 1) for v, a in zip(lay.outs, lay.act_out, strict=True) if a
        )
        flags = through_flags(model, k)
        through = tuple(
            self._grad(buf, v, k + 1) if f else None for v, f in zip(active, flags, strict=True)
        )
        pb, kernels = model.backward_kernels(k, o)
        d_p, d_x, need, temp = run_backward(
            buf, pb, kernels, (p, g, x, outs, res, new, d_outs, through), None, k
        )
        self._add_grads(i, k, d_p)
        d_in = dict(zip(active, d_x, strict=True))
        return Computed(d_in, temp, f"bwd {k}", need=need, scratch=("phase", k))

    def result(self, meter: OpMeter, ops: tuple) -> RunResult:
        return step_result(self.model, self.call, self.gv, self.grads, self.results,
                           self.loss, meter, ops)  # fmt: skip


def run_graph_schedule(
    model: BlockModel, schedule: Any, options: tuple[int, ...], params: Any, rest: Any,
    args: tuple,
) -> RunResult:  # fmt: skip
    """Run a graph schedule of ``block_graph(model.problem, options)`` (one save option
    per block) op by op (module docstring)."""
    graph, where = block_graph(model.problem, options)
    if model.blocks.cuts[0]:  # pragma: no cover - a traced program's first cut is empty
        raise ValueError("a block model whose first cut holds values has no graph runtime")
    call = (params, rest, args)
    program = _BlockGraph(model, where, call, global_values(model, params, rest, args))
    return run_graph_ops(program, graph, schedule.ops)

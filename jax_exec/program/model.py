"""A traced model as a block chain: blocks, save options, kernels and the
:class:`schedir.blocks.BlockChain` they define (docs/auto.md).

:func:`jax_exec.program.build.block_model` traces and analyzes the model, cuts it into
blocks, gives every distinct block its save options (:mod:`jax_exec.program.options`),
and builds the problem (:mod:`jax_exec.program.problem`). The :class:`BlockModel`
traces each block's functions under its options, compiles its kernels
(:mod:`jax_exec.program.compiled`) and knows which figures are exact.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import jax

from jax_exec.program import placement
from jax_exec.program.analysis import Analysis, CostModel
from jax_exec.program.blocks import Blocks
from jax_exec.program.compiled import (
    BLOCK_TABLES,
    Kernel,
    in_background,
    kernels_of,
    traced_kernels,
)
from jax_exec.program.flat import Program, aval_bytes
from jax_exec.program.kernels import (
    BlockFunctions,
    Layout,
    SaveOption,
    block_functions,
    checkpointed_body,
    loss_function,
)
from jax_exec.program.phases import LATE_PHASES, MAX_PHASES, PhasedBackward, phased_backward
from jax_exec.program.placement import place
from jax_exec.program.trace import Traced
from schedir import Platform
from schedir.blocks.problem import BlockChain


@dataclass
class BlockModel:
    """Everything the planner and both executors share for one model and input shapes.

    Attributes:
        traced: the traced model (:class:`~jax_exec.program.trace.Traced`).
        analysis: per-equation costs and residuals.
        blocks: the chain of blocks (the loss stage last).
        layouts: one :class:`~jax_exec.program.kernels.Layout` per block.
        options: per chain stage, its save options.
        value_index: cut value id -> index in the problem's ``value_sizes``.
        problem: the block chain (exact bytes; roofline seconds).
        cost_model: the roofline model of the times.
        host_link: the platform whose host link the host-memory variants' copies
            take (:func:`~jax_exec.program.host_variants.with_host_variants`; None: no
            variant).
    """

    traced: Traced
    analysis: Analysis
    blocks: Blocks
    layouts: tuple[Layout, ...]
    options: tuple[tuple[SaveOption, ...], ...]
    value_index: dict
    problem: BlockChain | None = None
    cost_model: CostModel = field(default_factory=CostModel)
    host_link: Platform | None = None
    # Functions, phases and kernels by what they compute (BlockModel.identity): shared by
    # identical blocks and, through these process-wide tables, by every plan of the
    # process (another budget, value_and_grad's plans, the same layers in another model).
    _functions: dict = field(default_factory=lambda: BLOCK_TABLES["functions"])
    _kernels: dict = field(default_factory=lambda: BLOCK_TABLES["kernels"])
    _phases: dict = field(default_factory=lambda: BLOCK_TABLES["phases"])  # -> PhasedBackward
    _cache: dict = field(default_factory=dict)  # this model's analyses (its cost model...)
    # The kernels (and recorded options) this solve has asked for: only their figures are
    # exact, even where the process compiled more, so that a plan never depends on what
    # was planned before it (cold and warm caches give the same plan).
    known: set = field(default_factory=set)
    timings: dict = field(default_factory=dict)  # seconds per planning phase
    # ``progress(fraction, message)`` while planning (``jax_exec.plan(progress=...)``)
    progress: Callable[[float, str], None] | None = None
    # the store-all reference's kernels, compiled ahead while the options are made
    # (program_model(ahead=True)); waited for before this model compiles anything
    ahead: Future | None = field(default=None, repr=False)

    def cached(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per ``key`` (per-block analyses shared by identical blocks)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @property
    def program(self) -> Program:
        return self.traced.program

    @property
    def length(self) -> int:
        return self.blocks.length

    @property
    def sharded(self) -> bool:
        """Whether the model's values are sharded over several devices (every figure is
        then per device, every kernel placed: :mod:`jax_exec.program.placement`)."""
        return bool(self.program.shardings)

    def specs(self, k: int) -> tuple:
        """Shapes of block k's ``(p, g, x)`` arguments (with their shardings when the
        model is sharded)."""
        lay, spec = self.layouts[k], self.program.spec
        return (
            tuple(spec(v) for v in lay.params),
            tuple(spec(v) for v in lay.others),
            tuple(spec(v) for v in lay.ins),
        )

    def identity(self, k: int) -> tuple:
        """What block k computes, as a key: its equations, shapes and wiring
        (``Block.key``), the values it names (materialized values and outputs) and, for
        a sharded model, where its arguments and values live."""
        lay = self.layouts[k]
        if not self.sharded:
            return (self.blocks.blocks[k].key, lay.named)
        where = self.program.shardings.get
        local = sorted(lay.local, key=lay.local.get)
        placed = tuple(where(v) for v in (*lay.params, *lay.others, *lay.ins, *local))
        return (self.blocks.blocks[k].key, lay.named, placed)

    def functions(self, k: int, o: int) -> BlockFunctions:
        """Traceable functions of block k under its option o (shared by identical
        blocks; the loss stage has one option: plain autodiff)."""
        block = self.blocks.blocks[k]
        option = self.option(k, o).on_device()
        key = (self.identity(k), option)
        if key not in self._functions:
            body = self._functions.setdefault(
                (self.identity(k), "body"),
                checkpointed_body(self.program, block, self.layouts[k]),
            )  # one per block, for JAX's caches: kernels.checkpointed_body
            self._functions[key] = block_functions(
                self.program, block, self.layouts[k], option, self.specs(k), body
            )
        return self._functions[key]

    def option(self, k: int, o: int) -> SaveOption:
        if k == self.length:
            return SaveOption("everything", label="loss")
        return self.options[k][o]

    def kernel_key(self, kind: str, k: int, o: int = 0) -> tuple:
        """Cache key of a kernel: identical blocks share it (a host-memory variant
        shares its option's recording, its backward :meth:`backward_option`'s)."""
        option = None
        if kind == "record":
            option = self.option(k, o).on_device()
        elif kind == "backward":
            option = self.backward_option(k, o)
        flags = through_flags(self, k) if kind == "backward" else ()
        return (kind, self.identity(k), option, flags)

    def kernel(self, kind: str, k: int, o: int = 0) -> Kernel:
        """A compiled kernel of block k (cached): ``"forward"``, ``"record"`` (option o)
        or ``"loss"`` (the backward runs as phases: :meth:`backward_kernels`). The
        op-by-op runtime runs the very executables the planner read the temporary bytes
        of (:meth:`_build_units`), so its measured memory is the plan's by construction."""
        if kind == "backward":
            raise ValueError("the backward of a block runs as phases: use backward_kernels")
        self._build_units([(kind, k, o)])
        return self._kernels[self.kernel_key(kind, k, o)]

    def compiled(self, key: tuple) -> Kernel | None:
        """The kernel of this key (:meth:`kernel_key`, a backward phase's with its
        index) if this process compiled it, else None."""
        return self._kernels.get(key)

    def backward_option(self, k: int, o: int) -> SaveOption:
        """The option whose phased backward block k's option o runs: its own; a
        late-residual variant's is cut into up to ``LATE_PHASES`` phases; an all-on-host
        variant runs the late variant's where block k offers it (its late residuals
        come back as late), else its option's (all back at the backward's start): the
        variants compile no kernel of their own."""
        option = self.option(k, o)
        if option.host != "all":
            return option
        late = dataclasses.replace(option, host="late")
        return late if late in self.options[k] else option.on_device()

    def phased(self, k: int, o: int) -> PhasedBackward:
        """Block k's backward under option o as phases (:mod:`jax_exec.program.phases`;
        inputs that later blocks read too get their cotangent from ``d[k+1]`` added;
        a host-memory variant's: up to ``LATE_PHASES``, :meth:`backward_option`)."""
        key = self.kernel_key("backward", k, o)
        if key not in self._phases:
            fn, *args = self.kernel_source("backward", k, o)
            most = LATE_PHASES if key[2].host else MAX_PHASES
            self._phases[key] = phased_backward(fn, tuple(args), most)
        return self._phases[key]

    def host_residuals(self, k: int, o: int) -> dict[int, int]:
        """Index in the recording's new residuals -> bytes, of those block k's option o
        keeps in host memory (empty unless a host-memory variant: an option's own
        backward is not traced for it, that is the kernels' work)."""
        if not self.option(k, o).host:
            return {}
        sizes = self.phased(k, o).new_bytes()
        return {i: sizes[i] for i in self.host_returns(k, o)}

    def host_returns(self, k: int, o: int) -> dict[int, int]:
        """Index in the recording's new residuals -> the backward phase before which it
        is back on the device, of those block k's option o keeps in host memory
        (:meth:`~jax_exec.program.phases.PhasedBackward.returns`)."""
        host = self.option(k, o).host
        return self.phased(k, o).returns(host) if host else {}

    def backward_kernels(self, k: int, o: int) -> tuple[PhasedBackward, tuple[Kernel, ...]]:
        """The phases of block k's backward under option o and their compiled kernels."""
        key = self.kernel_key("backward", k, o)
        self._build_units([("backward", k, o)])
        pb = self.phased(k, o)
        return pb, tuple(self._kernels[(*key, j)] for j in range(len(pb.phases)))

    def _jobs(self, kind: str, k: int, o: int = 0) -> list[tuple]:
        """The kernels to compile for ``(kind, k, o)``: ``(key, kind, k, o, phase)``, a
        backward's one per phase (a sharded model's after its record kernel, whose
        residuals its first phase reads where they live)."""
        if kind != "backward":
            return [(self.kernel_key(kind, k, o), kind, k, o, None)]
        key = self.kernel_key("backward", k, o)
        record = [(self.kernel_key("record", k, o), "record", k, o, None)] if self.sharded else []
        return record + [((*key, j), kind, k, o, j) for j in range(len(self.phased(k, o).phases))]

    def _source(self, job: tuple) -> tuple | None:
        """``(function, shapes, out_shardings)`` of a job (:meth:`_jobs`) to compile;
        None while a kernel it depends on is not compiled (a sharded model's phases)."""
        _, kind, k, o, j = job
        if j is None:
            return self.kernel_source(kind, k, o), placement.out_shardings(self, kind, k, o)
        if self.sharded:
            return placement.phase_source(self, k, o, j, through_flags(self, k))
        pb = self.phased(k, o)
        return (pb.function(j), *pb.specs(j)), None

    def _build_units(self, units: list[tuple[str, int, int]]) -> int:
        """Compile the kernels of these ``(kind, block, option)`` not compiled in this
        process yet; the recordings and phased backwards they need are traced in the
        lowering thread, overlapping the compilation of the kernels before them
        (:func:`traced_kernels`; a sharded model's in waves, :meth:`_build`). Returns
        how many were compiled."""
        self.settle()
        if self.sharded:
            return self._build([job for unit in units for job in self._jobs(*unit)])
        asked: set = set()  # identical blocks share kernels: each is lowered once

        def batch(unit: tuple) -> Callable[[], list[tuple]]:
            def sources() -> list[tuple]:
                found = []
                for job in self._jobs(*unit):
                    if job[0] not in self._kernels and job[0] not in asked:
                        asked.add(job[0])
                        found.append((job[0], self._source(job)))
                return found

            return sources

        todo = [unit for unit in dict.fromkeys(units) if not self._built(*unit)]
        named = traced_kernels([batch(unit) for unit in todo], self.progress)
        self._kernels.update(named)
        return len(named)

    def settle(self) -> None:
        """Wait for the kernels compiled ahead (:func:`program_model`), if any: their
        failures are not this model's to raise (compiled again when asked, they raise
        there)."""
        if self.ahead is not None:
            ahead, self.ahead = self.ahead, None
            try:
                ahead.result()
            except Exception:  # noqa: BLE001 - see the docstring
                pass

    def _in_background(self, units: list[tuple[str, int, int]]) -> Future:
        """Compile these kernels in the background thread, into the process-wide
        tables, on a copy that knows none of them (the planner's solves take as exact
        only what they ask for: :attr:`known`); :meth:`settle` waits for it."""
        copy = dataclasses.replace(self, known=set(), timings={}, ahead=None)
        return in_background(copy._build_units, units)

    def _built(self, kind: str, k: int, o: int) -> bool:
        """Whether every kernel of ``(kind, k, o)`` is compiled (without tracing it)."""
        if kind != "backward":
            return self.kernel_key(kind, k, o) in self._kernels
        key = self.kernel_key("backward", k, o)
        pb = self._phases.get(key)
        return pb is not None and all((*key, j) in self._kernels for j in range(len(pb.phases)))

    def _build(self, jobs: list[tuple]) -> int:
        """Compile the jobs' kernels not compiled in this process yet
        (:func:`kernels_of`), a sharded model's in waves (a phase after the kernels it
        reads from); a sharded backward's figures become per device once all its phases
        are compiled. Returns how many were compiled."""
        todo = {job[0]: job for job in jobs if job[0] not in self._kernels}
        total = len(todo)
        while todo:
            ready = {key: src for key, job in todo.items() if (src := self._source(job))}
            if not ready:  # pragma: no cover - every wave has a phase whose inputs are known
                raise RuntimeError(f"kernels waiting on each other: {list(todo)}")
            compiled = kernels_of(list(ready.values()), self.progress)
            self._kernels.update(zip(ready, compiled, strict=True))
            for key in ready:
                del todo[key]
        for _, _, k, o, j in jobs if self.sharded else ():
            placed = placement.per_device(self, k, o, through_flags(self, k)) if j == 0 else None
            if placed is not None:
                self._phases[self.kernel_key("backward", k, o)] = placed
        return total

    def kernel_source(self, kind: str, k: int, o: int = 0) -> tuple:
        """``(function, *shapes)`` of a kernel, to compile with
        :func:`jax_exec.kernels.compile_kernel`."""
        specs = self.specs(k)
        block, lay = self.blocks.blocks[k], self.layouts[k]
        if kind == "loss":
            return (loss_function(self.program, block, lay), *specs)
        if kind == "forward":
            return (self.functions(k, 0).forward, *specs)
        if kind == "record":
            return (self.functions(k, o).record, *specs)
        if kind != "backward":  # pragma: no cover
            raise ValueError(f"unknown kernel kind {kind!r}")
        fns = self.functions(k, o)
        spec = self.program.spec
        outs = tuple(spec(v) for v in lay.outs)
        results = tuple(spec(v) for v in lay.results)
        d_outs = tuple(spec(v) for v, a in zip(lay.outs, lay.act_out, strict=True) if a)
        act_ins = [v for v, a in zip(lay.ins, lay.act_in, strict=True) if a]
        flags = through_flags(self, k)
        through = tuple(spec(v) if f else None for v, f in zip(act_ins, flags, strict=True))
        return (fns.backward, *specs, outs, results, fns.recipe.new, d_outs, through)

    def backward_bytes(self, k: int, o: int, lower: bool = False) -> tuple[int, int, bool]:
        """``(bwd_tmp, bwd_release, exact)`` of block k's backward under option o: from
        its phases' compiled temporaries once compiled
        (:meth:`~jax_exec.program.phases.PhasedBackward.effective`), else an estimate of
        one kernel's that frees nothing (:func:`jax_exec.program.options.temp_estimate`).
        ``lower``: a lower bound instead of an estimate where the phases are traced
        (uncompiled phases' temporaries taken as 0; both figures grow with them). A
        host-memory variant's bytes back from host memory count from their phase on
        (its phases are traced when it is made,
        :func:`~jax_exec.program.host_variants.with_host_variants`)."""
        from jax_exec.program.options import temp_estimate

        host = self.option(k, o).host
        key = self.kernel_key("backward", k, o)
        if key in self._phases:
            pb = self._phases[key]
            phases = [(*key, j) for j in range(len(pb.phases))]
            temps = tuple(self._kernels[j].temp_bytes if j in self.known else 0 for j in phases)
            if all(j in self.known for j in phases):
                return (*pb.effective(temps, host), True)
            if lower:
                return (*pb.effective(temps, host), False)
        if lower:
            raise ValueError(f"block {k} option {o}: no lower bound before trace_options()")
        back = sum(self.host_residuals(k, o).values())  # on the device at its peak
        option = self.option(k, o).on_device()
        missed = self._missed("backward", k, option)
        return temp_estimate(self, "backward", k, option) + missed + back, 0, False

    def temp_bytes(self, kind: str, k: int, o: int = 0, lower: bool = False) -> tuple[int, bool]:
        """``(bytes, exact)``: the kernel's compiled temporary bytes if it was compiled,
        else an estimate (:func:`jax_exec.program.options.temp_estimate`), or 0 with
        ``lower`` (a lower bound); for ``"backward"`` see :meth:`backward_bytes`."""
        from jax_exec.program.options import temp_estimate

        if kind == "backward":
            tmp, release, exact = self.backward_bytes(k, o, lower)
            return tmp - release, exact
        key = self.kernel_key(kind, k, o)
        if key in self.known:
            return self._kernels[key].temp_bytes, True
        if lower:
            return 0, False
        option = self.option(k, o) if kind in ("record", "backward") else None
        return temp_estimate(self, kind, k, option) + self._missed(kind, k, option), False

    def _missed(self, kind: str, k: int, option: SaveOption | None) -> int:
        """The temporary bytes the estimate missed on block k's store-all kernel of this
        kind, once this solve compiled it (:attr:`known`), else 0: what XLA adds whatever
        the option (a convolution's gradient, for one) is added to the other options'
        estimates of the block. Only this solve's kernels count: a plan never depends
        on what other plans compiled."""
        from jax_exec.program.options import store_all_options, temp_estimate

        if kind not in ("record", "backward"):  # a forward is the same under every option
            return 0
        reference = self.cached("store_all", lambda: store_all_options(self))[k]
        if option == reference or reference not in self.options[k]:
            return 0
        o = self.options[k].index(reference)
        if kind == "backward":
            tmp, _, exact = self.backward_bytes(k, o)
        else:
            tmp, exact = self.temp_bytes(kind, k, o)
        if not exact:
            return 0
        return max(0, tmp - temp_estimate(self, kind, k, reference))

    def trace_options(self) -> None:
        """Trace every option's recording and phased backward: their saved bytes become
        exact and the phases' frees known, so that ``build_problem(model, lower=True)``
        bounds every figure from below. Meanwhile every block's forward kernel is
        compiled in the background (the least-memory schedules that
        :func:`jax_exec.auto.least.exact_least` compiles recompute nearly every block;
        tracing holds the GIL, XLA's compilation does not); they become known when a
        schedule asks for them. A sharded model's bytes per device are known from
        compiled kernels only: every option's are compiled."""
        if self.sharded:
            self.compile(self.every_kernel())
        else:  # the forward kernels compile (XLA holds no GIL) while the options are traced
            for k in range(self.length):
                self.functions(k, 0)  # traced here first: the background thread only reads them
            forwards = [("forward", k, 0) for k in range(self.length)]
            # (after any kernels compiled ahead: one background thread runs them in turn)
            self.ahead = self._in_background(forwards)
        for k in range(self.length):
            for o in range(len(self.options[k])):
                self.phased(k, o)  # traces the recording too (its recipe)
                self.known.add((self.identity(k), self.option(k, o).on_device()))

    def saved_bytes(self, k: int, o: int) -> tuple[int, bool]:
        """``(bytes, exact)``: what block k's recording keeps under option o beyond its
        outputs (on the device and, for a host-memory variant, in host memory): the
        traced recipe's new residuals once traced (a variant's always are: it is made
        from its traced phases), else the model's estimate
        (:func:`jax_exec.program.options.saved_estimate`)."""
        from jax_exec.program.options import saved_estimate

        key = (self.identity(k), self.option(k, o).on_device())
        traced = key in self.known or bool(self.option(k, o).host)  # a variant's always is
        if traced and not self.sharded:
            return self._functions[key].recipe.new_bytes, True
        record = self.kernel_key("record", k, o)
        if traced and record in self.known:  # where its kernel put them
            new = self._functions[key].recipe.new
            placed = placement.residual_shardings(self, k, o)
            return sum(aval_bytes(s, p) for s, p in zip(new, placed, strict=True)), True
        return saved_estimate(self, k, self.option(k, o)), False

    def option_exact(self, k: int, o: int) -> bool:
        """Whether every figure of block k's option o is exact (its recording traced,
        its record and backward kernels compiled)."""
        return (
            self.saved_bytes(k, o)[1]
            and self.temp_bytes("record", k, o)[1]
            and self.backward_bytes(k, o)[2]
        )

    def used_kernels(self, schedule: Any) -> list[tuple[str, int, int]]:
        """``(kind, block, option)`` of every kernel the op-by-op runtime runs for
        ``schedule`` (a block-chain schedule of this model)."""
        options = schedule.options
        used = []
        for op in schedule.ops:
            name = type(op).__name__
            if name == "Loss":
                used.append(("loss", self.length, 0))
            elif name == "B":
                used.append(("backward", op.index, options[op.index]))
            elif name == "F_all":
                used.append(("record", op.index, options[op.index]))
            else:
                used.append(("forward", op.index, 0))
        return list(dict.fromkeys(used))

    def every_kernel(self, options: tuple[int, ...] | None = None) -> list[tuple[str, int, int]]:
        """``(kind, block, option)`` of every kernel a schedule of these options (one per
        block; None: of every option) may run (identical blocks share them)."""
        kernels = [("loss", self.length, 0)]
        for k in range(self.length):
            kernels.append(("forward", k, 0))
            chosen = range(len(self.options[k])) if options is None else (options[k],)
            for o in chosen:
                kernels += [("record", k, o), ("backward", k, o)]
        return kernels

    def compile_used(self, schedule: Any) -> int:
        """Compile the kernels ``schedule`` runs for their temporary bytes; the number
        compiled now (:meth:`compile`)."""
        return self.compile(self.used_kernels(schedule))

    def compile(self, kernels: list[tuple[str, int, int]]) -> int:
        """Make these ``(kind, block, option)`` kernels' figures exact: compile those not
        compiled in this process yet (XLA compiles them in parallel threads,
        :func:`traced_kernels`; a backward is one kernel per phase), for their temporary bytes
        and for the op-by-op runtime. Returns how many became known to this solve
        (:attr:`known`), compiled now or before."""
        start = time.perf_counter()
        compiled = self._build_units(kernels)
        new: list = []
        for kind, k, o in kernels:
            if kind in ("record", "backward"):  # its recording, traced
                new.append((self.identity(k), self.option(k, o).on_device()))
            new += [job[0] for job in self._jobs(kind, k, o)]
        fresh = set(new) - self.known
        self.known.update(fresh)
        self.timings["kernels"] = self.timings.get("kernels", 0.0) + time.perf_counter() - start
        self.timings["compiled"] = self.timings.get("compiled", 0) + compiled
        return sum(1 for key in fresh if key[0] in ("forward", "record", "backward", "loss"))


def through_flags(model: BlockModel, k: int) -> tuple[bool, ...]:
    """Per differentiated input of block k: whether a later block reads it too (its
    cotangent from ``d[k+1]`` is added to the block's own)."""
    lay = model.layouts[k]
    nxt = set(model.blocks.cuts[k + 1]) if k < model.length else set()
    return tuple(v in nxt for v, a in zip(lay.ins, lay.act_in, strict=True) if a)


def global_values(model: BlockModel, params: Any, rest: Any, args: tuple) -> dict:
    """value id -> array for the program's inputs and constants. Each leaf must have
    the planned shape and dtype (else ``ValueError`` naming it; ``model.param_shards``:
    parameters arrive as shards, as a ZeRO-3 step's do); a weakly typed leaf (a
    parameter made from a Python scalar) is made strongly typed, as planned: the blocks'
    recipes were traced at the planned types."""
    program = model.program
    flat = jax.tree_util.tree_flatten_with_path((params, rest, tuple(args)))[0]
    ids = program.param_ids + program.rest_ids + program.arg_ids
    if len(flat) != len(ids):
        raise ValueError(
            f"the call has {len(flat)} array leaves (parameters, state, arguments), the "
            f"traced model {len(ids)}: call with the same model and argument structure"
        )
    values = {}
    shards = frozenset(program.param_ids) if getattr(model, "param_shards", False) else ()
    for (path, leaf), vid in zip(flat, ids, strict=True):
        aval, planned = jax.typeof(leaf), program.avals[vid]
        shape_differs = vid not in shards and tuple(aval.shape) != tuple(planned.shape)
        if shape_differs or aval.dtype != planned.dtype:
            group = ("params", "state", "args")[path[0].idx]
            raise ValueError(
                f"{group}{jax.tree_util.keystr(path[1:])} is {aval.str_short()}, the plan "
                f"was made for {planned.dtype}{list(planned.shape)}: plan again for these "
                f"shapes and dtypes"
            )
        values[vid] = jax.lax.convert_element_type(leaf, planned.dtype) if aval.weak_type else leaf
    values.update(program.consts)
    for vid, (src, i) in sorted(program.derived.items()):  # slices of stacked globals
        values[vid] = jax.lax.index_in_dim(values[src], i, keepdims=False)
    for vid, sharding in program.shardings.items():  # a sharded model's: where planned
        value = values.get(vid)
        if value is not None and not isinstance(value, jax.core.Tracer):
            values[vid] = place(value, sharding)
    return values

"""Low-bit activation storage: a block's saved residuals kept in fewer bits
(docs/device_memory.md, "Low-bit activation storage").

A *low-bit option* is a save option of a block (:class:`~jax_exec.program.kernels.SaveOption`)
whose new residuals (what its recording keeps beyond its outputs) are stored in one of

- ``bfloat16``: the value rounded to bfloat16;
- ``float8_e4m3fn``: the value divided by a per-tensor scale ``max|x| / 448`` and
  rounded to float8 e4m3 (the scale kept in float32);
- ``int8``: the value divided by ``max|x| / 127``, rounded and clipped to [-127, 127]
  (the scale kept in float32);

and decompressed (multiplied back, in the residual's dtype) at the start of the
block's backward. Only floating residuals wider than the storage are compressed, and
only when the compressed bytes (with the scale) are fewer; integer masks, RNG keys and
small scalars stay as they are. Compression is a wrapper of the block's functions
(:func:`compressed`): the recording returns the compressed arrays, the backward takes
them, so both executors use it unchanged: the op-by-op runtime holds the compressed
arrays in ``abar`` buffers, and the compiled path's ``custom_vjp`` keeps them as its
residuals (:mod:`jax_exec.execute.lowering`). Their bytes are exact (traced), the
encoding and decoding are priced as memory-bound elementwise work in the backward.

The planner offers low-bit options only when the user allows a gradient error
(``plan(..., activation_tolerance=t)``, t > 0; with 0 no low-bit option exists). Each
storage is first tried alone: every block recorded with it (store-all), the gradient's
relative error ``||g - g_ref|| / ||g_ref||`` measured on the example batch against the
plain gradient (the compiled step with plain autodiff in every block); storages above
the tolerance are not offered. The chosen schedule's own error is measured again, and
a storage it uses is withdrawn while that error exceeds the tolerance
(:func:`within_tolerance`). ``schedule.meta["lowbit"]`` reports the storage of each
block, the measured error, the residual bytes compression saved, and each storage's
store-all error and residual bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_exec.execute.lowering import lower
from jax_exec.kernels import NodeFunctions
from jax_exec.kernels import Recipe as NodeRecipe
from jax_exec.program.flat import aval_bytes
from jax_exec.program.kernels import BlockFunctions, Recipe, SaveOption, block_functions
from jax_exec.program.model import BlockModel
from jax_exec.program.problem import build_problem
from schedir import B, F_all, Loss, Schedule
from schedir.blocks.schedule import BlockSchedule
from schedir.pipeline.schedule import STORAGES
from solvers.blocks.policies import policy_schedule

_LEVELS = {"float8_e4m3fn": 448.0, "int8": 127.0}  # the largest stored magnitude


@dataclass(frozen=True)
class LowBitOption(SaveOption):
    """A save option whose new residuals are stored in ``storage`` (module docstring).

    Attributes:
        storage: one of :data:`STORAGES`.
        base_label: the label of the full-precision option it compresses.
    """

    storage: str = "bfloat16"
    base_label: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.storage not in STORAGES:
            raise ValueError(f"storage = {self.storage!r}: expected one of {STORAGES}")

    @property
    def base(self) -> SaveOption:
        return SaveOption(self.kind, self.names, self.base_label)


def _stored_dtype(storage: str) -> Any:
    return {"bfloat16": jnp.bfloat16, "float8_e4m3fn": jnp.float8_e4m3fn, "int8": jnp.int8}[storage]


def _parts(spec: Any, storage: str) -> tuple[jax.ShapeDtypeStruct, ...]:
    stored = jax.ShapeDtypeStruct(spec.shape, _stored_dtype(storage))
    if storage == "bfloat16":
        return (stored,)
    return (stored, jax.ShapeDtypeStruct((), jnp.float32))


def compressible(spec: Any, storage: str) -> bool:
    """Whether a residual of ``spec`` is stored in ``storage``: a floating dtype wider
    than the storage, and fewer bytes once compressed (with the scale)."""
    if not jnp.issubdtype(spec.dtype, jnp.floating):  # integers, masks, RNG keys
        return False
    dtype = np.dtype(spec.dtype)
    if dtype.itemsize <= np.dtype(_stored_dtype(storage)).itemsize:
        return False
    return sum(aval_bytes(p) for p in _parts(spec, storage)) < aval_bytes(spec)


def encode(x: jax.Array, storage: str) -> tuple[jax.Array, ...]:
    """``x`` as stored: ``(q,)`` for bfloat16, ``(q, scale)`` for float8 and int8."""
    if storage == "bfloat16":
        return (x.astype(jnp.bfloat16),)
    amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
    scale = jnp.where(amax > 0, amax / _LEVELS[storage], jnp.float32(1.0))
    y = x.astype(jnp.float32) / scale
    if storage == "int8":
        return (jnp.clip(jnp.round(y), -127, 127).astype(jnp.int8), scale)
    return (y.astype(jnp.float8_e4m3fn), scale)


def decode(parts: tuple, dtype: Any, storage: str) -> jax.Array:
    """The residual back in ``dtype`` from :func:`encode`'s parts."""
    if storage == "bfloat16":
        return parts[0].astype(dtype)
    return (parts[0].astype(jnp.float32) * parts[1]).astype(dtype)


@dataclass(frozen=True)
class ResidualCodec:
    """Residuals of ``specs`` stored in ``storage`` (module docstring): ``which`` are
    compressed, ``stored`` the shapes kept (each compressed one as its parts)."""

    specs: tuple
    storage: str
    which: tuple[bool, ...]
    stored: tuple

    def pack(self, residuals: tuple) -> tuple:
        out = []
        for r, c in zip(residuals, self.which, strict=True):
            out.extend(encode(r, self.storage) if c else (r,))
        return tuple(out)

    def unpack(self, stored: tuple) -> tuple:
        it, width = iter(stored), len(_parts(jax.ShapeDtypeStruct((), jnp.float32), self.storage))
        return tuple(
            decode(tuple(next(it) for _ in range(width)), s.dtype, self.storage) if c else next(it)
            for s, c in zip(self.specs, self.which, strict=True)
        )

    @property
    def moved_bytes(self) -> int:
        """Bytes the encoder and decoder move (:meth:`LowBitModel.codec_seconds`): the
        encoder reads each compressed residual (twice with a scale: its maximum first)
        and writes it compressed; the decoder reads it compressed (its output fuses into
        the backward's consumers)."""
        reads = 1 if self.storage == "bfloat16" else 2
        return sum(reads * aval_bytes(s) + 2 * sum(aval_bytes(p) for p in _parts(s, self.storage))
                   for s, c in zip(self.specs, self.which, strict=True) if c)  # fmt: skip


def residual_codec(specs: tuple, storage: str) -> ResidualCodec:
    """The codec of residuals ``specs`` in ``storage``: the compressible ones
    (:func:`compressible`) replaced by their parts."""
    which = tuple(compressible(s, storage) for s in specs)
    stored = tuple(part for s, c in zip(specs, which, strict=True)
                   for part in (_parts(s, storage) if c else (s,)))  # fmt: skip
    return ResidualCodec(tuple(specs), storage, which, stored)


def compressed(fns: BlockFunctions, storage: str) -> BlockFunctions:
    """``fns`` with its new residuals stored in ``storage`` (module docstring)."""
    codec = residual_codec(fns.recipe.new, storage)

    def record(p: tuple, g: tuple, x: tuple) -> tuple:
        outs, results, residuals = fns.record(p, g, x)
        return outs, results, codec.pack(residuals)

    def backward(p, g, x, outs, results, stored, d_outs, d_through) -> tuple:
        residuals = codec.unpack(stored)
        return fns.backward(p, g, x, outs, results, residuals, d_outs, d_through)

    recipe = Recipe(fns.recipe.treedef, fns.recipe.sources, codec.stored, fns.recipe.consts)
    return BlockFunctions(fns.forward, record, backward, recipe, fns.layout, fns.recomputes)


def compressed_node(fns: NodeFunctions, storage: str) -> NodeFunctions:
    """A chain stage's kernels (:func:`jax_exec.kernels.node_functions`) with its new
    residuals stored in ``storage``: ``rec`` and ``res`` return them compressed,
    ``bwd`` decodes them first (a pipeline chunk's low-bit storage,
    :mod:`jax_exec.pipeline.chunks`)."""
    codec = residual_codec(fns.recipe.new, storage)

    def rec(params: Any, rest: Any, ins: tuple) -> tuple:
        out, new = fns.rec(params, rest, ins)
        return out, codec.pack(new)

    def res(params: Any, rest: Any, ins: tuple) -> tuple:
        return codec.pack(fns.res(params, rest, ins))

    def bwd(params: Any, rest: Any, ins: tuple, out: Any, stored: tuple, cots: tuple) -> tuple:
        return fns.bwd(params, rest, ins, out, codec.unpack(stored), cots)

    recipe = NodeRecipe(fns.recipe.treedef, fns.recipe.sources, codec.stored, fns.recipe.consts)
    return NodeFunctions(fns.fwd, jax.jit(rec), jax.jit(res), jax.jit(bwd), recipe, fns.out)


@dataclass
class LowBitModel(BlockModel):
    """A :class:`~jax_exec.program.model.BlockModel` whose blocks also have low-bit options.

    Attributes:
        tolerance: the gradient's relative error allowed (> 0).
        args: the example batch the error is measured on.
        reference: the plain gradient's leaves (float64), what errors are measured against.
        screen: per storage tried, ``(error, residual bytes)`` of the store-all
            schedule with every block stored in it (None: full precision); residual
            bytes are what the recordings keep beyond their outputs (exact).
    """

    tolerance: float = 0.0
    args: tuple = ()
    reference: list = field(default_factory=list)
    screen: dict = field(default_factory=dict)

    def option_functions(self, k: int, option: SaveOption) -> BlockFunctions:
        """Functions of block k under ``option`` (a low-bit one compresses its base's)."""
        block = self.blocks.blocks[k]
        key = (self.identity(k), option)
        if key not in self._functions:
            if isinstance(option, LowBitOption):
                base = self.option_functions(k, option.base)
                self._functions[key] = compressed(base, option.storage)
            else:
                self._functions[key] = block_functions(
                    self.program, block, self.layouts[k], option, self.specs(k)
                )
        return self._functions[key]

    def functions(self, k: int, o: int) -> BlockFunctions:
        return self.option_functions(k, self.option(k, o).on_device())

    def saved_bytes(self, k: int, o: int) -> tuple[int, bool]:
        option = self.option(k, o).on_device()
        if isinstance(option, LowBitOption):  # traced: compressed bytes are exact
            return self.option_functions(k, option).recipe.new_bytes, True
        return super().saved_bytes(k, o)

    def codec_seconds(self, k: int, option: SaveOption) -> float:
        """Roofline seconds of encoding and decoding ``option``'s residuals, memory
        bound (:attr:`ResidualCodec.moved_bytes`; the decoder's output fuses into the
        backward's consumers, as the cost model's cheap elementwise work does)."""
        if not isinstance(option, LowBitOption):
            return 0.0
        base = self.option_functions(k, option.base).recipe.new
        return residual_codec(base, option.storage).moved_bytes / self.cost_model.bytes_per_second


def residual_bytes(model: BlockModel, schedule: Schedule) -> int:
    """Bytes the schedule's block options keep beyond their outputs, summed over blocks
    (each block's recording counted once; exact for traced options)."""
    options = schedule.options
    return sum(model.saved_bytes(k, o)[0] for k, o in enumerate(options))


def storage_of(model: BlockModel, k: int, o: int) -> str | None:
    """The storage of block k's option o (None: full precision)."""
    option = model.option(k, o)
    return option.storage if isinstance(option, LowBitOption) else None


def _variants(model: LowBitModel, k: int, storages: tuple[str, ...]) -> tuple[SaveOption, ...]:
    base = tuple(o for o in model.options[k] if not isinstance(o, LowBitOption))
    out = list(base)
    for option in base:
        specs = model.option_functions(k, option).recipe.new
        for storage in storages:
            if any(compressible(s, storage) for s in specs):
                label = f"{option.label}+{storage}"
                out.append(LowBitOption(option.kind, option.names, label, storage, option.label))
    return tuple(out)


def _set_storages(model: LowBitModel, storages: tuple[str, ...]) -> None:
    """Give every block its full-precision options and the low-bit variants of
    ``storages`` (identical blocks share them), and rebuild the problem."""
    by_key: dict = {}
    options = []
    for k in range(model.length):
        key = model.identity(k)
        if key not in by_key:
            by_key[key] = _variants(model, k, storages)
        options.append(by_key[key])
    model.options = tuple(options)
    model.problem = build_problem(model)


def _store_all(model: LowBitModel, storage: str | None) -> Schedule:
    """Every block recorded once with the option the store-all reference uses
    (:func:`jax_exec.auto.reference.reference_schedule`), in ``storage`` where it has one."""
    in_scan = set()
    for scan in model.program.scans:
        lo, hi = scan.starts[0], scan.starts[-1]
        in_scan |= {b.index for b in model.blocks.blocks[:-1] if lo <= b.start < hi}
    chosen = []
    for k, options in enumerate(model.options):
        base = "everything_saveable" if k in in_scan else "xla_fused"
        names = [o.label for o in options]
        want = f"{base}+{storage}" if storage else base
        chosen.append(names.index(want) if want in names else names.index(base))
    L = model.length
    ops = [F_all(k) for k in range(L)] + [Loss()] + [B(k) for k in range(L - 1, -1, -1)]
    return BlockSchedule(tuple(ops), {}, tuple(chosen))


def _flat(tree: Any) -> list:
    return [np.asarray(x, dtype=np.float64).ravel() for x in jax.tree_util.tree_leaves(tree)]


def _gradient(model: BlockModel, schedule: Schedule, args: tuple) -> list:
    """The compiled schedule's parameter gradient at the traced parameters and state on
    ``args`` (float64 leaves)."""
    fn = lower(model, schedule)
    traced = model.traced

    def loss(params: Any, rest: Any, args: tuple) -> jax.Array:
        return fn(params, rest, args)[0]

    return _flat(jax.jit(jax.grad(loss))(traced.params, traced.rest, tuple(args)))


def reference_gradient(model: BlockModel, args: tuple) -> list:
    """The plain gradient: every block under plain autodiff in full precision
    (``everything_saveable``; equal to ``nnx.grad`` of the loss, docs/auto.md)."""
    return _gradient(model, policy_schedule(model.problem, "everything_saveable"), args)


def gradient_error(model: BlockModel, schedule: Schedule, args: tuple, reference: list) -> float:
    """``||g - g_ref|| / ||g_ref||`` of the compiled schedule's gradient (the example
    batch ``args``, the traced parameters and state) against ``reference``."""
    grad = _gradient(model, schedule, args)
    diff = sum(float(np.sum((g - r) ** 2)) for g, r in zip(grad, reference, strict=True))
    norm = sum(float(np.sum(r**2)) for r in reference)
    return math.sqrt(diff / norm) if norm > 0 else math.sqrt(diff)


def measured_error(model: LowBitModel, schedule: Schedule) -> float:
    """:func:`gradient_error` of ``schedule`` on the model's example batch, once per
    schedule (ops and options)."""
    options = schedule.options
    chosen = tuple(model.option(k, o) for k, o in enumerate(options))
    key = ("lowbit error", tuple(str(op) for op in schedule.ops), chosen)
    return model.cached(key, lambda: gradient_error(model, schedule, model.args, model.reference))


def offered_storages(tolerance: Any, storages: Any = None) -> tuple[str, ...]:
    """The storages ``activation_tolerance`` and ``activation_storages`` offer (none
    without a tolerance; default :data:`STORAGES`), or a ValueError naming the field."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not tolerance >= 0:
        raise ValueError(f"activation_tolerance = {tolerance!r}: expected a number >= 0")
    if storages is None:
        return STORAGES if tolerance else ()
    if not tolerance:
        raise ValueError("activation_storages: low-bit storage needs activation_tolerance > 0")
    if isinstance(storages, str) or not hasattr(storages, "__iter__"):
        raise ValueError(f"activation_storages = {storages!r}: expected a tuple of {STORAGES}")
    storages = tuple(storages)
    bad = [s for s in storages if s not in STORAGES]
    if bad:
        raise ValueError(f"activation_storages: {bad[0]!r} unknown; expected some of {STORAGES}")
    return storages


def with_lowbit(
    model: BlockModel, args: tuple, tolerance: float, storages: tuple[str, ...] | None = None
) -> LowBitModel:
    """``model`` with the low-bit options of the ``storages`` (default
    :data:`STORAGES`) whose store-all gradient error is within ``tolerance`` (module
    docstring)."""
    storages = offered_storages(tolerance, storages)
    values = {f.name: getattr(model, f.name) for f in fields(BlockModel)}
    lbm = LowBitModel(**values, tolerance=float(tolerance), args=tuple(args))
    reference = reference_gradient(lbm, args)
    lbm.reference = reference
    _set_storages(lbm, tuple(storages))
    kept = []
    for storage in storages:
        schedule = _store_all(lbm, storage)
        error = measured_error(lbm, schedule)
        lbm.screen[storage] = (error, residual_bytes(lbm, schedule))
        if error <= tolerance:
            kept.append(storage)
    lbm.screen[None] = (0.0, residual_bytes(lbm, _store_all(lbm, None)))
    _set_storages(lbm, tuple(kept))
    return lbm


def full_precision(model: LowBitModel) -> LowBitModel:
    """A copy of ``model`` whose blocks have their full-precision options alone, with
    its own known kernels and analyses: the plan without low bits that a low-bit
    answer competes with (:func:`jax_exec.auto.exact.solve`)."""
    copy = replace(model, known=set(), _cache={}, ahead=None)
    _set_storages(copy, ())
    return copy


def tolerated(
    solve: Callable[[], Any],
    used: Callable[[Any], set],
    error: Callable[[Any], float],
    tolerance: float,
    withdraw: Callable[[str], None],
) -> tuple[Any, float]:
    """``(answer, its gradient error)``: ``solve()`` until the ``error`` of its answer
    is within ``tolerance``, ``withdraw``-ing the least precise storage the answer
    ``used`` each time it is not (an answer using none has error 0, not measured)."""
    while True:
        got = solve()
        storages = used(got)
        err = error(got) if storages else 0.0
        if err <= tolerance or not storages:
            return got, err
        withdraw(max(storages, key=STORAGES.index))


def within_tolerance(model: LowBitModel, solve: Callable[[], Any]) -> Any:
    """``solve()`` until the schedule's measured gradient error is within the model's
    tolerance, withdrawing the least precise storage the schedule uses each time it is
    not (:func:`tolerated`); the report in ``schedule.meta["lowbit"]``. The schedule is
    of the solve's model (``solved.model``: ``model``, or a copy with more options)."""

    def used(solved: Any) -> set:
        options = solved.schedule.options
        return {storage_of(solved.model, k, o) for k, o in enumerate(options)} - {None}

    def withdraw(storage: str) -> None:
        kept = {storage_of(model, k, o) for k in range(model.length)
                for o in range(len(model.options[k]))} - {None, storage}  # fmt: skip
        _set_storages(model, tuple(s for s in STORAGES if s in kept))

    def error(solved: Any) -> float:
        return measured_error(solved.model, solved.schedule)

    solved, err = tolerated(solve, used, error, model.tolerance, withdraw)
    solved.schedule.meta["lowbit"] = lowbit_report(solved.model, solved.schedule.options, err)
    return solved


def lowbit_report(model: LowBitModel, options: list, error: float) -> dict:
    """``storage`` per block (None: full precision), the measured ``gradient_error``,
    ``saved_bytes`` (residual bytes the chosen storages save, summed over blocks) and
    ``screen`` (storage -> (store-all gradient error, store-all residual bytes); None:
    full precision)."""
    storage, saved = [], 0
    for k, o in enumerate(options):
        option = model.option(k, o).on_device()
        storage.append(option.storage if isinstance(option, LowBitOption) else None)
        if isinstance(option, LowBitOption):
            full = model.option_functions(k, option.base).recipe.new_bytes
            saved += full - model.option_functions(k, option).recipe.new_bytes
    return {"storage": storage, "gradient_error": error, "saved_bytes": saved,
            "tolerance": model.tolerance, "screen": dict(model.screen)}  # fmt: skip

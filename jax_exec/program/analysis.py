"""What each equation of a traced program costs and what its backward reads (docs/auto.md).

- **Categories** of primitives: :mod:`jax_exec.program.primitives` (elementwise and
  layout ones are fused, heavy ones materialized, opaque ones one heavy node).
- **Materialized values** (the candidates a save set may hold): results of heavy
  equations, and operands of matmuls and convolutions (XLA stores them to call the
  kernel).
- **Residuals.** What the backward of an equation reads is JAX's own answer: the
  leaves of the ``jax.vjp`` closure of the equation alone, classified by identity as
  one of its inputs, one of its outputs, or a new value (computed inside the JVP rule,
  e.g. ``cos x`` for ``sin x``). Under a names policy new values are never saved:
  they are recomputed from the equation's inputs.
- **Costs** (seconds) come from a roofline model, ``max(flops / flops_per_second,
  bytes / bytes_per_second)``; cheap equations move no bytes (they are fused). The
  backward cost of an equation is the cost of its traced vjp minus its forward.
- **Active values** depend on a parameter through differentiable operations: only
  they get cotangents.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, primal_dtype_to_tangent_dtype

from jax_exec.program.flat import Eqn, Lit, Program, aval_bytes, sub_jaxprs
from jax_exec.program.flatten import INLINED, UnsupportedModel
from jax_exec.program.primitives import (
    ELEMENTWISE,
    LAYOUT,
    MATERIALIZE_OPERANDS,
    OPAQUE,
    category,
)


@dataclass(frozen=True)
class CostModel:
    """Roofline costs: ``max(flops / flops_per_second, bytes / bytes_per_second)``.

    The defaults describe a data-center GPU in float32 (100 TFLOP/s, 1.5 TB/s). They
    set the relative cost of recomputing a matmul and an elementwise chain; memory
    figures never depend on them.
    """

    flops_per_second: float = 1.0e14
    bytes_per_second: float = 1.5e12

    def __post_init__(self) -> None:
        for name in ("flops_per_second", "bytes_per_second"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and np.isfinite(value)):
                raise ValueError(f"CostModel.{name} = {value!r}: expected a positive rate")

    def seconds(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops_per_second, nbytes / self.bytes_per_second)


def _size(aval: Any) -> int:
    return int(np.prod(aval.shape, dtype=np.int64))


def _in_avals(program: Program, eqn: Eqn) -> list:
    out = []
    for r in eqn.ins:
        if isinstance(r, Lit):
            arr = np.asarray(r.value)
            out.append(jax.ShapeDtypeStruct(arr.shape, arr.dtype))
        else:
            out.append(program.avals[r])
    return out


def _jaxpr_cost(jaxpr: Jaxpr, model: CostModel) -> tuple[float, float, float]:
    """(seconds, flops, bytes) of a jaxpr's equations, sub-jaxprs included."""
    total = flops = nbytes = 0.0
    for e in jaxpr.eqns:
        ins = [v.aval for v in e.invars]
        outs = [v.aval for v in e.outvars]
        s, f, b = _primitive_cost(e.primitive.name, e.params, ins, outs, model)
        total, flops, nbytes = total + s, flops + f, nbytes + b
    return total, flops, nbytes


def _sub_jaxprs(params: dict) -> list[Jaxpr]:
    """The open jaxprs of an equation's parameters (:func:`sub_jaxprs`)."""
    return [getattr(item, "jaxpr", item) for item in sub_jaxprs(params)]


def _primitive_cost(
    name: str, params: dict, ins: Sequence, outs: Sequence, model: CostModel
) -> tuple[float, float, float]:
    in_bytes = sum(aval_bytes(a) for a in ins if hasattr(a, "shape"))
    out_bytes = sum(aval_bytes(a) for a in outs if hasattr(a, "shape"))
    out_elems = sum(_size(a) for a in outs if hasattr(a, "shape"))
    if name == "dot_general":
        (lc, _), _ = params["dimension_numbers"]
        contracted = int(np.prod([ins[0].shape[d] for d in lc], dtype=np.int64))
        flops = 2.0 * out_elems * contracted
        nbytes = in_bytes + out_bytes
    elif name == "conv_general_dilated":
        rhs = ins[1].shape
        dn = params["dimension_numbers"]
        out_feature = rhs[dn.rhs_spec[0]] if dn is not None else rhs[0]
        per_out = int(np.prod(rhs, dtype=np.int64)) // max(int(out_feature), 1)
        flops = 2.0 * out_elems * per_out
        nbytes = in_bytes + out_bytes
    elif name in ("scan", "while"):
        body = _sub_jaxprs(params)
        length = params.get("length", 1)
        inner = [_jaxpr_cost(j, model) for j in body]
        s = sum(x[0] for x in inner) * length
        return s, sum(x[1] for x in inner) * length, sum(x[2] for x in inner) * length
    elif name == "cond":
        branches = [_jaxpr_cost(j, model) for j in _sub_jaxprs(params)]
        return max(branches, default=(0.0, 0.0, 0.0))
    elif name in OPAQUE or name in INLINED:  # a nested call costs what it holds
        inner = [_jaxpr_cost(j, model) for j in _sub_jaxprs(params)]
        return tuple(sum(x[i] for x in inner) for i in range(3))  # type: ignore[return-value]
    elif name in ELEMENTWISE or name in LAYOUT:
        flops, nbytes = float(out_elems), 0.0
    elif name == "dynamic_update_slice":  # in place: a layout op over the update (like
        flops, nbytes = float(_size(ins[1])), 0.0  # pad, the transpose of a static slice)
    else:  # heavy: reads its inputs, writes its outputs
        flops = float(max(sum(_size(a) for a in ins if hasattr(a, "shape")), out_elems))
        nbytes = in_bytes + out_bytes
    return model.seconds(flops, nbytes), flops, nbytes


@dataclass(frozen=True)
class EqnInfo:
    """What one equation costs and what its backward reads.

    Attributes:
        category: see :func:`category`.
        diff: per input, whether it is differentiated (an active value).
        needs_in: input positions whose values the backward reads.
        needs_out: output positions whose values the backward reads.
        new_bytes: bytes of the other residuals (recomputed from the inputs under a
            names policy; saved by plain autodiff).
        fwd_cost, bwd_cost: seconds (roofline).
        flops: of the forward.
        key: a hashable signature: equal keys mean the same computation and the same
            derivative at the same shapes (identical blocks are found with it).
    """

    category: str
    diff: tuple[bool, ...]
    needs_in: tuple[int, ...]
    needs_out: tuple[int, ...]
    new_bytes: int
    fwd_cost: float
    bwd_cost: float
    flops: float
    key: Any

    @property
    def has_backward(self) -> bool:
        return any(self.diff)

    @property
    def heavy(self) -> bool:
        return self.category in ("heavy", "opaque")


def _canonical(value: Any) -> Any:
    """A hashable stand-in for an equation parameter, or None when there is none."""
    if isinstance(value, ClosedJaxpr | Jaxpr):
        return None
    if isinstance(value, tuple | list):
        items = tuple(_canonical(v) for v in value)
        return (
            None
            if any(i is None and v is not None for i, v in zip(items, value, strict=True))
            else items
        )
    if callable(value) and not isinstance(value, type):
        return None
    try:
        hash(value)
    except TypeError:
        return None
    return value


def _inexact(program: Program, vid: int) -> bool:
    """Whether value ``vid`` is floating point or complex (what can carry a gradient)."""
    return bool(jax.numpy.issubdtype(program.avals[vid].dtype, jax.numpy.inexact))


def active_values(program: Program) -> set[int]:
    """Value ids that depend on a floating-point parameter through differentiable ops
    and that the loss depends on through differentiable ops (:func:`_useful`: a value
    only a ``stop_gradient``, the aux outputs or the new state read gets no cotangent:
    plain autodiff does not differentiate it either), and the initial carries of
    unrolled scans whose later carries in the same position are active
    (:func:`_scan_carries`)."""
    useful = _useful(program)
    active = set(program.param_like)
    while True:
        for eqn in program.eqns:
            if eqn.name == "stop_gradient":
                continue
            if any(not isinstance(r, Lit) and r in active for r in eqn.ins):
                for vid in eqn.outs:
                    if _inexact(program, vid):
                        active.add(vid)
        carries = _scan_carries(program, active)
        if carries <= active:
            return {v for v in active if v in useful}
        active |= carries


def _useful(program: Program) -> set[int]:
    """Value ids the loss depends on through differentiable ops (inexact values, no
    ``stop_gradient`` on the way): those a cotangent can reach. An unrolled scan's
    carries in one position are useful together where one of them is (its final carry
    unread, say), so that its iterations stay alike for the compiled path's loops; a
    stacked global is where one of its slices is."""
    useful = {program.loss}
    positions = [
        [
            [c[j] for c in scan.carries if not isinstance(c[j], Lit)]
            for j in range(len(scan.carries[0]))
        ]
        for scan in program.scans
    ]
    while True:
        before = len(useful)
        for eqn in reversed(program.eqns):
            if eqn.name == "stop_gradient" or not any(v in useful for v in eqn.outs):
                continue
            useful.update(
                r for r in eqn.ins
                if not isinstance(r, Lit)
                and _inexact(program, r)
            )  # fmt: skip
        for scan in positions:
            for values in scan:
                if any(v in useful for v in values):
                    useful.update(values)
        useful.update(src for vid, (src, _) in program.derived.items() if vid in useful)
        if len(useful) == before:
            return useful


def _scan_carries(program: Program, active: set[int]) -> set[int]:
    """The initial carries (values, inexact) of unrolled scans in a position where a
    later iteration's carry is active. Differentiated like the later ones (a zero
    cotangent for a constant initial state), the first iteration is the same block as
    the others, so the compiled path's loop starts at it (jax_exec.execute.loops)."""
    found = set()
    for scan in program.scans:
        for j, first in enumerate(scan.carries[0]):
            if (
                not isinstance(first, Lit)
                and first not in active
                and _inexact(program, first)
                and any(c[j] in active for c in scan.carries[1:] if not isinstance(c[j], Lit))
            ):
                found.add(first)
    return found


_CACHE: dict[Any, EqnInfo] = {}


def analyze(program: Program, eqn: Eqn, active: set[int], model: CostModel) -> EqnInfo:
    """The :class:`EqnInfo` of ``eqn`` (cached by primitive, parameters, shapes and which
    inputs are differentiated)."""
    cat = category(eqn)
    in_avals = _in_avals(program, eqn)
    out_avals = [program.avals[v] for v in eqn.outs]
    needed = any(v in active for v in eqn.outs)  # else no cotangent reaches it
    diff = tuple(
        needed and (not isinstance(r, Lit)) and r in active and _inexact(program, r)
        for r in eqn.ins
    )
    lits = tuple(
        (i, np.asarray(r.value).tobytes(), str(np.asarray(r.value).dtype))
        for i, r in enumerate(eqn.ins)
        if isinstance(r, Lit)
    )
    shapes = tuple((tuple(a.shape), str(a.dtype)) for a in in_avals + out_avals)
    params = tuple(sorted((k, _canonical(v)) for k, v in eqn.params.items()))
    simple = all(v is not None or eqn.params[k] is None for k, v in params)
    key = (eqn.name, params, shapes, lits, diff, model) if simple else None
    if key is not None and key in _CACHE:
        return _CACHE[key]
    info = _trace_vjp(eqn, cat, in_avals, out_avals, diff, model)
    if key is None:  # parameters hold jaxprs or functions: the traced vjp is the identity
        info = EqnInfo(**{**info.__dict__, "key": ("traced", info.key, shapes, lits, diff)})
    else:
        info = EqnInfo(**{**info.__dict__, "key": key})
        _CACHE[key] = info
    return info


def _trace_vjp(eqn: Eqn, cat: str, in_avals, out_avals, diff, model) -> EqnInfo:
    fwd_cost, flops, _ = _primitive_cost(eqn.name, eqn.params, in_avals, out_avals, model)
    lit_vals = {i: r.value for i, r in enumerate(eqn.ins) if isinstance(r, Lit)}
    arg_pos = [i for i, r in enumerate(eqn.ins) if not isinstance(r, Lit)]
    diff_pos = [i for i in arg_pos if diff[i]]
    found: dict[str, Any] = {}

    def run(args: list, cts: list) -> Any:
        vals = dict(lit_vals)
        vals.update(zip(arg_pos, args, strict=True))

        def f(*d: Any) -> list:
            v = dict(vals)
            v.update(zip(diff_pos, d, strict=True))
            return eqn.bind(*(v[i] for i in range(len(eqn.ins))))

        if not diff_pos:
            found["needs"] = ((), (), 0)
            return f()
        primals = [vals[i] for i in diff_pos]
        outs, vjp_fn = jax.vjp(f, *primals)
        needs_in, needs_out, new = set(), set(), 0
        seen: set[int] = set()
        for leaf in jax.tree_util.tree_leaves(vjp_fn):
            if not isinstance(leaf, jax.core.Tracer) or id(leaf) in seen:
                continue  # constants are not buffers
            seen.add(id(leaf))
            j = next((i for i in arg_pos if vals[i] is leaf), None)
            if j is not None:
                needs_in.add(j)
                continue
            o = next((k for k, out in enumerate(outs) if out is leaf), None)
            if o is not None:
                needs_out.add(o)
                continue
            new += aval_bytes(leaf.aval)
        found["needs"] = (tuple(sorted(needs_in)), tuple(sorted(needs_out)), new)
        full = []
        it = iter(cts)
        for out in outs:
            t = primal_dtype_to_tangent_dtype(out.dtype)
            full.append(np.zeros(out.shape, t) if t == jax.dtypes.float0 else next(it))
        return outs, vjp_fn(full)

    args = [in_avals[i] for i in arg_pos]
    cts = [
        jax.ShapeDtypeStruct(a.shape, a.dtype)
        for a in out_avals
        if primal_dtype_to_tangent_dtype(a.dtype) != jax.dtypes.float0
    ]
    try:
        closed = jax.make_jaxpr(run)(args, cts)
    except Exception as err:  # JAX cannot differentiate it: say which operation
        raise UnsupportedModel(
            f"operation {eqn.name} at {eqn.source}: JAX cannot differentiate it "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        ) from err
    total, _, _ = _jaxpr_cost(closed.jaxpr, model)
    needs_in, needs_out, new = found["needs"]
    bwd_cost = max(total - fwd_cost, 0.0) if diff_pos else 0.0
    return EqnInfo(
        category=cat,
        diff=diff,
        needs_in=needs_in,
        needs_out=needs_out,
        new_bytes=new,
        fwd_cost=fwd_cost,
        bwd_cost=bwd_cost,
        flops=flops,
        key=str(closed),
    )


@dataclass(frozen=True)
class Analysis:
    """Per-equation information for a whole program.

    Attributes:
        infos: one :class:`EqnInfo` per equation.
        active: active value ids.
        materialized: value ids XLA stores (candidates for saving).
        users: value id -> indices of the equations that read it.
        model: the cost model used.
    """

    infos: tuple[EqnInfo, ...]
    active: frozenset[int]
    materialized: frozenset[int]
    users: dict
    model: CostModel


def analyze_program(program: Program, model: CostModel | None = None) -> Analysis:
    """Analyze every equation of ``program`` (see the module docstring)."""
    model = model or CostModel()
    active = active_values(program)
    infos = tuple(analyze(program, eqn, active, model) for eqn in program.eqns)
    users: dict[int, list[int]] = {}
    for i, eqn in enumerate(program.eqns):
        for r in eqn.ins:
            if not isinstance(r, Lit):
                users.setdefault(r, []).append(i)
    materialized = set()
    for eqn, info in zip(program.eqns, infos, strict=True):
        if info.heavy:
            materialized.update(eqn.outs)
        if eqn.name in MATERIALIZE_OPERANDS:
            materialized.update(r for r in eqn.ins if not isinstance(r, Lit))
        materialized.update(channel_reduced(program, eqn, info))
    materialized -= set(program.input_ids)
    return Analysis(infos, frozenset(active), frozenset(materialized), users, model)


def _leading_broadcast(program: Program, ref: Any, shape: tuple) -> bool:
    """Whether ``ref`` reaches ``shape`` by broadcasting along leading axes only, from
    more than one element (a per-channel vector of an NHWC map, say): its size-1 or
    missing axes are expanded, the last axis is not."""
    if isinstance(ref, Lit):
        return False
    eqn = program.eqns[program.producer[ref]] if ref in program.producer else None
    if eqn is not None and eqn.name == "broadcast_in_dim" and not isinstance(eqn.ins[0], Lit):
        src, dims = program.avals[eqn.ins[0]].shape, eqn.params["broadcast_dimensions"]
        full = [1] * len(shape)
        for d, n in zip(dims, src, strict=True):
            full[d] = n
    else:
        full = list(program.avals[ref].shape)
    if len(full) != len(shape) or not shape or int(np.prod(full)) <= 1:
        return False
    grown = [i for i, (a, b) in enumerate(zip(full, shape, strict=True)) if a == 1 and b > 1]
    return bool(grown) and shape[-1] == full[-1] and (len(shape) - 1) not in grown


def channel_reduced(program: Program, eqn: Eqn, info: EqnInfo) -> list[int]:
    """Values of ``eqn`` that XLA materializes because its backward reduces them over
    leading axes: an elementwise equation between a full-shape value and a
    differentiated value broadcast along leading axes (BatchNorm's centered input times
    its per-channel scale: the scale's cotangent sums the product over batch and
    space), whose backward reads the full-shape value. XLA's plain step keeps that
    value for the reduction rather than fusing its producer into it (measured on the
    example ResNet: one activation per BatchNorm); layer norms, which broadcast along
    the last axis, are left to fusion."""
    if info.category != "elementwise" or not info.has_backward or len(eqn.ins) < 2:
        return []
    shape = tuple(program.avals[eqn.outs[0]].shape)
    found = []
    for j in info.needs_in:
        ref = eqn.ins[j]
        if isinstance(ref, Lit) or tuple(program.avals[ref].shape) != shape:
            continue
        if ref not in program.producer or info.category != "elementwise":
            continue
        others = [i for i in range(len(eqn.ins)) if i != j and info.diff[i]]
        if any(_leading_broadcast(program, eqn.ins[i], shape) for i in others):
            found.append(ref)
    return found

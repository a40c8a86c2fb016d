"""A closed jaxpr as flat equations (:mod:`jax_exec.program.flat`): :class:`Builder`
inlines every nested ``jit`` (and the model's own ``jax.checkpoint`` regions) so that
cuts and options can fall inside them, unrolls a ``scan`` into its iterations (its
stacked global inputs become per-iteration slices, ``Program.derived``), writes threefry
``random_bits`` as XLA computes them, and refuses equations with side effects, naming
the primitive and the user code it came from (debug callbacks are left out with a
warning). :func:`flatten` keeps scans whole (a block's backward, its phases).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.extend.random as jax_random
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from jax_exec.program.flat import Eqn, FlatJaxpr, Lit, Ref, ScanInfo

INLINED = ("jit", "pjit", "closed_call", "core_call")
# A model's own rematerialization (``nnx.remat``, ``jax.checkpoint``) is planned from its
# inside: its equations become the program's and the plan decides what is saved (the
# user's policy is not kept; the values are the same).
CHECKPOINTS = ("checkpoint", "remat", "remat2")


class UnsupportedModel(TypeError):
    """The planner cannot handle an operation or a piece of the model; the message
    names it and where it came from."""


def source_of(eqn: Any, fallback: str = "") -> str:
    """``file:line (function)`` of the user code that made ``eqn``, and its name stack
    (``fallback``, the enclosing ``jit``'s source, when the traceback has no user frame)."""
    where = ""
    tb = getattr(eqn.source_info, "traceback", None)
    frames = getattr(tb, "frames", None) or ()
    for frame in frames:
        path = frame.file_name.replace("\\", "/")
        if "/jax/" in path or "/flax/" in path or "/jax_exec/auto/" in path:
            continue
        where = f"{frame.file_name}:{frame.line_num} ({frame.function_name})"
        break
    if not where:
        return fallback or "unknown source"
    stack = str(getattr(eqn.source_info, "name_stack", "") or "")
    return f"{where} [{stack}]" if stack else where


class Builder:
    def __init__(self) -> None:
        self.avals: list = []
        self.eqns: list[Eqn] = []
        self.consts: dict[int, Any] = {}
        self.globals: set[int] = set()
        self.derived: dict[int, tuple[int, int]] = {}
        self.scans: list[ScanInfo] = []
        self.unroll = True
        self.inlined = INLINED + CHECKPOINTS

    def slice_of(self, ref: Ref, i: int, where: str, index: int | None = None) -> Ref:
        """``ref[i]``: a global slice (no equation) for stacked globals, else traced: a
        ``dynamic_slice`` at ``index[i]``, a slice of the scan's global iteration index
        (so that every iteration's equations are the same and the compiled path can run
        them as a loop, :mod:`jax_exec.execute.loops`)."""
        if isinstance(ref, Lit):
            return Lit(np.asarray(ref.value)[i])
        aval = self.avals[ref]
        if ref in self.globals:
            for vid, (src, j) in self.derived.items():
                if src == ref and j == i:
                    return vid
            vid = self.new(jax.ShapeDtypeStruct(tuple(aval.shape[1:]), aval.dtype))
            self.derived[vid] = (ref, i)
            self.globals.add(vid)
            return vid
        if index is None:
            closed = jax.make_jaxpr(lambda x: x[i])(aval)
            return self.inline(closed.jaxpr, closed.consts, [ref], where)[0]
        at = self.slice_of(index, i, where)
        closed = jax.make_jaxpr(lambda x, t: jax.lax.dynamic_index_in_dim(x, t, 0, keepdims=False))(
            aval, self.avals[at]
        )
        return self.inline(closed.jaxpr, closed.consts, [ref, at], where)[0]

    def iteration_index(self, length: int) -> int:
        """A global constant ``arange(length)``: a scan's iteration indices."""
        vid = self.new(jax.ShapeDtypeStruct((length,), np.int32))
        self.consts[vid] = np.arange(length, dtype=np.int32)
        self.globals.add(vid)
        return vid

    def unsliced(self, parts: list[Ref]) -> int | None:
        """The stacked global whose slices 0, 1, ... are ``parts``, if they are."""
        found = [self.derived.get(r) if not isinstance(r, Lit) else None for r in parts]
        if not found or any(f is None for f in found):
            return None
        src = found[0][0]
        if [f for f in found] != [(src, i) for i in range(len(parts))]:
            return None
        return src if self.avals[src].shape[0] == len(parts) else None

    def unroll_scan(self, eqn: Any, ins: list[Ref], where: str) -> list[Ref]:
        """A ``scan`` as its iterations one after another (each one the body's
        equations); the stacked inputs are sliced, the stacked outputs stacked."""
        p = eqn.params
        if p.get("_split_transpose"):  # pragma: no cover - an internal AD variant
            raise UnsupportedModel(f"scan at {where}: a split-transpose scan is not supported")
        n_consts, n_carry, length = p["num_consts"], p["num_carry"], p["length"]
        body = p["jaxpr"]
        consts, carry, xs = (
            ins[:n_consts],
            ins[n_consts : n_consts + n_carry],
            ins[n_consts + n_carry :],
        )
        order = range(length - 1, -1, -1) if p["reverse"] else range(length)
        traced = [r for r in xs if not isinstance(r, Lit) and r not in self.globals]
        index = self.iteration_index(length) if traced else None
        ys: list[list[Ref]] = []
        starts, carries = [], []
        for i in order:
            starts.append(len(self.eqns))
            carries.append(tuple(carry))
            xs_i = [self.slice_of(r, i, where, index) for r in xs]
            outs = self.inline(body.jaxpr, body.consts, [*consts, *carry, *xs_i], where)
            carry = outs[:n_carry]
            ys.append(outs[n_carry:])
        starts.append(len(self.eqns))
        carries.append(tuple(carry))
        self.scans.append(
            ScanInfo(tuple(starts), tuple(carries), tuple(tuple(y) for y in ys), bool(p["reverse"]))
        )
        if p["reverse"]:
            ys.reverse()
        stacked = []
        for j, var in enumerate(eqn.outvars[n_carry:]):
            parts = [y[j] for y in ys]
            whole = self.unsliced(parts)
            if whole is not None:  # the slices of a stacked global, back in order (nnx.scan
                stacked.append(whole)  # returns the stack's parameters): that global
                continue
            avals = [
                self.avals[r]
                if not isinstance(r, Lit)
                else var.aval.update(shape=var.aval.shape[1:])
                for r in parts
            ]
            # concatenate of expanded slices, not jnp.stack: JAX >= 0.10 binds a
            # `stack` primitive the analysis does not know
            closed = jax.make_jaxpr(
                lambda *a: jax.lax.concatenate([jax.lax.expand_dims(x, (0,)) for x in a], 0)
            )(*avals)
            stacked.append(self.inline(closed.jaxpr, closed.consts, parts, where)[0])
        return [*carry, *stacked]

    def new(self, aval: Any) -> int:
        self.avals.append(jax.ShapeDtypeStruct(tuple(aval.shape), aval.dtype))
        return len(self.avals) - 1

    def inline(
        self, jaxpr: Jaxpr, consts: Sequence, args: Sequence[Ref], where: str = ""
    ) -> list[Ref]:
        env: dict = {}
        for var, value in zip(jaxpr.constvars, consts, strict=True):
            vid = self.new(var.aval)
            self.consts[vid] = value
            self.globals.add(vid)
            env[var] = vid
        for var, ref in zip(jaxpr.invars, args, strict=True):
            env[var] = ref

        def read(atom: Any) -> Ref:
            return Lit(atom.val) if isinstance(atom, Literal) else env[atom]

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            if eqn.primitive.name in self.inlined and closed_jaxpr(eqn) is not None:
                inner = closed_jaxpr(eqn)
                if eqn.primitive.name in CHECKPOINTS:
                    _warn_offload(eqn, inner.jaxpr, source_of(eqn, where))
                outs = self.inline(inner.jaxpr, inner.consts, ins, source_of(eqn, where))
                for var, ref in zip(eqn.outvars, outs, strict=True):
                    env[var] = ref
                continue
            if eqn.primitive.name == "scan" and self.unroll:
                outs = self.unroll_scan(eqn, ins, source_of(eqn, where))
                for var, ref in zip(eqn.outvars, outs, strict=True):
                    env[var] = ref
                continue
            expanded = _expand(eqn, self.avals, ins)
            if expanded is not None:  # random bits: as XLA computes them (see _expand)
                outs = self.inline(expanded.jaxpr, expanded.consts, ins, source_of(eqn, where))
                for var, ref in zip(eqn.outvars, outs, strict=True):
                    env[var] = ref
                continue
            if eqn.effects and _debug_only(eqn):  # jax.debug.print / callback / breakpoint
                _warn_debug(eqn, source_of(eqn, where))
                continue
            if eqn.effects:
                raise UnsupportedModel(
                    f"operation {eqn.primitive.name} at {source_of(eqn, where)} has side effects "
                    f"({', '.join(map(str, eqn.effects))}): a schedule may run it twice "
                    f"(recomputation), so the planner refuses it; remove it from loss_fn"
                )
            outs = tuple(self.new(v.aval) for v in eqn.outvars)
            for var, vid in zip(eqn.outvars, outs, strict=True):
                env[var] = vid
            self.eqns.append(
                Eqn(
                    eqn.primitive,
                    dict(eqn.params),
                    tuple(ins),
                    outs,
                    source_of(eqn, where),
                    eqn.ctx,
                )
            )
        return [read(v) for v in jaxpr.outvars]


@functools.cache
def _threefry_dtype() -> Any:
    """The dtype of a threefry key; computed on first use, since creating a key at
    import time would start JAX's backend (``jax.distributed.initialize`` must come
    before that)."""
    return jax.eval_shape(lambda: jax.random.key(0, impl="threefry2x32")).dtype


def _expand(eqn: Any, avals: list, ins: list) -> ClosedJaxpr | None:
    """``random_bits`` of a threefry key as JAX's own implementation of it
    (``threefry_prng_impl.random_bits``: ``threefry2x32`` of a counter, then the
    ``xor`` of its two outputs), so that the program holds what XLA holds: XLA keeps
    the generator's two outputs and fuses the ``xor`` into its readers. Same bits (the
    same function lowers the primitive). Other equations: None."""
    if eqn.primitive.name != "random_bits" or isinstance(ins[0], Lit):
        return None
    key = avals[ins[0]]
    if key.dtype != _threefry_dtype() or key.shape != ():
        return None
    width, shape = eqn.params["bit_width"], tuple(eqn.params["shape"])

    def bits(k: Any) -> Any:
        return jax_random.threefry_prng_impl.random_bits(jax.random.key_data(k), width, shape)

    return jax.make_jaxpr(bits)(jax.ShapeDtypeStruct((), key.dtype))


def closed_jaxpr(eqn: Any) -> ClosedJaxpr | None:
    for key in ("jaxpr", "call_jaxpr"):
        inner = eqn.params.get(key)
        if isinstance(inner, ClosedJaxpr):
            return inner
        if isinstance(inner, Jaxpr):
            return ClosedJaxpr(inner, ())
    return None


def _debug_only(eqn: Any) -> bool:
    """Whether ``eqn`` is a debug callback (``jax.debug.print``, ``jax.debug.callback``,
    ``jax.debug.breakpoint``): no results, debug effects only."""
    names = {type(effect).__name__ for effect in eqn.effects}
    return not eqn.outvars and names <= {"DebugEffect", "OrderedDebugEffect"}


_DEBUG_WARNED: set[str] = set()


def _warn_debug(eqn: Any, source: str) -> None:
    """Warn, once per place, that a debug callback is left out of the planned step."""
    if source in _DEBUG_WARNED:
        return
    _DEBUG_WARNED.add(source)
    warnings.warn(
        f"{eqn.primitive.name} at {source} is left out of the planned step: a schedule "
        f"runs blocks out of program order and recomputes them, so it would print or call "
        f"back out of order and more than once; the values are unchanged (call "
        f"nnx.value_and_grad to see it)",
        stacklevel=4,
    )


_OFFLOAD_WARNED: set[str] = set()


def _warn_offload(eqn: Any, jaxpr: Jaxpr, source: str) -> None:
    """Warn, once per place, that a model's checkpoint whose policy offloads values to
    another memory (``offload_dot_with_no_batch_dims``,
    ``save_and_offload_only_these_names``...) is planned from its inside without it: the
    plan decides what is saved, on the device, unless a host link is given."""
    policy = eqn.params.get("policy")
    if policy is None or source in _OFFLOAD_WARNED:
        return
    for inner in jaxpr.eqns:
        try:
            case = policy(inner.primitive, *[v.aval for v in inner.invars], **inner.params)
        except Exception:  # a policy that cannot judge this equation: not an offload
            continue
        if type(case).__name__ == "Offloadable":  # JAX's partial_eval.Offloadable
            _OFFLOAD_WARNED.add(source)
            warnings.warn(
                f"the model's checkpoint at {source} has a policy that offloads to "
                f"{case.dst}: the planner plans the region from its inside and does not "
                f"keep the policy, so nothing is offloaded unless plan(..., platform=...) "
                f"gives a host link (then the plan decides what goes to host memory); "
                f"the values are the same",
                stacklevel=4,
            )
            return


def flatten(closed: ClosedJaxpr, inline: tuple[str, ...] = ()) -> FlatJaxpr:
    """``closed`` with nested ``jit``s (and the primitives named in ``inline``, e.g.
    ``checkpoint``) inlined and scans kept whole: a :class:`FlatJaxpr`."""
    builder = Builder()
    builder.unroll = False
    builder.inlined = INLINED + tuple(inline)  # checkpoints only where asked for
    ins = [builder.new(v.aval) for v in closed.jaxpr.invars]
    outs = builder.inline(closed.jaxpr, closed.consts, ins)
    return FlatJaxpr(
        tuple(builder.avals), tuple(builder.eqns), tuple(ins), tuple(outs), dict(builder.consts)
    )

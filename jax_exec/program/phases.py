"""A block's backward as a few kernels that free what they have consumed (docs/auto.md,
"Backward phases").

XLA runs a plain training step as one program: in the backward of a layer, the buffer
of a residual is reused as soon as its last reader has run. A block's backward compiled
as one kernel holds all its inputs (the block's saved residuals, its outputs and their
cotangents) until it returns, so its temporaries add to all of them: the op-by-op
runtime would need more than XLA's own step (a convolution's backward working set on
top of the residuals of the activation after it, already consumed).

So the backward function of a block and option (``backward(p, g, x, outs, results,
new, d_outs, d_through)``, :mod:`jax_exec.program.kernels`) is traced to a jaxpr,
flattened (nested ``jit`` and ``checkpoint`` regions inlined) and cut into at most
:data:`MAX_PHASES` phases next to matmuls and convolutions, where the most bytes
of the block's own inputs have had their last reader. Each phase is one kernel;
before phase j the op-by-op runtime deletes the block's own inputs no later phase
reads (saved residuals, outputs and their cotangents, the cotangents passed through),
and after it the intermediates no later phase reads.

Memory, exact (the runtime measures the same): with R the live bytes before the
backward op, phase j needs ``R - released[j] + live[j] + temp[j]``: ``released[j]``
the bytes of the block's own inputs deleted before phase j, ``live[j]`` the bytes of
the intermediates held while it runs (outputs of earlier phases that it or a later one
reads, its own outputs, the input cotangents made so far; parameters' gradients are
held outside, like the parameters), ``temp[j]`` its kernel's temporary bytes. In the
block chain (``schedir.blocks``) that is ``bwd_tmp - bwd_release`` over the total
after adding ``d[k]`` (:meth:`PhasedBackward.effective`); ``bwd_tmp`` alone is the need
when nothing is freed (in a graph, where the inputs are nodes freed by ``Free`` ops).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jax_exec.program.blocks import eqn_has_anchor
from jax_exec.program.flat import Eqn, FlatJaxpr, Lit, aval_bytes, evaluate
from jax_exec.program.flatten import CHECKPOINTS, flatten

MAX_PHASES = 2  # more phases compile more kernels for no measured gain on the examples
# A host-memory variant's backward (planned with a host link only) is cut into up to
# this many phases: more of its residuals are first read after phase 0 (docs/auto.md,
# "Host offload": 4 of the 16 zoo families' least budgets drop with 4, 2 with 2)
LATE_PHASES = 4
GROUPS = ("p", "g", "x", "outs", "results", "new", "d_outs", "through")
RELEASABLE = frozenset({"outs", "new", "d_outs", "through"})  # owned by the block's buffers


@dataclass(frozen=True)
class Phase:
    """One kernel of a phased backward.

    Attributes:
        eqns: its equations.
        ins: value ids it reads and does not make (arguments, earlier phases' values).
        outs: value ids it returns (read later, or outputs of the backward).
        extras: ``(id, source)`` of outputs of the backward that no equation makes
            (literals, arguments, repeats), returned as new arrays by the last phase.
    """

    eqns: tuple[Eqn, ...]
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    extras: tuple[tuple[int, Any], ...] = ()


@dataclass(frozen=True)
class PhasedBackward:
    """A block's backward cut into phases (module docstring).

    Attributes:
        flat: the flattened backward jaxpr (avals extended with the extras' ids).
        groups: per flat argument, ``(group, index in group)`` (``GROUPS``).
        phases: the kernels, in order.
        free_args: ``free_args[j]``: flat argument positions deleted before phase j.
        free_values: ``free_values[j]``: intermediate value ids deleted after phase j.
        results: value ids of the backward's flat outputs (``d_p`` leaves, then ``d_x``).
        n_dp: how many of them are parameters' gradients.
        released: ``released[j]``: bytes of arguments deleted before phase j.
        live: ``live[j]``: bytes of the intermediates held while phase j runs.
        spans: ``(value id, first phase, last phase)`` of each intermediate held.
        sizes: value id -> bytes on one device (a sharded model's, :meth:`per_device`);
            None: whole bytes.
    """

    flat: FlatJaxpr
    avals: tuple
    groups: tuple[tuple[str, int], ...]
    phases: tuple[Phase, ...]
    free_args: tuple[tuple[int, ...], ...]
    free_values: tuple[tuple[int, ...], ...]
    results: tuple[int, ...]
    n_dp: int
    released: tuple[int, ...]
    live: tuple[int, ...]
    spans: tuple[tuple[int, int, int], ...] = ()
    sizes: dict | None = None

    def nbytes(self, vid: int) -> int:
        return aval_bytes(self.avals[vid]) if self.sizes is None else self.sizes[vid]

    def per_device(self, sizes: dict) -> PhasedBackward:
        """The same phases with their figures in bytes on one device (``sizes``: value
        id -> bytes of its largest shard, for the arguments and every value a phase
        returns: a sharded model's, :mod:`jax_exec.program.placement`)."""
        live, released = _held(self.spans, self.results[: self.n_dp], self.free_args,
                               self.flat.in_ids, sizes.__getitem__)  # fmt: skip
        return dataclasses.replace(self, live=live, released=released, sizes=sizes)

    @property
    def d_x_bytes(self) -> int:
        return sum(self.nbytes(v) for v in self.results[self.n_dp :])

    def specs(self, j: int) -> tuple:
        return tuple(self.avals[v] for v in self.phases[j].ins)

    def function(self, j: int) -> Callable:
        """``fn(*arrays of phase.ins) -> tuple of arrays of phase.outs (+ extras)``."""
        phase, consts, avals = self.phases[j], self.flat.consts, self.avals

        def fn(*arrays: Any) -> tuple:
            env = dict(consts)
            env.update(zip(phase.ins, arrays, strict=True))
            evaluate(None, phase.eqns, env)
            outs = [env[v] for v in phase.outs]
            for vid, src in phase.extras:
                aval = avals[vid]
                value = src.value if isinstance(src, Lit) else env[src]
                outs.append(
                    jax.numpy.broadcast_to(jax.numpy.asarray(value, aval.dtype), aval.shape)
                )
            return tuple(outs)

        return fn

    def effective(self, temps: tuple[int, ...], host: str = "") -> tuple[int, int]:
        """``(bwd_tmp, bwd_release)`` of the block chain for these phase temporaries:
        ``bwd_tmp`` is the largest need over the live bytes after adding the input
        cotangents when nothing is freed (phases run as a graph node's, whose inputs
        stay until a ``Free``), ``bwd_tmp - bwd_release`` the same with the frees.
        ``host``: of the option's host-memory variant (``SaveOption.host``), which
        keeps residuals in host memory (its saved bytes count the device part only):
        each one's bytes are added back from the phase it returns before on
        (:meth:`returns`)."""
        rows = self.rows(temps, host)
        held = max(need for need, _ in rows)
        freed = max(need - rel for need, rel in rows)
        return held - self.d_x_bytes, held - freed

    def rows(self, temps: tuple[int, ...], host: str = "") -> list[tuple[int, int]]:
        """Per phase, ``(need, released)``: the bytes it needs when nothing is freed
        (intermediates, temporaries, residuals back from host memory) and the bytes
        of the block's own inputs freed before it (:meth:`effective`)."""
        back = self.returns(host) if host else {}
        sizes = self.new_bytes()
        rows = []
        for j, (live, temp, rel) in enumerate(zip(self.live, temps, self.released, strict=True)):
            here = sum(sizes[i] for i, phase in back.items() if phase <= j)
            rows.append((live + temp + here, rel))
        return rows

    def late_residuals(self) -> dict[int, int]:
        """Index in group ``new`` -> first phase reading it, of the block's saved
        residuals that phase 0 does not read but a later phase does: what a
        late-residual variant keeps in host memory during the first phases."""
        first_read: dict[int, int] = {}
        for j, phase in enumerate(self.phases):
            for v in phase.ins:
                first_read.setdefault(v, j)
        late = {}
        for pos, (group, i) in enumerate(self.groups):
            vid = self.flat.in_ids[pos]
            if group == "new" and first_read.get(vid, 0) > 0:
                late[i] = first_read[vid]
        return late

    def returns(self, host: str) -> dict[int, int]:
        """Index in group ``new`` -> the phase before which it comes back to the device,
        of the residuals the variant ``host`` (``SaveOption.host``) keeps in host memory:
        ``"late"``, the late residuals (:meth:`late_residuals`), each before the first
        phase that reads it; ``"all"``, those and every other saved residual, back
        before phase 0."""
        back = self.late_residuals()
        if host == "all":
            back = {i: back.get(i, 0) for i in self.new_bytes()}
        return back

    def late(self) -> tuple[int, int]:
        """``(bytes, phase)`` of the late residuals (:meth:`late_residuals`) and the
        first phase that reads one of them (``len(phases)`` when there are none): a
        variant brings the first of them back before that phase, each other one before
        its own first reader."""
        late = self.late_residuals()
        if not late:
            return 0, len(self.phases)
        sizes = self.new_bytes()
        return sum(sizes[i] for i in late), min(late.values())

    def new_bytes(self) -> dict[int, int]:
        """Index in group ``new`` -> bytes, of every saved residual."""
        return {
            i: self.nbytes(self.flat.in_ids[pos])
            for pos, (group, i) in enumerate(self.groups)
            if group == "new"
        }


def _held(
    spans: tuple, dp: tuple, free_args: tuple, in_ids: tuple, nbytes: Callable[[int], int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(live, released)`` of a phased backward (:class:`PhasedBackward`) with these
    value sizes: per phase, the intermediates held (parameters' gradients ``dp``
    apart) and the bytes of its own arguments deleted before it (cumulative)."""
    dp = frozenset(dp)
    live = tuple(
        sum(nbytes(v) for v, a, b in spans if a <= j <= b and v not in dp)
        for j in range(len(free_args))
    )
    released = np.cumsum([sum(nbytes(in_ids[p]) for p in group) for group in free_args])
    return live, tuple(int(r) for r in released.tolist())


def phased_backward(
    backward: Callable, args: tuple, max_phases: int = MAX_PHASES
) -> PhasedBackward:
    """Trace ``backward(*args)`` (``args``: the shapes of its eight argument groups,
    ``GROUPS``) and cut it into phases (module docstring)."""
    closed = jax.make_jaxpr(backward)(*args)
    flat = flatten(closed, inline=CHECKPOINTS)
    groups = tuple(
        (name, i)
        for name, group in zip(GROUPS, args, strict=True)
        for i in range(len(jax.tree_util.tree_leaves(group)))
    )
    if len(groups) != len(flat.in_ids):  # pragma: no cover - make_jaxpr flattens alike
        raise AssertionError("backward arguments do not match the traced inputs")
    eqns, n = flat.eqns, len(flat.eqns)
    avals = list(flat.avals)
    made = {v: i for i, e in enumerate(eqns) for v in e.outs}
    last: dict[int, int] = {}
    for i, e in enumerate(eqns):
        for r in e.ins:
            if not isinstance(r, Lit):
                last[r] = i
    # outputs of the backward: made by an equation, each once; else an extra of the last phase
    results, extras, seen = [], [], set()
    out_avals = [v.aval for v in closed.jaxpr.outvars]
    for ref, aval in zip(flat.outs, out_avals, strict=True):
        if isinstance(ref, Lit) or ref not in made or ref in seen:
            avals.append(jax.ShapeDtypeStruct(tuple(aval.shape), aval.dtype))
            vid = len(avals) - 1
            extras.append((vid, ref))
            if not isinstance(ref, Lit):
                last[ref] = n  # the last phase reads it
        else:
            vid = ref
            seen.add(ref)
        results.append(vid)
    final = set(results)
    for v in final:
        last[v] = n
    n_dp = len(jax.tree_util.tree_leaves(args[0]))
    # bytes of the block's own inputs whose last reader is before each position
    own = [(pos, flat.in_ids[pos]) for pos, (group, _) in enumerate(groups) if group in RELEASABLE]
    # a boundary at b (between equations b - 1 and b) frees the block's inputs last read
    # before b and holds the intermediates made before b and read after (each kernel
    # fuses its own): worth it where it frees more than it holds since the last one
    dies = np.zeros(n + 2, dtype=np.int64)  # dies[b]: own inputs last read by equation b - 1
    for _, vid in own:
        dies[last.get(vid, -1) + 1] += aval_bytes(avals[vid])
    freed = np.cumsum(dies)
    grow = np.zeros(n + 2, dtype=np.int64)  # crossing[b] = cumsum(grow)[b]
    for v, i in made.items():
        if v not in final and last.get(v, i) > i:
            grow[i + 1] += aval_bytes(avals[v])
            grow[last[v] + 1] -= aval_bytes(avals[v])
    crossing = np.cumsum(grow)
    anchor = [eqn_has_anchor(e.name, e.params) for e in eqns]
    gain = {}
    prev = 0
    for b in range(1, n):
        if not (anchor[b - 1] or anchor[b]):
            continue
        score = int(freed[b] - freed[prev] - crossing[b])
        if score > 0:
            gain[b] = score
            prev = b
    cuts = sorted(gain)
    while len(cuts) > max_phases - 1:  # drop the boundaries that gain least
        cuts.remove(min(cuts, key=lambda c: (gain[c], c)))
    bounds = [0, *cuts, n]
    P = len(bounds) - 1
    phase_of = np.searchsorted(np.asarray(bounds[1:]), np.arange(n + 1), side="right")
    phase_of[n] = P  # read by no equation: an output of the backward
    consts = set(flat.consts)
    phases = []
    for j, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        here = {v for e in eqns[lo:hi] for v in e.outs}
        ins: list[int] = []
        reads = [r for e in eqns[lo:hi] for r in e.ins]
        reads += [src for _, src in extras] if j == P - 1 else []
        for r in reads:
            if not isinstance(r, Lit) and r not in here and r not in consts and r not in ins:
                ins.append(r)
        outs = tuple(v for v in sorted(here) if last.get(v, -1) >= hi or v in final)
        phases.append(Phase(tuple(eqns[lo:hi]), tuple(ins), outs,
                            tuple(extras) if j == P - 1 else ()))  # fmt: skip
    # intermediates: alive from the phase that makes them to the one that last reads them
    # (outputs of the backward: to the end); parameters' gradients are not counted
    span = {}
    for j, ph in enumerate(phases):
        for v in (*ph.outs, *(vid for vid, _ in ph.extras)):
            span[v] = (j, P - 1 if v in final else int(phase_of[last[v]]))
    spans = tuple((v, a, b) for v, (a, b) in span.items())
    free_values = [tuple(sorted(v for v, (_, b) in span.items() if b == j and v not in final))
                   for j in range(P)]  # fmt: skip
    # the block's own inputs: deleted before the phase after their last reader's
    free_args = [[] for _ in range(P)]
    for pos, vid in own:
        read_by = last.get(vid, -1)
        if read_by < 0:
            free_args[0].append(pos)
        elif phase_of[read_by] + 1 < P:
            free_args[int(phase_of[read_by]) + 1].append(pos)
    free_args = tuple(tuple(g) for g in free_args)
    live, released = _held(spans, results[:n_dp], free_args, flat.in_ids,
                           lambda v: aval_bytes(avals[v]))  # fmt: skip
    return PhasedBackward(
        flat=flat,
        avals=tuple(avals),
        groups=groups,
        phases=tuple(phases),
        free_args=free_args,
        free_values=tuple(free_values),
        results=tuple(results),
        n_dp=n_dp,
        released=released,
        live=live,
        spans=spans,
    )

"""Cut a traced program into a chain of blocks and a loss stage (docs/auto.md, "Blocks").

A *cut* is a position p in the equation order (equations < p run before, >= p after).
The values crossing it are those produced before p and read at or after p (the
program's inputs, i.e. parameters, model state, arguments and constants, are
*globals*: always at hand, never counted). Cuts are placed where few bytes cross
(Rockmate's cut vertices, generalized to several crossing values: skip connections
cross many cuts): between two consecutive *anchors* (matmuls and convolutions) the
position of least crossing bytes is a candidate, and candidates that are local minima
become cuts (:func:`find_cuts`), so that every block holds real work and identical
layers are cut alike. Blocks are the equations between consecutive cuts; the
last block (from the last cut to the end, where the loss is computed) is the loss
stage. Identical blocks (same computation, same shapes, same wiring: e.g. the layers
of a transformer) get equal :attr:`Block.key` and share options and kernels.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from jax_exec.program.analysis import Analysis
from jax_exec.program.flat import Lit, Program


@dataclass(frozen=True)
class Block:
    """Equations ``start`` .. ``stop - 1`` of the program.

    Attributes:
        index: position in the chain (the loss stage is the last block).
        start, stop: equation range.
        ins: cut values the block reads (value ids, in order of first read).
        globals_: global value ids it reads (parameters, state, arguments, constants).
        outs: values it produces that later blocks (or the loss) read.
        results: values it produces that are program outputs (the loss, ``aux``,
            the model state after the call); they are not cut values unless also read.
        key: equal keys mean identical computations (kernels and options are shared).
    """

    index: int
    start: int
    stop: int
    ins: tuple[int, ...]
    globals_: tuple[int, ...]
    outs: tuple[int, ...]
    results: tuple[int, ...]
    key: Any


@dataclass(frozen=True)
class Blocks:
    """The chain of blocks of a program.

    Attributes:
        blocks: the chain stages, then the loss stage last.
        cuts: ``cuts[c]`` = value ids crossing the c-th cut (c = 0: nothing), the
            cut before block c.
        positions: equation index of each cut.
    """

    blocks: tuple[Block, ...]
    cuts: tuple[tuple[int, ...], ...]
    positions: tuple[int, ...]

    @property
    def length(self) -> int:
        """Number of chain stages (blocks before the loss stage)."""
        return len(self.blocks) - 1


def _last_reads(program: Program) -> dict[int, int]:
    """value id -> index of the last equation reading it (n for the loss)."""
    last: dict[int, int] = {}
    for i, eqn in enumerate(program.eqns):
        for r in eqn.ins:
            if not isinstance(r, Lit):
                last[r] = i
    if not isinstance(program.loss, Lit):
        last[program.loss] = len(program.eqns)
    return last


def crossing_bytes(program: Program) -> np.ndarray:
    """``crossing[p]`` = bytes of the non-global values crossing position p (0..n)."""
    n = len(program.eqns)
    diff = np.zeros(n + 2, dtype=np.int64)
    globals_ = set(program.input_ids)
    for vid, last in _last_reads(program).items():
        if vid in globals_:
            continue
        prod = program.producer[vid]
        if last > prod:
            diff[prod + 1] += program.nbytes(vid)
            diff[last + 1] -= program.nbytes(vid)
    return np.cumsum(diff)[: n + 1]


ANCHORS = frozenset({"dot_general", "conv_general_dilated"})


def eqn_has_anchor(name: str, params: dict) -> bool:
    """Whether an equation is a matmul or convolution, or holds one in a sub-jaxpr."""
    if name in ANCHORS:
        return True
    for value in params.values():
        inner = getattr(value, "jaxpr", value)
        if hasattr(inner, "eqns") and has_anchor(inner):
            return True
    return False


def has_anchor(jaxpr: Any) -> bool:
    return any(eqn_has_anchor(e.primitive.name, e.params) for e in jaxpr.eqns)


def anchors(program: Program, analysis: Analysis) -> list[int]:
    """Equations that carry the model's compute: matmuls, convolutions, and opaque
    equations containing one (a block holds at least one)."""
    found = []
    for i, (eqn, info) in enumerate(zip(program.eqns, analysis.infos, strict=True)):
        if eqn.name in ANCHORS:
            found.append(i)
        elif info.category == "opaque":
            inner = [getattr(v, "jaxpr", v) for v in eqn.params.values()]
            if any(hasattr(j, "eqns") and has_anchor(j) for j in inner):
                found.append(i)
    if not found:  # no matmul at all: every heavy equation anchors
        found = [i for i, info in enumerate(analysis.infos) if info.heavy]
    return found


def find_cuts(
    program: Program, analysis: Analysis, window: int = 1, max_anchors: int = 4
) -> list[int]:
    """Cut positions, ascending, each strictly inside (0, n) (module docstring).

    Between consecutive anchors (:func:`anchors`) the candidate is the position of
    least crossing bytes (the last one on ties); a candidate becomes a cut when its
    bytes are the least of the ``window`` intervals on either side, or when
    ``max_anchors`` anchors would otherwise pass without a cut (then the least of
    those intervals is cut). After the last anchor, the position of least crossing
    bytes before the last heavy equation starts the loss stage.
    """
    n = len(program.eqns)
    found = anchors(program, analysis)
    heavy = [i for i, info in enumerate(analysis.infos) if info.heavy]
    if len(found) < 2 or not heavy:
        return []
    crossing = crossing_bytes(program)
    last_heavy = heavy[-1]  # the loss stage keeps heavy work
    candidates = []  # (bytes, position) per interval between anchors
    for a, b in zip(found[:-1], found[1:], strict=True):
        positions = range(a + 1, b + 1)
        if not positions:
            continue
        best = min(positions, key=lambda p: (crossing[p], -p))
        candidates.append((int(crossing[best]), best))
    cuts: list[int] = []
    pending: list[tuple[int, int]] = []
    for j, (size, pos) in enumerate(candidates):
        near = candidates[max(0, j - window) : j + window + 1]
        pending.append((size, pos))
        if size <= min(c[0] for c in near):
            cuts.append(pos)
            pending = []
        elif len(pending) >= max_anchors:
            size, pos = min(pending, key=lambda c: (c[0], -c[1]))
            cuts.append(pos)
            pending = [c for c in pending if c[1] > pos]
    tail = range(found[-1] + 1, last_heavy + 1)
    if tail:
        cuts.append(min(tail, key=lambda p: (crossing[p], -p)))
    found_cuts = set(cuts)
    for scan in program.scans:  # every iteration of an unrolled scan is cut alike
        found_cuts = _cut_alike(found_cuts, scan.starts, last_heavy)
    return sorted(p for p in found_cuts if 0 < p < n)


def _cut_alike(cuts: set[int], starts: tuple[int, ...], last_heavy: int) -> set[int]:
    """``cuts`` with an unrolled scan's iterations (``starts``: where each starts, then
    where the last ends) cut alike: at each iteration's start, and inside it at the
    offsets from its start that most of its iterations have (the first such set on
    ties). The crossing bytes differ at a scan's ends (the values before it, the
    stacking after it), so its first or last iteration can get a cut of its own: it
    would make that iteration another block, outside the loop the compiled path keeps
    the others in (jax_exec.execute.loops). Iterations past the last heavy equation
    (the loss stage's) are left as they are."""
    spans = [(a, b) for a, b in zip(starts[:-1], starts[1:], strict=True) if b <= last_heavy + 1]
    if not spans:
        return cuts | {p for p in starts if p <= last_heavy}
    inside = [frozenset(p - a for p in cuts if a < p < b) for a, b in spans]
    offsets = Counter(inside).most_common(1)[0][0]
    kept = {p for p in cuts if not any(a < p < b for a, b in spans)}
    kept.update(a + o for a, _ in spans for o in offsets)
    return kept | {p for p in starts if p <= last_heavy}


def build_blocks(program: Program, analysis: Analysis, positions: list[int]) -> Blocks:
    """The blocks between ``positions`` (ascending cut positions, 0 < p < n)."""
    n = len(program.eqns)
    bounds = [0, *positions, n]
    if any(not 0 < p < n for p in positions) or positions != sorted(set(positions)):
        raise ValueError(f"cut positions {positions} must be increasing inside (0, {n})")
    globals_ = set(program.input_ids)
    last = _last_reads(program)
    outputs = {
        r for r in (program.loss, *program.aux, *program.new_rest, *program.written_ids)
        if not isinstance(r, Lit)
    }  # fmt: skip
    blocks, cuts = [], [()]
    for b, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        ins: list[int] = []
        gls: list[int] = []
        produced: list[int] = []
        local: dict[int, tuple[int, int]] = {}
        wiring = []
        for i in range(start, stop):
            eqn = program.eqns[i]
            refs = []
            for r in eqn.ins:
                if isinstance(r, Lit):
                    arr = np.asarray(r.value)
                    refs.append(("lit", arr.tobytes(), str(arr.dtype)))
                elif r in local:
                    refs.append(("local", *local[r]))
                elif r in globals_:
                    if r not in gls:
                        gls.append(r)
                    refs.append(("global", gls.index(r)))
                else:
                    if r not in ins:
                        ins.append(r)
                    refs.append(("in", ins.index(r)))
            for j, vid in enumerate(eqn.outs):
                local[vid] = (i - start, j)
                produced.append(vid)
            wiring.append((analysis.infos[i].key, tuple(refs)))
        is_loss = stop == n
        if is_loss and not isinstance(program.loss, Lit) and program.loss not in local:
            if program.loss in globals_:  # the loss is an input or a constant
                if program.loss not in gls:
                    gls.append(program.loss)
            elif program.loss not in ins:
                ins.append(program.loss)  # the loss was computed earlier: it crosses
        outs = tuple(v for v in produced if last.get(v, -1) >= stop)
        results = tuple(v for v in produced if v in outputs)
        kinds = tuple(_global_kind(program, g) for g in gls)
        act = tuple(v in analysis.active for v in ins)
        key = BlockKey((
            tuple(wiring),
            kinds,
            act,
            tuple(local[v] for v in outs),
            tuple(local[v] for v in results),
            is_loss,
        ))  # fmt: skip
        blocks.append(Block(b, start, stop, tuple(ins), tuple(gls), outs, results, key))
        if not is_loss:
            crossing = sorted(
                v
                for v, lr in last.items()
                if v not in globals_ and program.producer[v] < stop <= lr
            )
            cuts.append(tuple(crossing))
    return Blocks(tuple(blocks), tuple(cuts), tuple(positions))


class BlockKey(tuple):
    """A block's key: a tuple, equal by value, whose hash is computed once. It holds
    every equation of the block, and the planner looks kernels, phases and options up
    by it (:meth:`jax_exec.program.model.BlockModel.identity`) thousands of times per
    solve: rehashing it each time took most of the time of a problem's build."""

    def __hash__(self) -> int:
        cached = self.__dict__.get("hash")
        if cached is None:
            cached = self.__dict__["hash"] = tuple.__hash__(self)
        return cached


def _global_kind(program: Program, vid: int) -> tuple:
    aval = program.avals[vid]
    kind = "param" if vid in program.param_like else "other"
    return (kind, tuple(aval.shape), str(aval.dtype))

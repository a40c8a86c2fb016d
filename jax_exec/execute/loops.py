"""Scan runs of a block-chain schedule kept as loops by the compiled path
(docs/auto.md, "Compiled path"; :func:`jax_exec.execute.lowering.lower`).

The tracer unrolls a ``scan`` into its iterations (:mod:`jax_exec.program.trace`), so a
scanned stack is a chain of identical blocks. A *scan run* is a chain of Records
``Record(k) -> Record(k+1) -> ...`` of the schedule's tree whose blocks repeat with a
period of ``m`` blocks (one or several blocks an iteration) ``n >= 2`` times: block
``k + t*m + r`` is block ``k + r`` again (same kernels and option, its cut values in the
same positions and shapes) reading the next slice of the same stacked globals. The cut
values compared are the carried ones (:func:`carry_cut`): a scan's ``ys`` wait in the
unrolled cuts for their stacking after the scan, so those cuts grow; the loop emits
them instead (:func:`emits`), stacked (:func:`emitted_stacks`), and the blocks after it
read the stacks. The run is lowered as one ``lax.scan`` over the slice index
(:func:`jax_exec.execute.loop_vjp.looped`) whose residuals are the unrolled Records',
stacked, so the compiled step saves the same bytes and XLA compiles the period once
instead of ``n`` times.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import jax

from jax_exec.execute.tree import Record, Segment, parse_tree
from jax_exec.program.flat import Lit
from jax_exec.program.model import BlockModel
from schedir import Schedule
from schedir.blocks.simulate import schedule_options

MAX_PERIOD = 8  # blocks an iteration considered (a transformer layer is 2-4 blocks)
# A forward-only loop of two periods compiles to more XLA instructions than a second
# unrolled copy (the scan LM at its least budget: 11,580 optimized HLO instructions
# against 9,387; 9,387 with no loop of two; the SSM's 8,602 and 8,586).
MIN_FORWARD_LENGTH = 3


@dataclass(frozen=True)
class ScanRun:
    """Blocks ``start .. start + period * length - 1`` of a schedule lowered as a loop.

    Attributes:
        start, period, length: the first block, the blocks a period (one iteration of
            the loop) and the number of periods (>= 2).
        params, others: per block of the first period, per position of its ``p`` /
            ``g``: ``("same", vid)`` (one global for every period) or ``("stack", src,
            lo)``: the slices ``src[lo .. lo + length - 1]`` of a stacked global, one
            per period.
        step: +1 if period t reads slice ``lo + t``, -1 if ``lo + length - 1 - t`` (a
            reverse scan).
        top: whether the run is on the tree's top level (its residuals are the step's).
        scan: the unrolled scan (index into ``Program.scans``) its blocks belong to.
    """

    start: int
    period: int
    length: int
    params: tuple
    others: tuple
    step: int
    top: bool
    scan: int

    @property
    def blocks(self) -> range:
        return range(self.start, self.start + self.period * self.length)

    def time_of(self, i: int) -> int:
        """The period (0 .. length - 1 in execution order) reading slice i."""
        return i if self.step > 0 else self.length - 1 - i

    def template(self, k: int) -> int:
        """The block of the first period that block k repeats."""
        return self.start + (k - self.start) % self.period

    def keys(self) -> tuple[list, list]:
        """The distinct operands of the loop, ``(params, others)``: ``("same", vid)``
        or ``("stack", name)`` (:func:`stack_key`)."""
        found: tuple[list, list] = ([], [])
        for links, out in ((self.params, found[0]), (self.others, found[1])):
            for row in links:
                for ln in row:
                    key = ln if ln[0] == "same" else ("stack", stack_key(ln, self.length))
                    if key not in out:
                        out.append(key)
        return found


def stack_key(link: tuple, n: int) -> str:
    """Name of the stacked slice range ``src[lo .. lo + n - 1]`` of a run's operand."""
    return f"{link[1]}:{link[2]}:{n}"


def boundary(model: BlockModel, run: ScanRun) -> tuple[tuple, tuple, tuple[bool, ...]]:
    """``(entering, leaving, changing)``: the carried cut values (:func:`carry_cut`)
    entering the first period and leaving it (positionally alike), and per position
    whether it changes."""
    entering = carry_cut(model, run.start, run.scan)
    leaving = carry_cut(model, run.start + run.period, run.scan)
    return entering, leaving, tuple(u != v for u, v in zip(entering, leaving, strict=True))


def emits(model: BlockModel, run: ScanRun) -> tuple[tuple[int, int], ...]:
    """``(block of the first period, output index)`` of the outputs a period emits
    (:func:`emitted`): the loop stacks each into one ``(length, ...)`` array."""
    return tuple(
        (k, o)
        for k in range(run.start, run.start + run.period)
        for o, v in enumerate(model.layouts[k].outs)
        if emitted(model, run.scan, v)
    )


def members(model: BlockModel, run: ScanRun) -> tuple[tuple[int, ...], ...]:
    """Per emitted output (:func:`emits`), the values it stacks, in slice order (the
    order of ``lax.scan``'s ``ys`` and of the scan's own stacking)."""
    return tuple(
        tuple(model.layouts[k + run.time_of(i) * run.period].outs[o] for i in range(run.length))
        for k, o in emits(model, run)
    )


def inner_values(model: BlockModel, run: ScanRun) -> tuple[tuple[int, int], ...]:
    """``(block of the first period, output index)`` of the outputs made inside a
    period that neither leave it nor are emitted (the loop stacks them, one per period)."""
    leaving = set(boundary(model, run)[1])
    out = set(emits(model, run))
    return tuple(
        (k, o)
        for k in range(run.start, run.start + run.period)
        for o, v in enumerate(model.layouts[k].outs)
        if v not in leaving and (k, o) not in out
    )


def scan_of(model: BlockModel, k: int) -> int | None:
    """The unrolled scan (its index in ``model.program.scans``) block k is a period's
    block of, else None (its start inside the scan's iterations but the last's start)."""
    start = model.blocks.blocks[k].start
    for s, info in enumerate(model.program.scans):
        if info.starts[0] <= start < info.starts[-1]:
            return s
    return None


@dataclass(frozen=True)
class _ScanValues:
    """What unrolled scan ``scan``'s values do after it: ``ys`` (its per-iteration outputs),
    ``final`` (its final carry), ``after`` (values read after its last iteration),
    ``last_inside`` (value -> the last equation inside the scan reading it),
    ``invariant`` (values made before the scan that every iteration reads: its ``xs``
    and closed-over values) and ``carried`` (value -> the first carry position it is
    in, in any iteration)."""

    scan: int
    end: int
    ys: frozenset
    final: frozenset
    after: frozenset
    last_inside: dict
    invariant: frozenset
    carried: dict

    def order(self, model: BlockModel, v: int) -> tuple:
        """Sort key of value v in a carried cut (:func:`carry_cut`), alike for the
        values in the same place in every iteration: values made before the scan, by
        id, then the carries, by position (an initial carry made before the scan, too),
        then the values made inside an iteration, by where in it."""
        if v in self.carried:
            return (1, self.carried[v], 0)
        made = model.program.producer.get(v, -1)
        starts = model.program.scans[self.scan].starts
        if made < starts[0]:
            return (0, v, 0)
        t = bisect.bisect_right(starts, made) - 1
        return (2, made - starts[t], model.program.eqns[made].outs.index(v))


def _scan_values(model: BlockModel, s: int) -> _ScanValues:
    def compute() -> _ScanValues:
        info = model.program.scans[s]
        begin, end = info.starts[0], info.starts[-1]
        last_inside, after = {}, set()
        for i, eqn in enumerate(model.program.eqns[begin:], begin):
            for r in eqn.ins:
                if isinstance(r, Lit):
                    continue
                if i < end:
                    last_inside[r] = i
                else:
                    after.add(r)
        if not isinstance(model.program.loss, Lit):
            after.add(model.program.loss)
        ys = frozenset(r for y in info.ys for r in y if not isinstance(r, Lit))
        final = frozenset(r for r in info.carries[-1] if not isinstance(r, Lit))
        producer = model.program.producer
        invariant = frozenset(  # made before the scan, read by its last iteration too
            v
            for v, i in last_inside.items()
            if producer.get(v, begin) < begin <= info.starts[-2] <= i
        )
        carried: dict = {}
        for carry in info.carries:
            for j, r in enumerate(carry):
                if not isinstance(r, Lit):
                    carried.setdefault(r, j)
        return _ScanValues(s, end, ys, final, frozenset(after), last_inside, invariant, carried)

    return model.cached(("scan values", s), compute)


def emitted(model: BlockModel, s: int, v: int) -> bool:
    """Whether value v is one of scan s's ``ys`` read after the scan: a loop emits it
    (stacked by ``lax.scan``) instead of carrying it to the scan's end."""
    sv = _scan_values(model, s)
    return v in sv.ys and v in sv.after


def carry_cut(model: BlockModel, j: int, s: int) -> tuple:
    """``cuts[j]`` without the *pending* values of scan s: its ``ys`` (not its final
    carry) that no equation of the scan reads from cut j on; they wait for their readers
    after the scan (the stacking of ``ys``), so that an unrolled scan's cuts grow by
    one iteration's ``ys`` per iteration while the loop carries the rest. The cuts in
    the scan's last iteration and at its end also hold the scan's invariant values (as
    every cut of the earlier iterations does, though the last may stop reading them
    before its end), so that its last iteration is wired like the others; the values
    are in the same order in every iteration (:meth:`_ScanValues.order`), so that its
    first one is too."""
    sv = _scan_values(model, s)
    at = model.blocks.blocks[j].start
    kept = {
        v
        for v in model.blocks.cuts[j]
        if v not in sv.ys or v in sv.final or sv.last_inside.get(v, -1) >= at
    }
    if at > model.program.scans[s].starts[-2]:  # in the last iteration or after it
        kept |= sv.invariant
    return tuple(sorted(kept, key=lambda v: sv.order(model, v)))


def _pattern(model: BlockModel, k: int) -> tuple | None:
    """Block k's wiring by carried cut positions (:func:`carry_cut`) and shapes (alike
    for a repeated block): where each value of the next carried cut comes from
    (``("out", o)`` or ``("keep", pos)``), the positions it reads, which outputs it
    emits (:func:`emitted`), which values are differentiated, the shapes."""
    s = scan_of(model, k)
    if s is None:
        return None
    lay = model.layouts[k]
    here, nxt = carry_cut(model, k, s), carry_cut(model, k + 1, s)
    avals = model.program.avals
    emits = tuple(emitted(model, s, v) for v in lay.outs)
    origin = []
    for v in nxt:
        if v in lay.outs:
            origin.append(("out", lay.outs.index(v)))
        elif v in here:
            origin.append(("keep", here.index(v)))
        else:
            return None
    if any(v not in nxt and not e for v, e in zip(lay.outs, emits, strict=True)):
        return None  # an output neither carried nor emitted
    if any(v not in here for v in lay.ins):
        return None
    shapes = tuple((avals[v].shape, avals[v].dtype) for v in (*here, *nxt))
    active = tuple(v in model.analysis.active for v in (*here, *nxt, *lay.outs))
    return tuple(origin), tuple(here.index(v) for v in lay.ins), emits, active, shapes


def _links(model: BlockModel, k: int, j: int) -> tuple | None:
    """How block j's globals follow block k's (``("same", vid)`` or ``("stack", src,
    i_k, i_j)`` per position of ``p`` then ``g``); None if they do not."""
    derived = model.program.derived
    rows = []
    for us, vs in (
        (model.layouts[k].params, model.layouts[j].params),
        (model.layouts[k].others, model.layouts[j].others),
    ):
        row = []
        for u, v in zip(us, vs, strict=True):
            du, dv = derived.get(u), derived.get(v)
            if u == v and du is None:
                row.append(("same", u))
            elif du is not None and dv is not None and du[0] == dv[0]:
                row.append(("stack", du[0], du[1], dv[1]))
            else:
                return None
        rows.append(tuple(row))
    return tuple(rows)


def _repeats(model: BlockModel, options: tuple, k: int, j: int) -> tuple | None:
    """Block j's links to block k (:func:`_links`) if it repeats it: same block and
    option (so the same functions), same wiring, same unrolled scan; else None."""
    if model.identity(k) != model.identity(j) or options[k] != options[j]:
        return None
    scan = scan_of(model, k)
    if scan is None or scan != scan_of(model, j):
        return None
    fns = model.functions(k, options[k])
    if fns is not model.functions(j, options[j]):
        return None
    if any(kind == "result" for kind, _ in fns.recipe.sources):
        return None  # a backward reading a block's results (state): left unrolled
    pattern = model.cached(("loop pattern", k), lambda: _pattern(model, k))
    if pattern is None or pattern != model.cached(("loop pattern", j), lambda: _pattern(model, j)):
        return None
    return _links(model, k, j)


def _grow(model: BlockModel, options: tuple, chain: list[int], m: int) -> tuple | None:
    """``(length, step, links)`` of the run of period m at the start of ``chain`` (a
    list of consecutive block indices reached by Records), or None."""
    k0, t, step, first = chain[0], 1, 0, None
    while (t + 1) * m <= len(chain):
        diffs, rows = set(), []
        for r in range(m):
            links = _repeats(model, options, k0 + r, k0 + t * m + r)
            if links is None:
                break
            diffs |= {ln[3] - ln[2] for row in links for ln in row if ln[0] == "stack"}
            rows.append(links)
        if len(rows) < m or len(diffs) != 1:
            break
        d = diffs.pop()
        if t == 1:
            if d not in (1, -1):
                break
            step, first = d, rows
        elif d != step * t:
            break
        t += 1
    if first is None:
        return None
    return t, step, first


def _run_at(model: BlockModel, options: tuple, chain: list[int], top: bool) -> ScanRun | None:
    """The scan run covering the most blocks at the start of ``chain`` (the shortest
    period on ties), or None."""
    best = None
    scan = scan_of(model, chain[0])
    if scan is None:
        return None
    for m in range(1, min(MAX_PERIOD, len(chain) // 2) + 1):
        entering = carry_cut(model, chain[0], scan)
        leaving = carry_cut(model, chain[0] + m, scan)
        if len(entering) != len(leaving) or any(
            u != v and v in entering for u, v in zip(entering, leaving, strict=True)
        ):
            continue  # a value moving to another position: the carry would hold it twice
        found = _grow(model, options, chain, m)
        if found is not None and (best is None or found[0] * m > best[0] * best[1]):
            best = (found[0], m, found[1], found[2])
    if best is None:
        return None
    n, m, step, rows = best

    def stacked(row: tuple) -> tuple:
        return tuple(
            ln if ln[0] == "same" else ("stack", ln[1], ln[2] if step > 0 else ln[2] - (n - 1))
            for ln in row
        )

    return ScanRun(
        chain[0], m, n, tuple(stacked(r[0]) for r in rows), tuple(stacked(r[1]) for r in rows),
        step, top, scan,
    )  # fmt: skip


def forward_runs(model: BlockModel, start: int, stop: int) -> dict[int, ScanRun]:
    """The scan runs of blocks ``start .. stop - 1`` run forward only (a Segment's first
    forward, :mod:`jax_exec.execute.segments`), by first block: from each block on the
    longest run (:func:`_run_at`) of :data:`MIN_FORWARD_LENGTH` periods or more, the
    blocks between runs single. Nothing is recorded, so no run needs its stacks held
    whole (:func:`_stacks_held_whole`). The schedule's options do not matter: a block's
    forward is the same under every option (its option 0's stands for them), so a run
    goes on where the schedule records the next blocks under another option."""
    found: dict[int, ScanRun] = {}
    same = (0,) * model.length
    k = start
    while k < stop:
        run = _run_at(model, same, list(range(k, stop)), False)
        if run is None or run.length < MIN_FORWARD_LENGTH:
            k += 1
        else:
            found[k] = run
            k = run.blocks.stop
    return found


def scan_runs(model: BlockModel, schedule: Schedule) -> dict[int, ScanRun]:
    """The scan runs of ``schedule``'s tree, by first block (:class:`ScanRun`), in the
    Record chains at every level (the top, inside Segments). A host-memory variant's
    block is in none (a loop's residuals stay on the device)."""
    options = schedule_options(model.problem, schedule)
    late = {k for k, o in enumerate(options) if model.option(k, o).host}
    found: dict[int, ScanRun] = {}

    def walk(node: Any, top: bool) -> None:
        while isinstance(node, Record | Segment):
            if isinstance(node, Segment):
                walk(node.inside, False)
                node = node.after
                continue
            chain, cur = [node.index], node
            while (
                isinstance(cur.rest, Record)
                and cur.rest.index == chain[-1] + 1
                and cur.rest.index not in late
            ):
                cur = cur.rest
                chain.append(cur.index)
            run = None if node.index in late else _run_at(model, options, chain, top)
            skip = 1 if run is None else run.period * run.length
            if run is not None:
                found[node.index] = run
            for _ in range(skip):
                node = node.rest

    walk(parse_tree(schedule, model.length), True)
    while True:  # dropping a run can make another's stacks valid: to a fixed point
        bad = [k for k, r in found.items() if not _stacks_held_whole(model, r, found)]
        if not bad:
            return found
        r = found.pop(bad[0])
        # Its last period unrolled, where the next run's first block reads that period's
        # outputs as its carry (two scan runs of one scan under two options):
        shorter = _run_at(model, options, list(r.blocks)[: -r.period], r.top)
        if shorter is not None:  # (fewer blocks: the fixed point is reached)
            found[r.start] = shorter


def _stacks_held_whole(model: BlockModel, run: ScanRun, runs: dict) -> bool:
    """Whether every value the run emits (:func:`members`) is read after it as part of
    its stacked array: each cut after the run holds all of a stack's values or none (so
    the stack holds the unrolled bytes), and no block of another run reads them (a
    loop's carry would slice them out: held twice)."""
    cuts = model.blocks.cuts
    stacks = [set(vids) for vids in members(model, run)]
    if not stacks:
        return True
    for c in range(run.blocks.stop, len(cuts)):
        if any(0 < len(vids.intersection(cuts[c])) < len(vids) for vids in stacks):
            return False
    emitted_values = set().union(*stacks)
    return not any(
        emitted_values.intersection(model.layouts[k].ins)
        for other in runs.values()
        if other is not run
        for k in other.blocks
    )


@dataclass(frozen=True)
class Stack:
    """An emitted output of a run (:func:`emits`) as the one stacked array the loop
    makes: value ``id`` (numbered after the program's values), the ``values`` it stacks
    (:func:`members`) and its shape and dtype ``aval``."""

    id: int
    values: tuple[int, ...]
    aval: jax.ShapeDtypeStruct


def emitted_stacks(model: BlockModel, runs: dict[int, ScanRun]) -> dict[int, tuple[Stack, int]]:
    """Every value the runs emit -> ``(its Stack, its index in it)``: after its run it
    is read from the stack only (:func:`~jax_exec.execute.lowering.lower`)."""
    found: dict[int, tuple[Stack, int]] = {}
    next_id = len(model.program.avals)
    for r in sorted(runs.values(), key=lambda r: r.start):
        for vids in members(model, r):
            aval = model.program.avals[vids[0]]
            st = Stack(next_id, vids, jax.ShapeDtypeStruct((r.length, *aval.shape), aval.dtype))
            next_id += 1
            found.update((v, (st, i)) for i, v in enumerate(vids))
    return found


def held(cut: tuple, stacked: dict[int, tuple[Stack, int]]) -> tuple[int, ...]:
    """The value ids holding ``cut``'s values: a stacked value's Stack id in its place
    (once)."""
    out: list[int] = []
    for v in cut:
        key = stacked[v][0].id if v in stacked else v
        if key not in out:
            out.append(key)
    return tuple(out)

"""``weight_offload``: train a chain whose weights do not fit on the device.

After the weight-offloading strategies of Beaumont, Eyraud-Dubois, Shilova (docs/offload.md).
Every weight ``w[k]`` (``problem.weight_size[k]`` bytes) lives on the host; a stage's
compute op needs ``w[k]`` on the device; ``B(k)`` produces the parameter gradient ``g[k]``
(same size) which is offloaded to the host. The solver decides *when* each weight is
prefetched and when each gradient's device copy is given back, under a device budget.

The model (``meta["overlap_model"]`` repeats it):

- **Compute sequence.** A fixed chain schedule: store-all (``compute="store_all"``,
  default: ``F_all(0..L-1) Loss B(L-1..0)``), rotor's remat schedule at
  ``budget - 2 * max(weight_size)`` (``compute="rotor"``, tight model: room for the
  op's own weight and gradient), or any chain ops given. Its activation memory is the
  chain simulator's, per op.
- **Uses.** Each compute op of stage k with ``weight_size[k] > 0`` is a use of ``w[k]``.
  A use either *keeps* the weight from the previous use of the same stage (resident in
  between, no transfer) or the weight was evicted after that previous use and is
  prefetched again; the first use of every weight is a prefetch (weights start on the
  host). After the last use, and after a use whose next use does not keep it, the
  weight is evicted (``Evict``: the host keeps its copy).
- **Prefetch points.** A prefetch is issued in a *slot*: slot s sits between compute op
  s and op s+1 (slot 0 before the first op), so it overlaps op s+1 onwards. Prefetches
  run on the one prefetch engine in the order of their uses (FIFO; a prefetch issued in
  slot s starts at max(end of op s, end of the previous prefetch)) and take
  ``latency + bytes / bandwidth``. A compute op starts when the previous op ended and its
  weight arrived: the difference is a *stall*.
- **Gradients.** ``Offload(g[k])`` is issued right after ``B(k)`` on the offload engine
  (FIFO); ``Wait(g[k])`` is placed in some later slot q (also a decision): the compute
  stream waits there for the copy, and g[k] counts on the device up to q.
- **Memory** (what the budget bounds) is program-order: at each compute op, activations
  (chain op need, temporaries included) + weights resident or being prefetched + gradients
  not yet waited for; at each slot, after its prefetches and before its waits, likewise.
  The simulator's timed peak is never above this (copies start no earlier than issued and
  end no later than their ``Wait``).
- **Makespan** is one training step from a cold start: the first weight's prefetch
  (nothing to overlap it with) and the last gradient's offload are part of it;
  ``meta["lower_bound"]`` = compute + those two transfers. Across steps in steady
  state (a period), these two would overlap the neighbouring steps; not modeled.

Algorithms (``algorithm=``; ``method`` is the registry's argument). ``"milp"``: the exact
optimum of this model (cvxpy + HiGHS; binaries: slot of each prefetch, keep of each use,
slot of each gradient wait; big-M timing, the FIFO engines as precedence constraints;
small chains). ``"greedy"``: keeps a weight when memory allows, else prefetches it in the
earliest slot memory allows (in use order), then delays each gradient wait to the slot
where its offload has ended, as far as memory allows. ``"auto"`` (default): the MILP up to
``milp_ops`` compute ops, the greedy beyond. The greedy's decisions are feasible for the
MILP, so the MILP is never slower (and the better of the two is returned). Every schedule
is checked with ``simulate_offload`` by ``solvers.solve``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from schedir import (
    B,
    Evict,
    InvalidProblem,
    Loss,
    Offload,
    OffloadProblem,
    OffloadSchedule,
    Prefetch,
    Schedule,
    Wait,
    simulate_chain,
    simulate_offload,
)
from schedir.simulate import op_time
from solvers._highs import quiet_stdout, silence_banner
from solvers.offload.rotor_offload import check_budget
from solvers.registry import Infeasible, register

OVERLAP_MODEL = (
    "fixed compute sequence; weights start on the host; each use of w[k] keeps it from "
    "the previous use or prefetches it in a slot (between two compute ops) after "
    "evicting it; prefetches FIFO on one engine in use order, overlapping compute; "
    "g[k] offloaded right after B(k) (FIFO engine), Wait(g[k]) in a chosen later slot; "
    "budget bounds program-order device bytes (activations + resident or in-flight "
    "weights + gradients not yet waited for); one cold-start step (first prefetch and "
    "last gradient offload exposed)"
)


@dataclass(frozen=True)
class Instance:
    """The compute sequence and its uses, positions 1..n (slot s: between op s and s+1)."""

    ops: tuple  # compute ops, ops[j - 1] is op j
    time: tuple  # compute seconds per op (index j - 1)
    need: tuple  # activation bytes op j needs (index j - 1)
    res: tuple  # activation bytes after op s, res[0] = x_0
    uses: tuple  # (j, k, prev) per use in order; prev: previous use position of k or 0
    first: tuple  # whether use u is the first of its weight
    size: tuple  # bytes of w[k] per use
    pre: tuple  # prefetch seconds per use
    grads: tuple  # (b, k) per gradient, in order of the B ops
    gsize: tuple
    off: tuple  # offload seconds per gradient

    @property
    def n(self) -> int:
        return len(self.ops)


@dataclass
class Decision:
    keep: list  # per use
    slot: list  # per use: prefetch slot (None when kept)
    wait: list  # per gradient: slot of its Wait


def _stage(op, L: int) -> int:
    return L if isinstance(op, Loss) else op.index


def instance(problem: OffloadProblem, compute_ops) -> Instance:
    chain, w = problem.chain, problem.weight_size
    ops = tuple(compute_ops)
    trace = simulate_chain(chain, ops)
    L = chain.length
    uses, first, last_use = [], [], {}
    grads = []
    for j, op in enumerate(ops, start=1):
        k = _stage(op, L)
        if w[k] > 0:
            uses.append((j, k, last_use.get(k, 0)))
            first.append(k not in last_use)
            last_use[k] = j
            if isinstance(op, B):
                grads.append((j, k))
    pre, off = problem.platform.prefetch, problem.platform.offload
    return Instance(
        ops=ops,
        time=tuple(op_time(chain, op) for op in ops),
        need=tuple(trace.op_peak),
        res=(trace.initial_memory, *trace.resident),
        uses=tuple(uses),
        first=tuple(first),
        size=tuple(w[k] for _, k, _ in uses),
        pre=tuple(pre.time(w[k]) for _, k, _ in uses),
        grads=tuple(grads),
        gsize=tuple(w[k] for _, k in grads),
        off=tuple(off.time(w[k]) for _, k in grads),
    )


def window(inst: Instance, u: int) -> range:
    """Slots where use u may be prefetched."""
    j, _, prev = inst.uses[u]
    return range(0, j) if inst.first[u] else range(prev + 1, j)


def base_profile(inst: Instance) -> tuple[np.ndarray, np.ndarray]:
    """Program-order bytes at ops (index j, 1..n; 0 unused) and slots (0..n-1) when
    every weight arrives just in time and every gradient is waited for at once."""
    n = inst.n
    op_mem = np.zeros(n + 1, dtype=np.int64)
    slot_mem = np.zeros(n, dtype=np.int64)
    op_mem[1:] = inst.need
    slot_mem[:] = inst.res[:n]
    for (j, _, _), size in zip(inst.uses, inst.size, strict=True):
        op_mem[j] += size
        slot_mem[j - 1] += size
    for (b, _), size in zip(inst.grads, inst.gsize, strict=True):
        op_mem[b] += size
        if b < n:
            slot_mem[b] += size
    return op_mem, slot_mem


def min_budget(inst: Instance) -> int:
    op_mem, slot_mem = base_profile(inst)
    return int(max(inst.res[0], op_mem[1:].max(initial=0), slot_mem.max(initial=0)))


def profile(inst: Instance, dec: Decision) -> tuple[np.ndarray, np.ndarray]:
    """Program-order bytes of a decision (exact, integers)."""
    op_mem, slot_mem = base_profile(inst)
    for u, (j, _, prev) in enumerate(inst.uses):
        lo = prev if dec.keep[u] else dec.slot[u]  # occupied at ops lo+1..j-1, slots lo..j-2
        op_mem[lo + 1 : j] += inst.size[u]
        slot_mem[lo : j - 1] += inst.size[u]
    for g, (b, _) in enumerate(inst.grads):
        q = dec.wait[g]
        op_mem[b + 1 : q + 1] += inst.gsize[g]
        slot_mem[b + 1 : q + 1] += inst.gsize[g]
    return op_mem, slot_mem


def fits(inst: Instance, dec: Decision, budget: int) -> bool:
    op_mem, slot_mem = profile(inst, dec)
    return max(op_mem[1:].max(initial=0), slot_mem.max(initial=0), inst.res[0]) <= budget


def emit(inst: Instance, dec: Decision) -> tuple[tuple, dict, dict]:
    """(ops, position of compute op j, position of the Offload of gradient g)."""
    n = inst.n
    use_at = {j: u for u, (j, _, _) in enumerate(inst.uses)}
    next_keep = {}  # use u -> whether the next use of its weight keeps it
    last = {}
    for u, (_, k, _) in enumerate(inst.uses):
        if k in last:
            next_keep[last[k]] = dec.keep[u]
        last[k] = u
    grad_at = {b: g for g, (b, _) in enumerate(inst.grads)}
    pre_in = [[] for _ in range(n + 1)]
    for u in range(len(inst.uses)):
        if not dec.keep[u]:
            pre_in[dec.slot[u]].append(u)
    wait_in = [[] for _ in range(n + 1)]
    for g, q in enumerate(dec.wait):
        wait_in[q].append(g)
    out, comp, offl = [], {}, {}
    for s in range(n + 1):
        if s >= 1:
            comp[s] = len(out)
            out.append(inst.ops[s - 1])
            if s in grad_at:
                g = grad_at[s]
                offl[g] = len(out)
                out.append(Offload(f"g[{inst.grads[g][1]}]"))
            if s in use_at and not next_keep.get(use_at[s], False):
                out.append(Evict(f"w[{inst.uses[use_at[s]][1]}]"))
        out.extend(Prefetch(f"w[{inst.uses[u][1]}]") for u in pre_in[s])
        out.extend(Wait(f"g[{inst.grads[g][1]}]") for g in wait_in[s])
    return tuple(out), comp, offl


def greedy(inst: Instance, problem: OffloadProblem, budget: int) -> Decision:
    op_mem, slot_mem = base_profile(inst)
    U = len(inst.uses)
    dec = Decision([False] * U, [None] * U, [b for b, _ in inst.grads])
    fifo = 0  # slot of the latest prefetch (prefetches are issued in use order)

    def room(ops: slice, slots: slice, size: int) -> bool:
        return bool(
            (op_mem[ops] + size <= budget).all() and (slot_mem[slots] + size <= budget).all()
        )

    for u, (j, _, prev) in enumerate(inst.uses):
        size = inst.size[u]
        if not inst.first[u] and room(slice(prev + 1, j), slice(prev, j - 1), size):
            dec.keep[u] = True
            op_mem[prev + 1 : j] += size
            slot_mem[prev : j - 1] += size
            continue
        span = window(inst, u)
        s = j - 1
        while s - 1 >= max(span.start, fifo) and room(slice(s, s + 1), slice(s - 1, s), size):
            s -= 1
            op_mem[s + 1] += size
            slot_mem[s] += size
        dec.slot[u], fifo = s, s
    n = inst.n
    for g, (b, _) in enumerate(inst.grads):  # delay each Wait until its copy has ended
        size = inst.gsize[g]
        dec.wait[g] = n
        ops, comp, offl = emit(inst, dec)
        trace = simulate_offload(problem, ops)
        done = trace.end[offl[g]]
        q = b
        while (
            q < n
            and trace.end[comp[q]] < done
            and room(slice(q + 1, q + 2), slice(q + 1, min(q + 2, n)), size)
        ):
            q += 1
            op_mem[q] += size
            if q < n:
                slot_mem[q] += size
        dec.wait[g] = q
    return dec


def milp(inst: Instance, budget: int, *, time_limit: float | None = None):
    """(Decision, proven optimal, objective) of the exact MILP; (None, False, inf) if none."""
    import cvxpy as cp
    import scipy.sparse as sp

    n, U, G = inst.n, len(inst.uses), len(inst.grads)
    nb = 0
    xv = {}  # (u, s) -> binary index
    for u in range(U):
        for s in window(inst, u):
            xv[u, s], nb = nb, nb + 1
    kv = {}
    for u in range(U):
        if not inst.first[u]:
            kv[u], nb = nb, nb + 1
    yv = {}
    for g, (b, _) in enumerate(inst.grads):
        for q in range(b, n + 1):
            yv[g, q], nb = nb, nb + 1
    # continuous: S_1..S_n, PS_u, OS_g, C
    S = {j: j - 1 for j in range(1, n + 1)}
    PS = {u: n + u for u in range(U)}
    OS = {g: n + U + g for g in range(G)}
    C = n + U + G
    nc = C + 1
    big = sum(inst.time) + sum(inst.pre) + sum(inst.off) + 1.0
    rows: list = []  # (dict bin, dict cont, rhs) meaning a.xb + c.xc <= rhs
    eqs: list = []

    def le(bins: dict, conts: dict, rhs: float) -> None:
        rows.append((bins, conts, rhs))

    for u in range(U):  # one choice per use
        bins = {xv[u, s]: 1.0 for s in window(inst, u)}
        if u in kv:
            bins[kv[u]] = 1.0
        eqs.append((bins, 1.0))
    for g in range(G):
        eqs.append(({yv[g, q]: 1.0 for q in range(inst.grads[g][0], n + 1)}, 1.0))

    def occupancy(point: int, scale: float) -> tuple[dict, float]:
        """Bytes (scaled) of weights and gradients resident at op `point` (slot: point-1
        for the weights, i.e. occupancy at op point; gradients handled by the caller)."""
        bins: dict = {}
        const = 0.0
        for u, (j, _, prev) in enumerate(inst.uses):
            if not prev < point <= j:
                continue
            if point == j:
                const += inst.size[u] * scale
                continue
            if u in kv:
                bins[kv[u]] = bins.get(kv[u], 0.0) + inst.size[u] * scale
            for s in window(inst, u):
                if s <= point - 1:
                    bins[xv[u, s]] = bins.get(xv[u, s], 0.0) + inst.size[u] * scale
        return bins, const

    scale = 1.0 / max(budget, 1)

    def grad_terms(bins: dict, point: int) -> float:
        const = 0.0
        for g, (b, _) in enumerate(inst.grads):
            if b > point:
                continue
            if b == point:
                const += inst.gsize[g] * scale
                continue
            for q in range(point, n + 1):
                bins[yv[g, q]] = bins.get(yv[g, q], 0.0) + inst.gsize[g] * scale
        return const

    for j in range(1, n + 1):  # memory at compute op j
        bins, const = occupancy(j, scale)
        const += grad_terms(bins, j)
        le(bins, {}, 1.0 - inst.need[j - 1] * scale - const)
    for s in range(n):  # memory at slot s, after its prefetches, before its waits
        bins, const = occupancy(s + 1, scale)
        if s >= 1:
            const += grad_terms(bins, s)
        le(bins, {}, 1.0 - inst.res[s] * scale - const)
    # timing
    for j in range(2, n + 1):
        le({}, {S[j - 1]: 1.0, S[j]: -1.0}, -inst.time[j - 2])
    for g, (b, _) in enumerate(inst.grads):
        for q in range(b, n):  # Wait in slot q delays op q + 1
            le({yv[g, q]: big}, {OS[g]: 1.0, S[q + 1]: -1.0}, big - inst.off[g])
        le({}, {S[b]: 1.0, OS[g]: -1.0}, -inst.time[b - 1])
        if g > 0:
            le({}, {OS[g - 1]: 1.0, OS[g]: -1.0}, -inst.off[g - 1])
        le({}, {OS[g]: 1.0, C: -1.0}, -inst.off[g])
    for u, (j, _, _) in enumerate(inst.uses):
        if u > 0:  # FIFO engine in use order
            bins = {kv[u - 1]: -inst.pre[u - 1]} if u - 1 in kv else {}
            le(bins, {PS[u - 1]: 1.0, PS[u]: -1.0}, -inst.pre[u - 1])
        for s in window(inst, u):
            if s >= 1:  # issued at the end of op s
                le({xv[u, s]: big}, {S[s]: 1.0, PS[u]: -1.0}, big - inst.time[s - 1])
        bins = {kv[u]: -(inst.pre[u] + big)} if u in kv else {}
        le(bins, {PS[u]: 1.0, S[j]: -1.0}, -inst.pre[u])
    for u in range(U):  # prefetch slots never decrease in use order (FIFO engine)
        for v in range(u + 1, U):
            ju = inst.uses[u][0]
            for s in window(inst, v):
                if s > ju - 2:
                    break
                bins: dict = {}
                for t in window(inst, v):
                    if t <= s:
                        bins[xv[v, t]] = 1.0
                for t in window(inst, u):
                    if t <= s:
                        bins[xv[u, t]] = bins.get(xv[u, t], 0.0) - 1.0
                rhs = 0.0
                for w_ in (u, v):
                    if w_ in kv:
                        bins[kv[w_]] = bins.get(kv[w_], 0.0) - 1.0
                le(bins, {}, rhs)
    le({}, {S[n]: 1.0, C: -1.0}, -inst.time[n - 1])

    def matrix(entries: list, col: int, width: int):
        data, ri, ci = [], [], []
        for r, row in enumerate(entries):
            for c, v in row[col].items():
                ri.append(r)
                ci.append(c)
                data.append(v)
        return sp.csr_matrix((data, (ri, ci)), shape=(len(entries), width))

    xb = cp.Variable(nb, boolean=True)
    xc = cp.Variable(nc, nonneg=True)
    A_b, A_c = matrix(rows, 0, nb), matrix(rows, 1, nc)
    rhs = np.array([r[2] for r in rows])
    E = matrix([(e[0],) for e in eqs], 0, nb)
    cons = [A_b @ xb + A_c @ xc <= rhs, E @ xb == np.array([e[1] for e in eqs])]
    prob = cp.Problem(cp.Minimize(xc[C]), cons)
    opts = {"time_limit": time_limit} if time_limit else {}
    try:
        silence_banner()
        with quiet_stdout():
            prob.solve(solver=cp.HIGHS, mip_rel_gap=1e-9, **opts)
    except cp.error.SolverError:
        return None, False, math.inf
    if xb.value is None:
        return None, False, math.inf
    v = np.round(xb.value).astype(int)
    keep = [bool(v[kv[u]]) if u in kv else False for u in range(U)]
    slot = [None if keep[u] else next(s for s in window(inst, u) if v[xv[u, s]]) for u in range(U)]
    wait = [next(q for q in range(inst.grads[g][0], n + 1) if v[yv[g, q]]) for g in range(G)]
    return Decision(keep, slot, wait), prob.status == cp.OPTIMAL, float(prob.value)


def _everything(problem: OffloadProblem) -> int:
    """Bytes of every buffer at once (all a, d, abar, weights, gradients, the largest
    temporary): no program-order need is larger, so budgets are capped here."""
    c = problem.chain
    temps = max(c.fwd_tmp + c.bwd_tmp)
    return 2 * sum(c.in_size) + sum(c.saved_size) + temps + 2 * sum(problem.weight_size)


def compute_sequence(problem: OffloadProblem, budget: int, compute) -> tuple[tuple, int | None]:
    """(chain ops, least budget of this choice or None when min_budget decides)."""
    from solvers.chain.rotor import min_memory, rotor
    from solvers.chain.store_all import store_all_ops

    chain = problem.chain
    if isinstance(compute, str):
        if compute == "store_all":
            return store_all_ops(chain), None
        if compute == "rotor":
            reserve = 2 * max(problem.weight_size)
            least = min_memory(chain, tight=True) + reserve
            if budget < least:
                raise Infeasible("weight_offload", budget, least, "rotor compute sequence")
            return rotor(chain, budget - reserve, model="tight").ops, least
        raise ValueError(f"compute = {compute!r}: expected 'store_all', 'rotor' or chain ops")
    ops = compute.ops if isinstance(compute, Schedule) else tuple(compute)
    return ops, None


@register(
    "weight_offload",
    problem=OffloadProblem,
    exact=False,
    description="weights on the host, prefetched ahead of their stage (MILP small, greedy large)",
)
def weight_offload(
    problem: OffloadProblem,
    budget: int,
    *,
    algorithm: str = "auto",
    compute="store_all",
    milp_ops: int = 13,
    time_limit: float | None = None,
) -> OffloadSchedule:
    """Weight prefetch/evict schedule (module doc) under ``budget`` device bytes."""
    if problem.weight_size is None:
        raise InvalidProblem("weight_offload needs OffloadProblem(..., weight_size=...)")
    if algorithm not in ("auto", "milp", "greedy"):
        raise ValueError(f"algorithm = {algorithm!r}: expected 'auto', 'milp' or 'greedy'")
    budget = min(check_budget(problem, budget), _everything(problem))
    host = problem.platform.host_memory
    total = 2 * sum(problem.weight_size[: problem.chain.length]) + problem.weight_size[-1]
    if host is not None and total > host:
        raise Infeasible("weight_offload", budget, None, f"host memory {host} < {total} bytes")
    ops, least = compute_sequence(problem, budget, compute)
    inst = instance(problem, ops)
    least = max(least or 0, min_budget(inst))
    if budget < least:
        raise Infeasible("weight_offload", budget, least, "one stage's weights + activations")
    use = algorithm if algorithm != "auto" else ("milp" if inst.n <= milp_ops else "greedy")
    best = greedy(inst, problem, budget)
    exact = False
    if use == "milp":
        found, exact, value = milp(inst, budget, time_limit=time_limit)
        if found is not None and fits(inst, found, budget):

            def span(d: Decision) -> float:
                return simulate_offload(problem, emit(inst, d)[0]).makespan

            if span(found) <= span(best) + 1e-12:
                best = found
            else:  # numerical trouble in the MILP: keep the greedy, say so
                exact = False
        else:
            exact = False
    out = emit(inst, best)[0]
    compute_time = sum(inst.time)
    head = inst.pre[0] if inst.uses and inst.uses[0][0] == 1 else 0.0
    tail = inst.off[-1] if inst.grads and inst.grads[-1][0] == inst.n else 0.0
    meta = {
        "solver": use,
        "exact": bool(exact),
        "compute": compute if isinstance(compute, str) else "given",
        "overlap_model": OVERLAP_MODEL,
        "min_budget": int(least),
        "compute_time": compute_time,
        "lower_bound": compute_time + head + tail,
        "kept": int(sum(best.keep)),
        "prefetches": int(len(best.keep) - sum(best.keep)),
    }
    if use == "milp":
        meta["milp_value"] = value
    meta["stall"] = simulate_offload(problem, out).makespan - compute_time
    return OffloadSchedule(out, meta)

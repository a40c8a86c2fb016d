"""Late residuals of a phased backward (jax_exec/program/phases.py): the saved residuals
that only a later phase reads, and the block chain's figures of the variant that keeps
them in host memory until then, against a computation by hand on the zoo's BERT; and
the variants planned with a host link (docs/auto.md, "Host offload"): on four zoo
families, at a budget below the least remat-only budget and above the least joint one,
the plan keeps residuals in host memory, runs op by op with measured device and host
bytes equal to the prediction after every op, and its compiled step keeps them in
pinned_host memory and gives plain ``nnx.value_and_grad``'s gradients; it is never
predicted slower than the plan without them; and benchmarks/late_residuals.py's least
budgets."""

from __future__ import annotations

import dataclasses
from collections import Counter
from functools import partial

import jax
import pytest
import zoo
from figure_checks import load_script
from flax import nnx
from plain_reference import (
    assert_matches,
    check_plan,
    expected_host,
    host_residuals,
    plain,
    saved_in_host,
)

import jax_exec
import solvers
from jax_exec.execute.interpreter import run_schedule
from jax_exec.execute.loops import scan_runs
from jax_exec.execute.lowering import lower, recorded
from jax_exec.program.build import block_model
from jax_exec.program.flat import aval_bytes
from jax_exec.program.host_variants import with_host_variants
from jax_exec.program.phases import LATE_PHASES
from jax_exec.program.problem import build_problem
from schedir import B, F_all, Loss, Platform
from schedir.blocks.schedule import BlockSchedule
from schedir.blocks.simulate import simulate_blocks
from schedir.offload.ops import Offload, Prefetch, Wait

FAST = Platform.host_offload(1e15)  # the zoo is tiny: a link fast enough for copies to pay


def float_outputs(block, *args):
    """The sum of ``block``'s floating outputs (a block's first output may be an integer
    counter, e.g. an RNG's, which saves nothing under ``jax.vjp``)."""
    outs = jax.tree.leaves(block(*args)[0])
    return sum(o.sum() for o in outs if jax.numpy.issubdtype(o.dtype, jax.numpy.floating))


def _by_hand(pb) -> tuple[int, int]:
    """(bytes, first phase) of the ``new`` arguments phase 0 does not read."""
    reads = [set(phase.ins) for phase in pb.phases]
    late = [pb.flat.in_ids[pos] for pos, (group, _) in enumerate(pb.groups) if group == "new"]
    late = [v for v in dict.fromkeys(late) if v not in reads[0] and any(v in r for r in reads)]
    if not late:
        return 0, len(pb.phases)
    first = min(j for j, r in enumerate(reads) if any(v in r for v in late))
    return sum(aval_bytes(pb.avals[v]) for v in late), first


def test_late_residuals_and_their_figures_by_hand():
    case = zoo.case("bert")
    bm = block_model(case.loss_fn, case.factory(), case.args)
    bm.trace_options()
    seen = 0
    for k in range(bm.length):
        for o in range(len(bm.options[k])):
            pb = bm.phased(k, o)
            host, first = pb.late()
            assert (host, first) == _by_hand(pb)
            assert host <= bm.saved_bytes(k, o)[0]
            temps = tuple(1000 * (j + 1) + 7 for j in range(len(pb.phases)))
            if host == 0:
                assert first == len(pb.phases)
                assert pb.effective(temps, "late") == pb.effective(temps)
                continue
            seen += 1
            assert 1 <= first < len(pb.phases)
            sizes, late = pb.new_bytes(), pb.late_residuals()  # each back before its reader
            assert pb.returns("late") == late and min(late.values()) == first
            back = [sum(sizes[i] for i, phase in late.items() if phase <= j)
                    for j in range(len(pb.phases))]  # fmt: skip
            assert back[-1] == host
            rows = [(live + temp + back[j], rel) for j, (live, temp, rel)
                    in enumerate(zip(pb.live, temps, pb.released, strict=True))]  # fmt: skip
            tmp, release = pb.effective(temps, "late")
            assert tmp == max(need for need, _ in rows) - pb.d_x_bytes
            assert tmp - release == max(need - rel for need, rel in rows) - pb.d_x_bytes
    assert seen  # BERT's backwards have residuals only their second phase reads


def test_variants_and_their_figures():
    case = zoo.case("vae")
    bm = block_model(case.loss_fn, case.factory(), case.args)
    variants = with_host_variants(bm, FAST)
    assert bm.problem == build_problem(bm) and variants.problem != bm.problem  # a copy
    variants.trace_options()  # every option's saved bytes exact (the variants' always are)
    problem = build_problem(variants)
    seen = Counter()
    for k in range(variants.length):
        base = [o for o in variants.options[k] if not o.host]
        assert base == list(bm.options[k])  # the options, then their variants
        for o, option in enumerate(variants.options[k]):
            held = variants.host_residuals(k, o)
            if not option.host:
                assert not held
                continue
            seen[option.host] += 1
            b = base.index(option.on_device())
            pb = variants.phased(k, o)
            assert len(pb.phases) <= LATE_PHASES
            back = variants.host_returns(k, o)
            if option.host == "late":
                assert pb.late() == (sum(held.values()), min(back.values())) and pb.late()[0] > 0
            else:  # every saved residual, those phase 0 reads among them (else it is late's)
                assert sum(held.values()) == variants.saved_bytes(k, o)[0]
                assert 0 in back.values()
                late = dataclasses.replace(option, host="late")  # its kernels, or its option's
                same = variants.options[k].index(late) if late in variants.options[k] else b
                assert variants.kernel_key("backward", k, o) == variants.kernel_key(
                    "backward", k, same
                )
            assert variants.kernel_key("record", k, o) == variants.kernel_key("record", k, b)
            variant, full = problem.stages[k].options[o], problem.stages[k].options[b]
            host = sum(held.values())
            suffix = "+late" if option.host == "late" else "+host"
            assert (variant.host, variant.name) == (host, full.name + suffix)
            assert variant.saved == full.saved - host and variant.rec_tmp == full.rec_tmp + host
            out = sum(FAST.offload.time(n) for n in held.values())  # each copy charged whole
            back_time = sum(FAST.prefetch.time(n) for n in held.values())
            assert variant.rec_time == pytest.approx(full.rec_time + out, rel=1e-12)
            assert variant.bwd_time == pytest.approx(full.bwd_time + back_time, rel=1e-12)
            assert (variant.copy_out, variant.copy_back) == (out, back_time)  # overlappable
    assert seen["late"] and seen["all"]
    with pytest.raises(ValueError, match="host-memory variant needs a host link"):
        build_problem(dataclasses.replace(variants, host_link=None))


@pytest.mark.slow
def test_late_residuals_lower_the_least_budget_of_bert_only_a_little():
    bench = load_script("benchmarks/late_residuals.py")
    from jax_exec.auto.least import exact_least

    case = zoo.case("bert")
    bm = block_model(case.loss_fn, case.factory(), case.args)
    remat = exact_least(bm, "block_rotor")
    late, used, _ = bench.least_with_variants(bm)
    assert (remat, late) == (47_264, 45_920) and used > 0


@pytest.mark.parametrize("family", ["vae",  # the default run; the others: -m slow
                                    *(pytest.param(f, marks=pytest.mark.slow)
                                      for f in ("bert", "audio", "scan_lm"))])  # fmt: skip
def test_late_residuals_lower_the_least_budget_and_run_exactly(family):
    case = zoo.case(family)
    remat = jax_exec.plan(case.loss_fn, case.factory(), *case.args, budget="100%")
    remat_least = remat.least_budget()
    joint = remat.replan(remat_least, platform=FAST)
    joint_least = joint.least_budget()
    assert joint_least < remat_least
    budget = (joint_least + remat_least) // 2
    with pytest.raises(solvers.Infeasible):
        remat.replan(budget)
    p = joint.replan(budget)
    late = [k for k, o in enumerate(p.options) if p.model.option(k, o).host]
    assert late, f"{family}: no late-residual variant at {budget:,} B"
    assert "residuals in host memory" in p.summary()
    result = check_plan(case, p, plain(case.factory, case.loss_fn, case.args), family)
    trace = simulate_blocks(p.problem, p.schedule)
    assert result.resident_bytes == trace.resident and result.op_peak_bytes == trace.op_peak
    assert result.host_bytes == trace.host_resident and max(trace.host_resident) > 0
    assert host_residuals(case, p) == expected_host(p)
    bm = p.model  # a variant's recording alone: its late residuals in host memory
    for k in late:
        fns, held = bm.functions(k, p.options[k]), bm.host_residuals(k, p.options[k])
        block = recorded(fns, on_host=frozenset(held))
        args = [tuple(jax.numpy.zeros(s.shape, s.dtype) for s in group) for group in bm.specs(k)]
        new = fns.recipe.new
        want = Counter((tuple(int(d) for d in new[i].shape), str(new[i].dtype)) for i in held)
        assert saved_in_host(partial(float_outputs, block), *args) == want
    looped = {k for r in scan_runs(bm, p.schedule).values() for k in r.blocks}
    assert not looped.intersection(late)  # a variant's block is lowered alone, not in a loop
    # never predicted slower than without the variants, where both plan
    for b in (remat_least, (remat_least + remat.store_all_peak) // 2):
        assert joint.replan(b).overhead <= remat.replan(b).overhead + 1e-12


def test_a_late_recording_offloaded_whole_keeps_its_late_part_in_host_memory():
    """A whole-buffer offload of a variant's recording (as rotor_offload may plan) moves
    its device part; its late residuals stay in host memory until their phase."""
    case = zoo.case("vae")
    bm = with_host_variants(block_model(case.loss_fn, case.factory(), case.args), FAST)
    late = next(o for o, option in enumerate(bm.options[0]) if option.host == "late")
    ops = (F_all(0), F_all(1), Offload("abar[1]"), Wait("abar[1]"), F_all(2), Loss(), B(2),
           Prefetch("abar[1]"), Wait("abar[1]"), B(1), B(0))  # fmt: skip
    schedule = BlockSchedule(ops, {}, (late, 0, 0))
    bm.compile(bm.every_kernel(schedule.options))
    bm.problem = build_problem(bm)
    _, params, rest = nnx.split(case.factory(), nnx.Param, ...)
    result = run_schedule(bm, schedule, params, rest, case.args)
    trace = simulate_blocks(bm.problem, schedule)
    assert result.resident_bytes == trace.resident and result.op_peak_bytes == trace.op_peak
    assert result.host_bytes == trace.host_resident
    host = bm.problem.stages[0].options[late].host
    assert trace.host_resident[0] == host < trace.host_resident[3]  # then the whole buffer
    assert trace.host_resident[8] == host  # prefetched: the device part only
    reference = plain(case.factory, case.loss_fn, case.args)
    assert_matches(result.loss, result.grads, None, reference, "op by op")
    step = jax.jit(jax.value_and_grad(lower(bm, schedule), has_aux=True))
    (loss, _), grads = step(params, rest, case.args)
    assert_matches(loss, grads, None, reference, "compiled")

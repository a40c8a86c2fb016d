"""Late residuals of a phased backward (jax_exec/program/phases.py): the saved residuals
that only a later phase reads, and the block chain's figures of the variant that keeps
them in host memory until then, against a computation by hand on the zoo's BERT; and
benchmarks/late_residuals.py's least budgets (docs/auto.md, "Host offload")."""

from __future__ import annotations

import dataclasses

import pytest
import zoo
from figure_checks import load_script

from jax_exec.program.model import block_model
from jax_exec.program.trace import aval_bytes


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
                assert pb.effective(temps, late=True) == pb.effective(temps)
                continue
            seen += 1
            assert 1 <= first < len(pb.phases)
            rows = [(live + temp + host * (j >= first), rel) for j, (live, temp, rel)
                    in enumerate(zip(pb.live, temps, pb.released, strict=True))]  # fmt: skip
            tmp, release = pb.effective(temps, late=True)
            assert tmp == max(need for need, _ in rows) - pb.d_x_bytes
            assert tmp - release == max(need - rel for need, rel in rows) - pb.d_x_bytes
    assert seen  # BERT's backwards have residuals only their second phase reads


def test_a_late_variant_before_its_phases_are_traced_is_refused():
    case = zoo.case("mixer")
    bm = dataclasses.replace(block_model(case.loss_fn, case.factory(), case.args), _phases={})
    with pytest.raises(ValueError, match="late-residual variant"):
        bm.backward_bytes(0, 0, late=True)


@pytest.mark.slow
def test_late_residuals_lower_the_least_budget_of_bert_only_a_little():
    bench = load_script("benchmarks/late_residuals.py")
    from jax_exec.auto.exact import exact_least

    case = zoo.case("bert")
    bm = block_model(case.loss_fn, case.factory(), case.args)
    remat = exact_least(bm, "block_rotor")
    late, used, _ = bench.least_with_variants(bm)
    assert (remat, late) == (47_264, 45_920) and used > 0

"""What kind of operation each primitive is, for the planner (docs/auto.md).

Every primitive is *elementwise* or *layout* (cheap: XLA fuses it into its consumers,
so its result is not stored), *heavy* (a matmul, convolution, reduction, gather, random
bits...: its result is materialized), or *opaque* (a higher-order primitive such as
``custom_jvp_call``, ``custom_vjp_call``, ``cond`` or a user's ``jax.checkpoint``: one
heavy node). Collectives are refused (the planner schedules one device's program); a
primitive none of the tables names is charged conservatively, as heavy (or opaque when
it holds sub-jaxprs), with a warning naming it (:func:`category`).
tests/jax_exec/test_primitive_survey.py checks that every primitive ``jax.numpy``,
``jax.nn``, ``jax.lax`` and Flax's layers emit is in a table.
"""

from __future__ import annotations

import warnings

from jax_exec.program.flat import Eqn, sub_jaxprs
from jax_exec.program.flatten import UnsupportedModel

ELEMENTWISE = frozenset(
    """abs acos acosh add add_any and asin asinh atan atan2 atanh bessel_i0e bessel_i1e
    bitcast_convert_type cbrt ceil clamp clz complex conj convert_element_type copy copy_p
    cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt igamma igammac imag
    integer_pow is_finite le lgamma log log1p logistic lt max min mul ne neg nextafter not
    or polygamma population_count pow real reduce_precision rem round rsqrt select_n
    shift_left shift_right_arithmetic shift_right_logical sign sin sinh sqrt square sub tan
    tanh xor zeta stop_gradient name eq_to le_to lt_to mulhi igamma_grad_a random_gamma_grad
    regularized_incomplete_beta platform_index""".split()
)
EXPENSIVE = frozenset(
    """exp exp2 expm1 log log1p logistic tanh sin cos tan atan2 asin acos atan sinh cosh
    asinh acosh atanh pow sqrt rsqrt cbrt erf erfc erf_inv lgamma digamma igamma igammac
    igamma_grad_a random_gamma_grad regularized_incomplete_beta polygamma zeta bessel_i0e
    bessel_i1e""".split()
)
LAYOUT = frozenset(
    """broadcast_in_dim reshape squeeze expand_dims transpose iota rev slice dynamic_slice
    pad concatenate split sharding_constraint random_wrap random_unwrap device_put
    optimization_barrier iota_2x32_shape tile stack unstack random_clone reshard
    mesh_cast""".split()
)
HEAVY = frozenset(
    """dot_general conv_general_dilated reduce_sum reduce_max reduce_min reduce_prod
    reduce_and reduce_or reduce_xor reduce argmax argmin cumsum cumprod cummax cummin
    cumlogsumexp reduce_window reduce_window_sum reduce_window_max reduce_window_min
    select_and_scatter_add select_and_scatter select_and_gather_add gather scatter
    scatter-add scatter-mul scatter-min scatter-max dynamic_update_slice sort top_k
    approx_top_k fft random_bits random_fold_in random_split random_seed threefry2x32
    rng_bit_generator rng_uniform random_gamma cholesky eigh eig lu qr svd
    triangular_solve tridiagonal_solve householder_product schur hessenberg tridiagonal
    custom_linear_solve scaled_dot ragged_dot ragged_dot_general symmetric_product""".split()
) | frozenset(  # jax.experimental.sparse: lowered to gathers, scatters and dots
    """bcoo_dot_general bcoo_dot_general_sampled bcoo_extract bcoo_fromdense
    bcoo_sort_indices bcoo_spdot_general bcoo_sum_duplicates bcoo_todense bcoo_transpose
    bcsr_dot_general bcsr_extract bcsr_fromdense bcsr_todense coo_fromdense coo_matmat
    coo_matvec coo_spmm coo_spmv coo_todense csr_fromdense csr_matmat csr_matvec
    csr_todense""".split()
)
OPAQUE = frozenset("custom_jvp_call custom_vjp_call cond while checkpoint remat2 scan".split())
COLLECTIVE = frozenset(
    """psum pmax pmin ppermute all_gather all_to_all ragged_all_to_all axis_index
    psum_scatter reduce_scatter pbroadcast""".split()
)
MULTI_DEVICE = frozenset({"shard_map", "xla_pmap"})  # regions holding collectives
MATERIALIZE_OPERANDS = frozenset({"dot_general", "conv_general_dilated"})


def classified(name: str) -> str | None:
    """The category of a primitive the planner knows, by name; None for others."""
    for cat, names in (("elementwise", ELEMENTWISE), ("layout", LAYOUT), ("heavy", HEAVY),
                       ("opaque", OPAQUE)):  # fmt: skip
        if name in names:
            return cat
    return None


_WARNED: set[str] = set()


def category(eqn: Eqn) -> str:
    """``"elementwise"``, ``"layout"``, ``"heavy"`` or ``"opaque"``. Collectives are
    refused; a primitive the planner does not know is charged conservatively, as heavy
    (XLA stores its result: a save option may keep it, and the figures count it), with a
    warning naming it (higher-order ones as opaque: differentiated by JAX as a whole)."""
    name = eqn.name
    found = classified(name)
    if found is not None:
        return found
    if name in COLLECTIVE or name in MULTI_DEVICE:
        raise UnsupportedModel(
            f"collective or multi-device operation {name} at {eqn.source}: the planner "
            f"schedules one device's program (plan the per-device function, outside "
            f"shard_map / pmap)"
        )
    if name not in _WARNED:
        _WARNED.add(name)
        warnings.warn(
            f"operation {name} at {eqn.source} is not known to the planner: its result is "
            f"charged as stored by XLA (conservative for memory); the plan stays exact for "
            f"the op-by-op runtime",
            stacklevel=3,
        )
    return "opaque" if sub_jaxprs(eqn.params) else "heavy"

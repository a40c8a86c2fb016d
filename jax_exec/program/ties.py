"""Values no save option keeps apart from their operand (docs/auto.md, "Options").

A result that copies elements of its operand exactly (a maximum, a sorted, top-k or
gathered value) equals them bit for bit, so comparing the two is a tie by design. A
backward that read such a result saved by its recording but recomputed the operand, in
another kernel whose fusion rounds it otherwise, breaks the tie. JAX's JVPs of the
:data:`CHOOSERS` compare the two (``max``/``min``: ``_balanced_eq``;
``reduce_max``/``reduce_min``: ``_reduce_chooser_jvp_rule``; ``scatter-max``/``min``:
``_scatter_extremal_jvp``; ``cummax``/``cummin`` through ``max``/``min``), and so does a
model's own ``x == jnp.max(x)`` or ``logits >= top_k(logits)[0][..., -1:]``: a zero or
NaN gradient, or a mask other than the forward's. Found by random model 3620 (a
``jnp.max`` after a residual add: NaN gradients op by op).

So such a result, and its exact copies on the way to the comparison, is *tied*: no
option saves it (:func:`jax_exec.program.kernels.layout` names none), and recomputed from
the operand the backward holds, it matches that again (a maximum is exact). A result
only shifted (a softmax's ``stop_gradient(max)``) meets no comparison and may be saved.
"""

from __future__ import annotations

from jax_exec.program.analysis import Analysis
from jax_exec.program.flat import Program
from jax_exec.program.primitives import LAYOUT, OPAQUE

CHOOSERS = frozenset("max min reduce_max reduce_min cummax cummin scatter-max scatter-min".split())
SELECTORS = CHOOSERS | {"sort", "top_k", "approx_top_k", "gather"}
COMPARISONS = frozenset("eq ne lt le gt ge".split())
# Operations whose result holds its operand's values unchanged (followed to a comparison)
COPIES = LAYOUT | {"stop_gradient", "copy", "copy_p", "convert_element_type"}


def tied_values(program: Program, analysis: Analysis, vids: set[int]) -> frozenset[int]:
    """The tied values among ``vids`` (module docstring): a :data:`SELECTORS` result
    that the step compares with its operand (a differentiated result of the
    :data:`CHOOSERS`, whose JVP compares; or one a comparison reads, through
    :data:`COPIES`; an opaque reader, such as a ``custom_jvp`` call, is taken to
    compare), and the copies of it on the way."""
    tied: set[int] = set()
    for vid in vids:
        name = program.eqns[program.producer[vid]].name  # vids: values the program makes
        if name in SELECTORS:
            tied |= _copies_compared(program, analysis, vid, name in CHOOSERS)
    return frozenset(tied & vids)


def _copies_compared(program: Program, analysis: Analysis, vid: int, chooser: bool) -> set[int]:
    """``vid`` and its copies if a comparison reads one of them (or ``vid`` is a
    differentiated chooser's result); else none."""
    copies, todo = {vid}, [vid]
    compared = chooser and vid in analysis.active
    while todo:
        for i in analysis.users.get(todo.pop(), ()):
            reader = program.eqns[i]
            if reader.name in COMPARISONS or reader.name in OPAQUE:
                compared = True
            elif reader.name in COPIES:
                todo.extend(v for v in reader.outs if v not in copies)
                copies.update(reader.outs)
    return copies if compared else set()

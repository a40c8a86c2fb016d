"""Step programs: a traced training step cut into a chain of blocks, with the compiled
kernels of every block's forward, recording (per save option), phased backward and loss,
and the exact-bytes problem they define (:class:`~jax_exec.program.model.BlockModel`,
docs/auto.md). The execution core (:mod:`jax_exec.execute`) runs any schedule of one;
the planner (:mod:`jax_exec.auto`) chooses the schedule.

- :mod:`~jax_exec.program.trace`: ``loss_fn(model, *args)`` as a flat program
  (:mod:`~jax_exec.program.flat`: its equations and values;
  :mod:`~jax_exec.program.flatten`: a jaxpr flattened into them);
- :mod:`~jax_exec.program.analysis`: per-equation costs (the roofline
  :class:`~jax_exec.program.analysis.CostModel`) and residuals;
- :mod:`~jax_exec.program.blocks`: cuts and blocks;
- :mod:`~jax_exec.program.options`: save options of a block;
- :mod:`~jax_exec.program.kernels`, :mod:`~jax_exec.program.phases`: a block's
  functions and its backward as phases;
- :mod:`~jax_exec.program.compiled`: compiled kernels, how they are compiled, and the
  process-wide caches that keep them;
- :mod:`~jax_exec.program.model`: the :class:`BlockModel`;
- :mod:`~jax_exec.program.problem`: the block chain problem it defines;
- :mod:`~jax_exec.program.host_variants`: its options' host-memory variants.
"""

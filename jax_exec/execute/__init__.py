"""The one execution core (docs/jax_exec.md, "The execution core").

Every front end (a traced Flax NNX model, a hand-split stage list, a DAG of modules)
builds a step program: a :class:`jax_exec.program.model.BlockModel`, whose blocks hold the
compiled kernels of their forward, recording (per save option), phased backward and
loss, and whose problem (:class:`schedir.blocks.BlockChain`) gives the exact bytes of
every buffer (:mod:`jax_exec.execute.program` says what the core reads of it). The core
executes any schedule of it:

- :func:`run_schedule`: a block-chain schedule op by op, with measured memory
  (:mod:`jax_exec.execute.interpreter`); :func:`run_graph_schedule`: a graph schedule
  of its block graph (:mod:`jax_exec.execute.graph`);
- :func:`lower`: the compiled path, one differentiable function
  (:mod:`jax_exec.execute.lowering`);
- one :class:`RunResult`, one :class:`~jax_exec.execute.buffers.Buffers`.
"""

from jax_exec.execute.graph import run_graph_schedule
from jax_exec.execute.interpreter import run_schedule
from jax_exec.execute.lowering import lower
from jax_exec.execute.result import RunResult

__all__ = ["RunResult", "lower", "run_graph_schedule", "run_schedule"]

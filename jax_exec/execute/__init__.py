"""The one execution core (docs/jax_exec.md, "The execution core").

The traced Flax NNX model and the hand-split stage list build a step program: a
:class:`jax_exec.program.model.BlockModel`, whose blocks hold the compiled kernels of
their forward, recording (per save option), phased backward and loss, and whose problem
(:class:`schedir.blocks.BlockChain`) gives the exact bytes of every buffer. A
hand-written DAG of modules (:mod:`jax_exec.graph`) is a graph of per-module kernels.
The core executes any schedule of them:

- :func:`run_schedule`: a block-chain schedule op by op, with measured memory
  (:mod:`jax_exec.execute.interpreter`);
- :func:`run_graph_ops`: a graph schedule op by op, with measured memory, for any
  :class:`~jax_exec.execute.graph.GraphProgram` (:mod:`jax_exec.execute.graph`): the
  block graph of a step program (:func:`run_graph_schedule`) or a DAG of modules
  (:func:`jax_exec.graph.run_graph`);
- :func:`lower`: the compiled path, one differentiable function
  (:mod:`jax_exec.execute.lowering`);
- one :class:`RunResult`, one :class:`~jax_exec.execute.buffers.Buffers`.
"""

from jax_exec.execute.graph import run_graph_ops, run_graph_schedule
from jax_exec.execute.interpreter import run_schedule
from jax_exec.execute.lowering import lower
from jax_exec.execute.result import RunResult

__all__ = ["RunResult", "lower", "run_graph_ops", "run_graph_schedule", "run_schedule"]

"""The ranks' graph as GPU ranks compute it fastest (the pipeline's seventh
stage; CPU ranks keep the graph as it is).

The same values in forms that XLA fuses into fewer passes over the rows:
products with a few features written out (``_products``), softplus with one
exponential (``_softplus``), and a batched graph as one kernel over the rows
(``_kernel``) where that kernel compiles on this process's GPU.  Each is our
own Op or PyTensor's, so the graph still pickles to the ranks.
"""

import dataclasses

from .._common.env import env_flag
from .._session import runtime
from ._kernel import KERNEL_ENV, kernel_compiles, rows_kernel
from ._products import feature_sums
from ._softplus import with_one_exp_softplus

__all__ = ["for_gpu_ranks"]


def for_gpu_ranks(graph):
    """``graph`` (a ``RanksGraph``) in its GPU forms on GPU ranks; as it is on
    CPU ranks."""
    if runtime.require().device.name != "gpu":
        return graph
    outputs = _gpu_forms(graph.outputs)
    if graph.batched and env_flag(KERNEL_ENV, True):
        # One kernel evaluates the graph of one point, in the same forms, at
        # each point; it replaces the batched graph only where it compiles here.
        single = with_one_exp_softplus(graph.single)
        kernel = rows_kernel(graph.params, graph.data, graph.rows, single, graph.inputs, outputs)
        outputs = kernel if kernel_compiles(kernel[0].owner.op) else outputs
    return dataclasses.replace(graph, outputs=outputs)


def _gpu_forms(outputs):
    """``outputs`` as GPU ranks compute them fastest: products with a few
    features written out (``_products``), softplus with one exponential
    (``_softplus``).  The same values; XLA fuses these forms into fewer passes
    over the rows."""
    return with_one_exp_softplus(feature_sums(outputs))

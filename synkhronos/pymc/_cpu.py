"""The ranks' graph of one point as PyTensor's own linkers (Numba, C) compute
it fastest on CPU ranks.

A GLM's rows meet its coefficients in two matrix products: ``X @ b`` (the linear
predictor, ``n x d`` against ``d``) and, for the gradient, ``X^T @ r`` (the
rows against one value per row).  With a handful of features PyTensor computes
each as a BLAS product of its own, which writes an array of ``n`` values that
the elementwise loop then reads, or reads one that the loop wrote: three passes
over the rows where one would do.  ``products_as_row_sums`` writes them as
elementwise work that PyTensor's fusion joins with that loop:

- ``X @ B`` with ``d`` (the inner length) of at most ``FEW`` as
  ``sum_j X[:, j] B[j]``;
- ``A @ R`` with few rows of ``A`` and few columns of ``R`` (``X^T @ r``) as
  one sum over the rows per entry, each a reduction of the same loop.

The same values, summed in another order (as BLAS may anyway).  bambi's normal
GLMM, one rank's graph over 200,000 rows (Numba, one core of a 2-core VM): 0.49
ms a call against 0.75 ms, where PyMC's own function takes 0.75 ms.  JAX's and
the GPU ranks' forms are ``_gpu``'s.
"""

import dataclasses
import functools
import operator

import pytensor.tensor as pt
from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.math import Dot

from .._graph.editing import rewritten
from .._graph.function_core import links_with_jax
from .._session import runtime

__all__ = ["FEW", "for_cpu_ranks", "for_own_linker", "products_as_row_sums"]

FEW = 16  # the most features written out, and the most sums a product becomes


def _few(n):
    return n is not None and 0 < n <= FEW


@node_rewriter([Dot, Blockwise])
def products_as_row_sums(fgraph, node):
    """``a @ b`` (``pt.dot``, or ``@`` of matrices, a Blockwise of nothing to
    map over) as elementwise products summed over a small inner length, or as
    one sum over the (long) inner length per entry of a small result; else None."""
    if isinstance(node.op, Blockwise) and not isinstance(node.op.core_op, Dot):
        return None
    a, b = node.inputs
    if a.ndim != 2 or b.ndim != 2:
        return None
    inner = a.type.shape[1] if a.type.shape[1] is not None else b.type.shape[0]
    rows, cols = a.type.shape[0], b.type.shape[1]
    if _few(inner):
        out = functools.reduce(operator.add, [a[:, j, None] * b[None, j, :] for j in range(inner)])
    elif _few(rows) and _few(cols) and rows * cols <= FEW:
        out = pt.stack([pt.stack([pt.sum(a[i] * b[:, j]) for j in range(cols)]) for i in range(rows)])
    else:
        return None
    if out.type.broadcastable != node.outputs[0].type.broadcastable:
        return None
    return [pt.cast(out, node.outputs[0].dtype)]


def for_own_linker(graph):
    """``graph`` (a one-point ``RanksGraph``) with its products written as
    ``products_as_row_sums`` writes them, in a copy (the graph's own outputs
    are left as they are)."""
    from pytensor.graph.replace import clone_replace

    outputs = rewritten(list(clone_replace(graph.outputs, {})), products_as_row_sums)
    return dataclasses.replace(graph, outputs=outputs)


def for_cpu_ranks(graph):
    """``graph`` as ``for_own_linker`` makes it where the CPU ranks compile it
    with PyTensor's own linker from the start (a mode set in PyTensor's flags);
    else as it is (JAX, GPU ranks, and graphs of several points; the linker
    ``_linker`` times gets ``for_own_linker``'s form there)."""
    device = runtime.require().device
    if device.name == "gpu" or device.jax_default or graph.batched or links_with_jax(graph.mode):
        return graph
    return for_own_linker(graph)

"""Products with a few features, as the GPU ranks compute them.

In a batched GLM the ranks compute ``B @ X^T`` (K points' coefficients against
the rows, K x n) and, for the gradient, ``R @ X`` (a value per point and row
against the rows, K x d), where ``d``, the features, is a handful.  XLA on a
GPU compiles both as matrix products of one small side, which it does poorly
(two points cost as much as two calls of one).  ``feature_sums`` writes each as
``d`` elementwise products: ``B @ X^T`` as ``sum_j B[:, j] X[:, j]^T``, fused
with what reads it, and ``R @ X`` as one sum over the rows per feature, which
XLA computes in one pass.  Where the gradient has it as ``X^T @ R^T``, the sums
run along ``R``'s own axis of rows, so that XLA reads ``R`` as it was written
rather than transposed.  The same values, summed in another order (as a
compiler may anyway).  See the docs page "PyMC" for what it measured.
"""

import functools
import operator

import pytensor.tensor as pt
from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.tensor.math import Dot

from ._graphs import rewritten

__all__ = ["FEW", "feature_sums", "few_feature_products"]

FEW = 16  # the most features (the small side's static length) written out


def _few(n):
    return n is not None and n <= FEW


@node_rewriter([Dot])
def few_feature_products(fgraph, node):
    """A matrix product ``a @ b`` with a small static side as elementwise
    products and sums: summed over ``d`` (the inner length) if that is small,
    else one sum per column of ``b`` (or row of ``a``) if those are few."""
    a, b = node.inputs
    if a.ndim != 2 or b.ndim != 2:
        return None
    inner = a.type.shape[1] if a.type.shape[1] is not None else b.type.shape[0]
    if _few(inner) and inner > 0:
        terms = [a[:, j, None] * b[None, j, :] for j in range(inner)]
        out = functools.reduce(operator.add, terms)
    elif _few(b.type.shape[1]):
        out = pt.stack([pt.sum(a * b[:, j][None, :], axis=1) for j in range(b.type.shape[1])], axis=1)
    elif _few(a.type.shape[0]):
        if _transposed(b):
            out = pt.stack([pt.sum(a[i][None, :] * b.T, axis=1) for i in range(a.type.shape[0])], axis=0)
        else:
            out = pt.stack([pt.sum(a[i][:, None] * b, axis=0) for i in range(a.type.shape[0])], axis=0)
    else:
        return None
    if out.type.broadcastable != node.outputs[0].type.broadcastable:
        return None
    return [pt.cast(out, node.outputs[0].dtype)]


def _transposed(var):
    """Whether matrix ``var`` is its producer's value transposed, through any
    chain of dimshuffles (the batched graph's hold axes of one point too)."""
    from pytensor.tensor.elemwise import DimShuffle

    axes = [0, 1]
    while var.owner is not None and isinstance(var.owner.op, DimShuffle):
        order = var.owner.op.new_order
        if any(order[k] == "x" for k in axes):
            return False
        axes = [order[k] for k in axes]
        var = var.owner.inputs[0]
    return axes[0] > axes[1]


def feature_sums(outputs):
    """``outputs`` with every ``few_feature_products`` rewritten."""
    return rewritten(outputs, few_feature_products)

"""The ranks' graph as GPU ranks compute it fastest (the pipeline's seventh
stage; CPU ranks keep the graph as it is).

The same values in forms that XLA fuses into fewer passes over the rows, each
our own Op or PyTensor's, so the graph still pickles to the ranks:

- Products with a few features.  In a batched GLM the ranks compute ``B @ X^T``
  (K points' coefficients against the rows, K x n) and, for the gradient,
  ``R @ X`` (a value per point and row against the rows, K x d), where ``d``,
  the features, is a handful.  XLA on a GPU compiles both as matrix products of
  one small side, which it does poorly (two points cost as much as two calls of
  one).  ``few_feature_products`` writes each as ``d`` elementwise products: ``B @ X^T``
  as ``sum_j B[:, j] X[:, j]^T``, fused with what reads it, and ``R @ X`` as one
  sum over the rows per feature, which XLA computes in one pass.  Where the
  gradient has it as ``X^T @ R^T``, the sums run along ``R``'s own axis of rows,
  so that XLA reads ``R`` as it was written rather than transposed.  The same
  values, summed in another order (as a compiler may anyway).
- Softplus with one exponential.  PyTensor's JAX backend computes
  ``softplus(x)`` piecewise as PyTensor's C code does (``exp(x)`` below -37,
  ``log1p(exp(x))`` below 18, ``x + exp(-x)`` below 33.3), so one softplus holds
  three exponentials of the same array, each read several times.  XLA on a GPU
  does not repeat an exponential in every kernel that reads it: it writes them
  to memory, K x n values each, and reads them back (a fifth to a quarter of a
  batched logistic regression's pass, measured).  ``OneExpSoftplus`` is
  PyTensor's ``Softplus`` whose JAX form is ``jax.nn.softplus`` (``max(x, 0) +
  log1p(exp(-|x|))``: one exponential, read once), which XLA fuses with what
  reads it.  Everywhere else (Python and C linkers, and JAX wherever the form
  is not registered) it is PyTensor's softplus.  PyMC's log-density of a
  Bernoulli holds ``log(sigmoid(x))`` and ``log1p(-sigmoid(x))``, which the
  ranks' own compiling (PyTensor's stabilize) would make plain softplus after
  this rewrite: ``ONE_EXP_SOFTPLUS`` makes them softplus first, by the same
  rules.
- A batched graph as one kernel over the rows (``_kernel``), where that kernel
  compiles on this process's GPU.

The docs page "PyMC" says what each measured.
"""

import dataclasses
import functools
import operator
import threading

import pytensor.tensor as pt
from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.scalar.basic import upgrade_to_float
from pytensor.scalar.math import Softplus
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.rewriting import math as _math_rules

from .._common.env import env_flag
from .._graph.editing import rewritten_in_turn
from .._session import runtime
from ._gradient import log1p_minus_sigmoid
from ._kernel import KERNEL_ENV, kernel_compiles, rows_kernel

__all__ = ["FEW", "GPU_FORMS", "ONE_EXP_SOFTPLUS", "OneExpSoftplus", "few_feature_products", "for_gpu_ranks",
           "one_exp_softplus", "softplus_with_one_exp"]

FEW = 16  # the most features (the small side's static length) written out


def for_gpu_ranks(graph, shapes=None):
    """``graph`` (a ``RanksGraph``) in its GPU forms (``GPU_FORMS``) on GPU
    ranks; as it is on CPU ranks.  ``shapes``: one point's shape of each
    parameter and datum (at the model's initial point), where the kernel
    over the rows is tried on them."""
    if runtime.require().device.name != "gpu":
        return graph
    outputs = rewritten_in_turn(graph.outputs, *GPU_FORMS)
    if graph.batched and env_flag(KERNEL_ENV, True):
        # One kernel evaluates the graph of one point at each point, its
        # softplus in the same form (products it sums row by row itself); it
        # replaces the batched graph only where it compiles here.
        single = rewritten_in_turn(graph.single, *ONE_EXP_SOFTPLUS)
        kernel = rows_kernel(graph.params, graph.data, graph.rows, single, graph.inputs, outputs, shapes)
        outputs = kernel if kernel_compiles(kernel[0].owner.op) else outputs
    return dataclasses.replace(graph, outputs=outputs)


# ---------------------------------------------------------------------- products
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


# ---------------------------------------------------------------------- softplus
_registered = threading.Event()


def _register_jax():
    """Give ``OneExpSoftplus`` its JAX form (once per process)."""
    if _registered.is_set():
        return
    try:
        import jax
        from pytensor.link.jax.dispatch import jax_funcify
    except ImportError:  # no JAX: PyTensor's softplus everywhere
        return

    @jax_funcify.register(OneExpSoftplus)
    def _one_exp(op, **kwargs):
        return jax.nn.softplus

    _registered.set()


class OneExpSoftplus(Softplus):
    """PyTensor's ``Softplus``, computed under JAX as ``jax.nn.softplus``."""

    def __setstate__(self, state):
        # A rank unpickling the graph compiles it next: register the JAX form first.
        self.__dict__.update(state)
        _register_jax()


one_exp_softplus = OneExpSoftplus(upgrade_to_float, name="one_exp_softplus")


@node_rewriter([Elemwise])
def softplus_with_one_exp(fgraph, node):
    """``softplus(x)`` as ``OneExpSoftplus``'s (its JAX form registered first)."""
    if type(node.op.scalar_op) is not Softplus:
        return None
    _register_jax()
    return [Elemwise(one_exp_softplus)(*node.inputs)]


# Every softplus, and every log of a sigmoid that PyTensor's stabilize makes
# one, as ``OneExpSoftplus``'s.  One rule a pass: a pass tries the rules
# tracking a sigmoid once per sigmoid, and a Bernoulli's sigmoid has two of
# these clients.
ONE_EXP_SOFTPLUS = (_math_rules.logsigm_to_softplus, _math_rules.log1msigm_to_softplus,
                    _math_rules.log1p_neg_sigmoid, log1p_minus_sigmoid, softplus_with_one_exp)

# The GPU forms, a rule a pass: products with a few features written out, then
# softplus with one exponential.
GPU_FORMS = (few_feature_products,) + ONE_EXP_SOFTPLUS

"""Softplus as a GPU rank compiles it best.

PyTensor's JAX backend computes ``softplus(x)`` piecewise as PyTensor's C code
does (``exp(x)`` below -37, ``log1p(exp(x))`` below 18, ``x + exp(-x)`` below
33.3), so one softplus holds three exponentials of the same array, each read
several times.  XLA on a GPU does not repeat an exponential in every kernel
that reads it: it writes them to memory, K x n values each, and reads them
back (a fifth to a quarter of a batched logistic regression's pass, measured).
``OneExpSoftplus`` is PyTensor's ``Softplus`` whose JAX form is
``jax.nn.softplus`` (``max(x, 0) + log1p(exp(-|x|))``: one exponential, read
once), which XLA fuses with what reads it.  Everywhere else (Python and C
linkers, and JAX wherever the form is not registered) it is PyTensor's
softplus.

PyMC's log-density of a Bernoulli holds ``log(sigmoid(x))`` and
``log1p(-sigmoid(x))``, which the ranks' own compiling (PyTensor's stabilize)
would make plain softplus after this rewrite: ``with_one_exp_softplus`` makes
them softplus first, by the same rules.  The docs page "PyMC" says what it
measured.
"""

import threading

from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.scalar.basic import upgrade_to_float
from pytensor.scalar.math import Softplus
from pytensor.tensor.elemwise import Elemwise

from ._graphs import rewritten
from ._stable import log1p_minus_sigmoid

__all__ = ["OneExpSoftplus", "one_exp_softplus", "with_one_exp_softplus"]

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
    """``softplus(x)`` as ``OneExpSoftplus``'s."""
    if type(node.op.scalar_op) is not Softplus:
        return None
    return [Elemwise(one_exp_softplus)(*node.inputs)]


def with_one_exp_softplus(outputs):
    """``outputs`` (rewritten in place) with every softplus, and every log of a
    sigmoid that PyTensor's stabilize makes one, ``OneExpSoftplus``'s."""
    from pytensor.tensor.rewriting import math as rules

    _register_jax()
    # One rule a pass: a pass tries the rules tracking a sigmoid once per
    # sigmoid, and a Bernoulli's sigmoid has two of these clients.
    for rule in (rules.logsigm_to_softplus, rules.log1msigm_to_softplus, rules.log1p_neg_sigmoid,
                 log1p_minus_sigmoid, softplus_with_one_exp):
        outputs = rewritten(outputs, rule)
    return outputs

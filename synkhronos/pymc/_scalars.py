"""Scalar Ops as the rows kernel computes them (``_blocks``): on scalars, or
on vectors of a block's rows, with JAX.

A Composite's inner graph is walked here; softplus and sigmoid are computed
from ``exp(-|x|)``, which the kernel's compiler then computes once for every
one of them of ``x`` or ``-x`` (a Bernoulli's four become one); anything else
is PyTensor's JAX form, with Python operators where it has them (no stacking of
a variadic sum, which Triton does not compile).
"""

import functools

import numpy as np
from pytensor.graph.basic import Constant
from pytensor.graph.fg import FunctionGraph
from pytensor.scalar import basic as ps

__all__ = ["Unsupported", "jnp_module", "scalar_function"]


class Unsupported(Exception):
    """The graph holds something a block-by-block evaluation does not handle."""


def jnp_module():
    import jax.numpy as jnp

    return jnp


@functools.cache
def scalar_function(scalar_op, dtypes):
    """A JAX function of scalars (or vectors of rows) of ``dtypes`` for
    ``scalar_op`` (see the module docstring)."""
    from pytensor.link.jax.dispatch import jax_funcify
    from pytensor.scalar.math import Sigmoid, Softplus

    if isinstance(scalar_op, ps.Composite):
        return _composite_function(scalar_op)
    if isinstance(scalar_op, Softplus):
        return _softplus
    if isinstance(scalar_op, Sigmoid):
        return _sigmoid
    ins = [ps.get_scalar_type(d)() for d in dtypes]
    inner = jax_funcify(FunctionGraph(ins, scalar_op.make_node(*ins).outputs, clone=False))
    return lambda *a: (lambda r: r[0] if len(r) == 1 else r)(inner(*a))


def _composite_function(composite):
    fg = composite.fgraph
    steps = [(node, scalar_function(node.op, tuple(i.dtype for i in node.inputs))) for node in fg.toposort()]

    def run(*args):
        env = dict(zip(fg.inputs, args))
        for node, fn in steps:
            res = fn(*[env[i] if i in env else _scalar_constant(i) for i in node.inputs])
            env.update(zip(node.outputs, res if len(node.outputs) > 1 else (res,)))
        outs = tuple(env[o] if o in env else _scalar_constant(o) for o in fg.outputs)
        return outs[0] if len(outs) == 1 else outs

    return run


def _scalar_constant(var):
    if not isinstance(var, Constant):
        raise Unsupported("scalar input %s not given" % var)
    return np.asarray(var.data, dtype=var.dtype)[()]


def _exp_neg_abs(x):
    jnp = jnp_module()
    return jnp.exp(-jnp.abs(x))


def _softplus(x):
    jnp = jnp_module()
    return jnp.maximum(x, 0) + jnp.log1p(_exp_neg_abs(x))


def _sigmoid(x):
    jnp = jnp_module()
    e = _exp_neg_abs(x)
    return jnp.where(x >= 0, 1, e) * (1 / (1 + e))

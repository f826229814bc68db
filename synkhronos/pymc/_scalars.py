"""Scalar Ops as the rows kernel computes them (``_blocks``): on scalars, or
on vectors of a block's rows, with JAX.

A Composite's inner graph is walked here; softplus and sigmoid are computed
from ``exp(-|x|)``: within ``shared_exponentials`` (one walk of a graph), every
softplus and sigmoid of a value or of its negation shares one ``exp(-|x|)``,
one ``log1p`` of it and one ``1 / (1 + exp(-|x|))`` (a Bernoulli's two
softplus and two sigmoids: one of each), the same numbers bit for bit, since
``|-x|`` is ``|x|``; left to it, the kernel's compiler computed them apart.
Anything else is PyTensor's JAX form, with Python operators where it has them
(no stacking of a variadic sum, which Triton does not compile).
"""

import contextlib
import functools
import threading

import numpy as np
from pytensor.graph.basic import Constant
from pytensor.graph.fg import FunctionGraph
from pytensor.scalar import basic as ps

from . import _special

__all__ = ["Unsupported", "jnp_module", "scalar_function", "shared_exponentials"]

_walk = threading.local()  # .negations: id(-a) -> (-a, a); .parts: (id(a), part) -> (a, value)


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
    from pytensor.scalar.math import GammaLn, Psi, Sigmoid, Softplus

    if isinstance(scalar_op, ps.Composite):
        return _composite_function(scalar_op)
    if isinstance(scalar_op, Softplus):
        return _softplus
    if isinstance(scalar_op, Sigmoid):
        return _sigmoid
    if isinstance(scalar_op, ps.Neg):
        return _neg
    if isinstance(scalar_op, ps.Cast):  # (PyTensor's JAX form copies its input: Triton has no copy)
        return functools.partial(_cast, dtype=scalar_op.o_type.dtype)
    ins = [ps.get_scalar_type(d)() for d in dtypes]
    node = scalar_op.make_node(*ins)
    if isinstance(scalar_op, GammaLn | Psi):  # (Triton has no rule for JAX's)
        fn = _special.lgamma if isinstance(scalar_op, GammaLn) else _special.digamma
        return functools.partial(_in_dtype, fn, node.outputs[0].dtype)
    inner = jax_funcify(FunctionGraph(ins, node.outputs, clone=False))
    return lambda *a: (lambda r: r[0] if len(r) == 1 else r)(inner(*a))


def _in_dtype(fn, dtype, x):
    """``fn(x)`` computed in ``dtype`` (an integer ``x``, say ``y + 1`` of counts, first cast)."""
    return fn(_cast(x, dtype))


def _cast(x, dtype):
    import jax

    return jax.lax.convert_element_type(x, dtype)


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


@contextlib.contextmanager
def shared_exponentials():
    """Within: softplus and sigmoid of ``x`` and of ``-x`` share their parts
    (see the module's docstring)."""
    if getattr(_walk, "parts", None) is not None:  # (a walk inside a walk: the outer one's)
        yield
        return
    _walk.negations, _walk.parts = {}, {}
    try:
        yield
    finally:
        del _walk.negations, _walk.parts


def _neg(a):
    out = -a
    negations = getattr(_walk, "negations", None)
    if negations is not None:
        negations[id(out)] = (out, a)  # (both kept alive: their ids stay theirs for the walk)
    return out


def _part(x, name):
    """``exp(-|x|)`` ("exp"), its ``log1p`` ("log1p") or ``1 / (1 + exp(-|x|))``
    ("inverse"), once per value and its negation within a walk."""
    parts = getattr(_walk, "parts", None)
    if parts is None:
        return _PARTS[name](x)
    negated = _walk.negations.get(id(x))
    base = negated[1] if negated is not None and negated[0] is x else x
    hit = parts.get((id(base), name))
    if hit is None or hit[0] is not base:
        hit = parts[(id(base), name)] = (base, _PARTS[name](base))
    return hit[1]


_PARTS = {
    "exp": lambda x: jnp_module().exp(-jnp_module().abs(x)),
    "log1p": lambda x: jnp_module().log1p(_part(x, "exp")),
    "inverse": lambda x: 1 / (1 + _part(x, "exp")),
}


def _softplus(x):
    return jnp_module().maximum(x, 0) + _part(x, "log1p")


def _sigmoid(x):
    jnp = jnp_module()
    if getattr(_walk, "parts", None) is None:  # (outside a walk: its own exponential, read twice)
        e = jnp.exp(-jnp.abs(x))
        return jnp.where(x >= 0, 1, e) * (1 / (1 + e))
    return jnp.where(x >= 0, 1, _part(x, "exp")) * _part(x, "inverse")

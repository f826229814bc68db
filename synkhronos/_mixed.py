"""bfloat16 matrix products and convolutions: ``fork(precision="bf16")``.

PyTensor has no bfloat16 type, so the graph keeps its float32 variables and the
rewrite here changes how the nodes that profit from bfloat16 compute: every
float32 ``Dot`` and every op that declares itself a product (a class attribute
``bf16_product = True``: the convolutions of ``synkhronos.extensions.nnet``,
forward and both gradients) is wrapped in ``Bf16Op``, which rounds its float32 inputs to
bfloat16, computes with float32 accumulation, and rounds its result to bfloat16
before handing it on as float32.  That is what mixed-precision training does
with matrix products and convolutions (PyTorch's autocast among others);
everything else stays float32: elementwise work, reductions, softmax, batch-norm
statistics, the loss, the parameters, the optimizer's state and the gradient's
all-reduce.

On GPU ranks ``Bf16Op``'s JAX implementation casts to ``jnp.bfloat16`` around
the wrapped op's own, so XLA runs it on bfloat16 tensor cores.  Elsewhere (CPU
workers, any linker) ``perform`` emulates it with numpy: the inputs are rounded
to bfloat16 (to nearest, ties to even), the wrapped op computes in float32 and
its result is rounded the same way, which gives the numbers a GPU gives up to
the order of the float32 sums.  That is slow (a Python ``perform`` per wrapped
node, which also keeps Numba from caching the graph), but correct, so a bf16 run
can be checked on a laptop.

Synkhronos adds the rewrite (tag ``synk_bf16``) to its functions only when
``fork(precision="bf16")``; plain PyTensor functions are never changed.
"""

import numpy as np
from pytensor.compile import optdb
from pytensor.compile.mode import Mode, get_mode
from pytensor.graph.rewriting.basic import GraphRewriter
from pytensor.tensor.math import Dot

from ._wrapping import WrappingOp

__all__ = ["Bf16Op", "Bf16Products", "TAG", "bf16_mode", "round_to_bf16"]

TAG = "synk_bf16"


def round_to_bf16(array):
    """``array`` (float32) rounded to the nearest bfloat16 value, ties to even,
    returned as float32; NaN stays NaN and values past bfloat16's range become inf."""
    a = np.ascontiguousarray(array, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), a, rounded).reshape(a.shape)


def _is_product(op):
    """Whether ``op`` computes in bfloat16 under the rewrite: a ``Dot``, or an op
    that says it is a product (``bf16_product = True``; the core knows no
    extension's ops by name)."""
    return isinstance(op, Dot) or getattr(op, "bf16_product", False) is True


class Bf16Op(WrappingOp):
    """``op`` computed with bfloat16 inputs and result, float32 accumulation
    (see the module docstring); its variables stay float32."""

    def perform(self, node, inputs, outputs):
        """Emulation with numpy: round the float32 inputs, compute, round the result."""
        inner = self.inner_node(node)
        rounded = [round_to_bf16(x) if np.asarray(x).dtype == np.float32 else x for x in inputs]
        results = [[None] for _ in outputs]
        self.op.perform(inner, rounded, results)
        for out, (value,), var in zip(outputs, results, node.outputs):
            out[0] = round_to_bf16(value) if var.dtype == "float32" else value

    def __str__(self):
        return "Bf16{%s}" % (self.op,)


def _wrappable(node):
    return (_is_product(node.op) and not isinstance(node.op, Bf16Op)
            and all(v.dtype == "float32" for v in node.outputs)
            and any(getattr(v, "dtype", None) == "float32" for v in node.inputs))


class Bf16Products(GraphRewriter):
    """Wrap float32 matrix products and convolutions in ``Bf16Op``."""

    def apply(self, fgraph):
        for node in list(fgraph.toposort()):
            if _wrappable(node):
                new = Bf16Op(node.op).make_node(*node.inputs)
                fgraph.replace_all(list(zip(node.outputs, new.outputs)), reason="synk_bf16")


# After canonicalization and stabilization (which rewrite dots of transposes and the
# like), before the BLAS rewrites (1.7) turn ``Dot`` into ``Dot22``/``Gemm`` on CPUs.
optdb.register("synk_bf16_rewrite", Bf16Products(), TAG, position=1.65)


def _register_jax():
    try:
        from pytensor.link.jax.dispatch import jax_funcify
    except ImportError:  # no JAX: CPU workers use perform
        return

    @jax_funcify.register(Bf16Op)
    def _jax_bf16(op, node, **kwargs):
        import jax.numpy as jnp

        inner = jax_funcify(op.op, node=op.inner_node(node), **kwargs)
        out_dtypes = [v.dtype for v in node.outputs]

        def bf16(*args):
            cast = [a.astype(jnp.bfloat16) if getattr(a, "dtype", None) == jnp.float32 else a for a in args]
            result = inner(*cast)
            if len(out_dtypes) == 1:
                return result.astype(out_dtypes[0])
            return tuple(r.astype(d) for r, d in zip(result, out_dtypes))

        return bf16


_register_jax()


def bf16_mode(mode):
    """``mode`` (a name, a Mode or None for PyTensor's default) with the rewrite included."""
    mode = get_mode(mode) if not isinstance(mode, Mode) else mode
    return mode.including(TAG)

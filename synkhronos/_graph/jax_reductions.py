"""Sums and products that keep their declared dtype under JAX.

PyTensor sums a float32 array with a float64 accumulator (``Sum{acc=float64}``)
and returns float32.  Its JAX backend sums in float32 and then casts the result
to the accumulator's dtype, so where JAX's 64-bit mode is on (``floatX``
float64, PyTensor's default) the result is float64 although its type says
float32.  Everything downstream is then computed in float64 too: in the
gradient of a float32 network the matrix products, and the updated weights,
which stay float64 from the first training step on.

The rewrite here states the reduction as PyTensor defines it, in graph terms
every linker reads alike: ``cast(out, reduce(cast(acc, x), dtype=acc))`` for a
reduction whose accumulator differs from its output.  JAX then accumulates in
the accumulator's dtype, as PyTensor's own linkers do, and the output has its
type's dtype.  XLA fuses the casts into the reduction.

Synkhronos adds the rewrite (tag ``synk_reduction_dtypes``) to its JAX-mode
functions only; other PyTensor functions are unchanged.
"""

from pytensor.compile import optdb
from pytensor.compile.mode import get_mode
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.tensor.basic import cast
from pytensor.tensor.elemwise import CAReduce

__all__ = ["TAG", "reduction_dtypes_mode"]

TAG = "synk_reduction_dtypes"


@node_rewriter([CAReduce])
def declared_accumulator(fgraph, node):
    """``reduce{acc}(x) -> out`` as ``cast(out, reduce{acc -> acc}(cast(acc, x)))``."""
    acc = getattr(node.op, "acc_dtype", None)
    out = node.outputs[0]
    if acc is None or acc == out.dtype or not hasattr(node.op, "clone"):
        return None
    [x] = node.inputs
    wide = node.op.clone(dtype=acc, acc_dtype=acc)(cast(x, acc))
    return [cast(wide, out.dtype)]


# Last, after every rewrite that could fold the casts back into the reduction
# (the concrete-shapes rewrite of JAX functions follows at 100.5).
optdb.register("synk_reduction_dtypes_rewrite", in2out(declared_accumulator), TAG, position=100.4)


def reduction_dtypes_mode(mode):
    """``mode`` (a JAX mode) with the rewrite included."""
    return get_mode(mode).including(TAG)  # get_mode returns a Mode as it is

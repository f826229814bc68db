"""bfloat16 mixed precision: ``fork(precision="bf16")``.

PyTensor has no bfloat16 type, so the graph keeps its float32 variables and two
rewrites change how its values are computed and stored:

1. **Products.**  Every float32 ``Dot`` and every op that declares itself a
   product (a class attribute ``bf16_product = True``: the convolutions of
   ``synkhronos.extensions.nnet``, forward and both gradients) is wrapped in
   ``Bf16Op``: bfloat16 inputs, float32 accumulation, a bfloat16 result.
2. **Activations** (``Bf16Activations``). A value stays bfloat16 between layers
   where that is safe, by one rule: the float32 result of an elementwise op (or
   of an op that declares ``bf16_storage = True``: the poolings of
   ``synkhronos.extensions.nnet``, forward and gradient) is stored in bfloat16
   when at least one input is and every input of the result's full size is. Inputs
   broadcast against it (a batch-norm mean, a scale, a constant) do not count;
   they are float32 and the op computes in float32. Reshapes, dimension shuffles
   and slices keep their input's storage. Every other op reads a bfloat16 value
   as float32 (``Bf16Load``): reductions (batch-norm statistics, the loss's
   sums), softmax, joins, comparisons, and any op that mixes in a full-
   size float32 value, such as a parameter's update. So products' and
   convolutions' outputs, normalization, ReLU and residual adds, and their
   gradients, are bfloat16 in memory; statistics, the loss, parameters, their
   gradients once summed, the optimizer's state and the all-reduce are float32,
   and so is every output of the function.

That is what mixed-precision training in JAX does (a Flax model with
``dtype=bfloat16`` and float32 parameters), so XLA reads and writes half the
bytes of float32 in the memory-bound part of a step.

A stored add of three or more terms becomes a chain of two-term adds, each
stored by the rule: PyTensor's JAX backend sums many terms over a stack in
float32, for which XLA kept a float32 copy of ResNet's residual sums.

On GPU ranks, and wherever a function compiles with JAX, the ops' JAX
implementations cast: ``Bf16Op`` to ``jnp.bfloat16`` around the wrapped op's own,
so XLA runs it on bfloat16 tensor cores, ``Bf16Store`` to bfloat16 and
``Bf16Load`` back to float32.  Elsewhere (other linkers) ``perform`` emulates them
with numpy: a value stored in bfloat16 is rounded to it (to nearest, ties to even)
and stays a float32 array, which gives the numbers of JAX up to the order of
float32 sums (XLA on a GPU may skip a rounding inside one of its fusions, which
only adds precision).  That is slow (a Python ``perform`` per wrapped node, which also
keeps Numba from caching the graph), but correct, so a bf16 run can be checked
on a laptop.

Synkhronos adds the rewrite (tag ``synk_bf16``) to its functions only when
``fork(precision="bf16")``; plain PyTensor functions are never changed.
"""

import numpy as np
from pytensor.compile import optdb
from pytensor.compile.mode import get_mode
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.graph.rewriting.basic import GraphRewriter
from pytensor.scalar import Add
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.shape import Reshape, SpecifyShape
from pytensor.tensor.subtensor import Subtensor

from .wrapping import WrappingOp

__all__ = ["Bf16Activations", "Bf16Load", "Bf16Op", "Bf16Products", "Bf16Store", "TAG", "bf16_mode",
           "round_to_bf16"]

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


class _Storage(Op):
    """A change of how a float32 variable's value is held; the variable and its
    shape stay as they are."""

    __props__ = ()

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def infer_shape(self, *args):  # PyTensor 3.3: (node, shapes); before: (fgraph, node, shapes)
        shapes = args[-1]
        return [shapes[0]]

    def __str__(self):
        return type(self).__name__


class Bf16Store(_Storage):
    """Its input, stored in bfloat16 (JAX) or rounded to it (``perform``)."""

    def perform(self, node, inputs, outputs):
        outputs[0][0] = round_to_bf16(inputs[0])


class Bf16Load(_Storage):
    """A value stored in bfloat16, read as float32 (JAX: a cast; ``perform``: the
    rounded float32 array as it is).  ``exact``: for comparisons, which must see
    the stored value even where XLA kept more precision inside a fusion."""

    __props__ = ("exact",)
    view_map = {0: [0]}

    def __init__(self, exact=False):
        self.exact = bool(exact)

    def perform(self, node, inputs, outputs):
        outputs[0][0] = inputs[0]


_KEEP_STORAGE = (DimShuffle, Reshape, SpecifyShape, Subtensor)  # values unchanged, rearranged


def _full_size(var, out):
    """Whether ``var`` is as large as ``out`` (not broadcast against it)."""
    return var.type.ndim == out.type.ndim and var.type.broadcastable == out.type.broadcastable


def _stores_result(node, stored):
    """The rule of ``Bf16Activations`` for one node: an elementwise (or
    ``bf16_storage``) node whose float32 results are stored in bfloat16.  Such an
    op takes its stored inputs in bfloat16; its JAX implementation computes from
    them in float32, as the emulation does."""
    if not (isinstance(node.op, Elemwise) or getattr(node.op, "bf16_storage", False) is True):
        return False
    outs = [v for v in node.outputs if v.dtype == "float32"]
    floats = [v for v in node.inputs if getattr(v, "dtype", "").startswith("float")]
    if not outs or not any(v in stored for v in floats):
        return False
    return all(v in stored for v in floats if any(_full_size(v, o) for o in outs))


class Bf16Activations(GraphRewriter):
    """Store activations in bfloat16 by the rule of the module docstring: wrap
    each result so stored in ``Bf16Store`` and give every other reader of a stored
    value a ``Bf16Load``."""

    def apply(self, fgraph):
        stored, readers = set(), set()  # values kept in bfloat16; nodes that take them so
        for node in list(fgraph.toposort()):
            if node not in fgraph.apply_nodes:
                continue
            if isinstance(node.op, Bf16Op):
                stored.update(node.outputs)
                readers.add(node)
            elif isinstance(node.op, _KEEP_STORAGE) and node.inputs[0] in stored:
                stored.update(node.outputs)
                readers.add(node)
            elif _stores_result(node, stored):
                if _is_sum_of_many(node):
                    readers.update(_split_sum(fgraph, node, stored))
                else:
                    readers.add(_store(fgraph, node, stored))
        for var in stored:
            _load_elsewhere(fgraph, var, readers)


def _store(fgraph, node, stored):
    """``node`` again, its float32 results through ``Bf16Store``; returns the new node."""
    new = node.op.make_node(*node.inputs)
    pairs = []
    for old, out in zip(node.outputs, new.outputs):
        kept = Bf16Store()(out) if out.dtype == "float32" else out
        pairs.append((old, kept))
        if kept is not out:
            stored.add(kept)
    fgraph.replace_all(pairs, reason="synk_bf16_activations")
    return new


def _is_sum_of_many(node):
    """An add of three or more terms: PyTensor's JAX backend sums those over a
    stack, in float32, which leaves XLA a float32 copy of a stored value."""
    return isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, Add) and len(node.inputs) > 2


def _split_sum(fgraph, node, stored):
    """``node`` (see ``_is_sum_of_many``) as a chain of two-term adds, stored
    bfloat16 first, each stored by the rule; returns the new nodes that read
    bfloat16 values as they are."""
    out = node.outputs[0]
    terms = sorted(node.inputs, key=lambda v: not (v in stored and _full_size(v, out)))
    total, readers = terms[0], []
    for term in terms[1:]:
        step = node.op.make_node(total, term)
        total = step.outputs[0]
        if _stores_result(step, stored):
            total = Bf16Store()(total)
            stored.add(total)
            readers.append(step)
    fgraph.replace(out, total, reason="synk_bf16_activations")
    return readers


def _load_elsewhere(fgraph, var, readers):
    """Readers of ``var`` that do not take bfloat16 (any node not in ``readers``,
    and the function's outputs) get it through one ``Bf16Load``."""
    if var not in fgraph.variables:
        return
    others = [(client, i) for client, i in fgraph.clients[var] if client not in readers]
    loads = {}
    for client, i in others:
        exact = _compares(client)
        if exact not in loads:
            loads[exact] = Bf16Load(exact)(var)
        fgraph.change_node_input(client, i, loads[exact], reason="synk_bf16_activations")


def _compares(client):
    """Whether ``client`` (a node, or "output") is a comparison: an elementwise
    node with boolean results only."""
    return (isinstance(getattr(client, "op", None), Elemwise)
            and all(v.dtype == "bool" for v in client.outputs))


# After every algebraic rewrite, before elementwise fusion (48-49) merges the ops whose
# storage it decides.
optdb.register("synk_bf16_activations", Bf16Activations(), TAG, position=47.9)


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
            result = inner(*cast)  # float32 results stay bfloat16: see Bf16Activations
            if len(out_dtypes) == 1:
                return result.astype(_jax_dtype(out_dtypes[0]))
            return tuple(r.astype(_jax_dtype(d)) for r, d in zip(result, out_dtypes))

        return bf16

    @jax_funcify.register(Bf16Store)
    def _jax_store(op, **kwargs):
        import jax.numpy as jnp

        return lambda x: x.astype(jnp.bfloat16)

    @jax_funcify.register(Bf16Load)
    def _jax_load(op, node, **kwargs):
        import jax

        dtype = node.outputs[0].dtype

        def exact_load(x):
            # XLA may drop a float32 -> bfloat16 -> float32 pair of casts inside a fusion
            # (excess precision); reduce_precision keeps the rounding, so that a comparison
            # (say a == b, both stored) sees the stored values on both sides.
            return jax.lax.reduce_precision(x.astype(dtype), exponent_bits=8, mantissa_bits=7)

        return exact_load if op.exact else (lambda x: x.astype(dtype))


def _jax_dtype(dtype):
    import jax.numpy as jnp

    return jnp.bfloat16 if dtype == "float32" else dtype


_register_jax()


def bf16_mode(mode):
    """``mode`` (a name, a Mode or None for PyTensor's default) with the rewrite included."""
    return get_mode(mode).including(TAG)  # get_mode returns a Mode as it is

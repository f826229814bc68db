"""A GPU rank's pass over its rows as one kernel.

XLA compiles the batched graph of a GLM's log-density and gradient into
several passes over the rows, writing K x n values between them (K points, n
rows).  ``RowsKernel`` stands for the batched graph on GPU ranks: under JAX it
is a Pallas kernel (Triton, ``_pallas.Kernel``) over blocks of rows, each
program evaluating the graph of one point on one block.  Where that does not
compile, or costs more than it should, the values the rows do not enter are
computed before it (``_pallas.HoistedKernel``).  Where the graph holds what the
interpreter or Triton does not handle, and anywhere but under JAX, it is the
batched graph it stands for, compiled as usual (``data_parallel`` uses it only
where it compiled on the session's own GPU).  The docs page "PyMC" says what
it measured.
"""

import functools
import threading

import numpy as np
from pytensor.graph.basic import Apply
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.op import Op
from pytensor.graph.replace import clone_replace

from .._graph.jax_shapes import jax_mode
from ._blocks import Unsupported
from ._pallas import BLOCK, HoistedKernel, Kernel, computed_from, log_batched

__all__ = ["BLOCK", "KERNEL_ENV", "HoistedKernel", "Kernel", "RowsKernel", "jax_form", "kernel_compiles",
           "rows_kernel"]

KERNEL_ENV = "SYNKHRONOS_ROWS_KERNEL"  # 0: GPU ranks compile the batched graph as it is
_registered = threading.Event()


class RowsKernel(Op):
    """The outputs of ``batched`` (a graph of stacked parameters, data and
    rows), computed under JAX as one kernel that evaluates ``single`` (the
    graph of one point: parameters, data, rows) at each point.  ``shapes``:
    one point's shape of each parameter and datum, for those whose type
    leaves it open (a group's coefficients, sized by the model's dims): the
    kernel is tried on those."""

    def __init__(self, single, batched, n_params, n_data, shapes=None):
        self.single = single
        self.batched = batched
        self.n_params = n_params
        self.n_data = n_data
        self.shapes = None if shapes is None else [tuple(s) for s in shapes]

    def make_node(self, *inputs):
        return Apply(self, list(inputs), [o.type() for o in self.batched.outputs])

    def perform(self, node, inputs, output_storage):
        if getattr(self, "_fn", None) is None:
            import pytensor

            self._fn = pytensor.function(self.batched.inputs, self.batched.outputs, on_unused_input="ignore")
        for storage, value in zip(output_storage, self._fn(*inputs)):
            storage[0] = np.asarray(value)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_fn", "_tried")}

    def __setstate__(self, state):
        # A rank unpickling the graph compiles it next: register the JAX form first.
        self.__dict__.update(state)
        _register_jax()

    def __str__(self):
        return "RowsKernel"


def rows_kernel(params, data, rows, single, stacked, batched, shapes=None):
    """``batched`` (outputs of ``stacked`` params, ``data`` and ``rows``) as the
    outputs of one ``RowsKernel`` node; ``single`` is the graph of one point
    (outputs of ``params``, ``data``, ``rows``); ``shapes``: one point's shape
    of each of ``params`` and ``data`` (see ``RowsKernel``)."""
    holders = [r.type(name=r.name) for r in rows]
    one = FunctionGraph(list(params) + list(data) + holders,
                        clone_replace(list(single), replace=dict(zip(rows, holders))), clone=True)
    many = FunctionGraph(list(stacked) + list(data) + holders,
                         clone_replace(list(batched), replace=dict(zip(rows, holders))), clone=True)
    _register_jax()
    return RowsKernel(one, many, len(params), len(data), shapes)(*stacked, *data, *rows)


def _register_jax():
    if _registered.is_set():
        return
    try:
        from pytensor.link.jax.dispatch import jax_funcify
    except ImportError:
        return

    @jax_funcify.register(RowsKernel)
    def _rows_kernel(op, node=None, **kwargs):
        return jax_form(op, **kwargs)

    _registered.set()


def jax_form(op, interpret=None, **kwargs):
    """The kernel where it compiles (tried on one point and one block), else
    the batched graph's JAX function.  ``interpret``: run Pallas's
    interpreter (default: where JAX's backend is not a GPU)."""
    import jax

    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    tried = getattr(op, "_tried", None)  # (this process tried it before: data_parallel did)
    if tried is not None and tried.interpret == interpret:
        return tried
    try:
        kernel = _tried_kernel(_rewritten(op.single, "JAX"), op.n_params, op.n_data, interpret,
                               getattr(op, "shapes", None))
    except Exception as exc:  # what the interpreter, Pallas or Triton does not handle
        log_batched(exc)
        return _batched_form(op, **kwargs)
    kernel.instead = functools.cache(functools.partial(_batched_form, op, **kwargs))
    op._tried = kernel
    return kernel


def _batched_form(op, **kwargs):
    """The JAX function of ``op``'s batched graph."""
    from pytensor.link.jax.dispatch import jax_funcify

    fn = jax_funcify(_rewritten(op.batched, jax_mode("JAX")), **kwargs)
    return fn if len(op.batched.outputs) > 1 else (lambda *args: fn(*args)[0])


def _tried_kernel(fgraph, n_params, n_data, interpret, shapes=None):
    """The kernel of ``fgraph``, compiled once; where it does not compile, or
    first where the parameters alone take lgamma or digamma, the kernel with
    what the rows do not enter taken out (``HoistedKernel``): a Student-t's
    normalizing constant computed in every program made the kernel slower
    than XLA's batched graph, taken out faster (docs page "Benchmarks")."""
    forms = (Kernel, HoistedKernel)
    if _special_without_rows(fgraph, n_params, n_data):
        forms = forms[::-1]
    error = None
    for form in forms:
        try:
            kernel = form(fgraph, n_params, n_data, interpret, shapes)
            kernel.trial()
            return kernel
        except Unsupported as exc:  # (HoistedKernel: nothing to take out)
            error = error or exc
        except Exception as exc:
            error = exc
    raise error


def _special_without_rows(fgraph, n_params, n_data):
    """Whether ``fgraph`` takes lgamma or digamma of values without rows."""
    from pytensor.scalar.basic import Composite
    from pytensor.scalar.math import GammaLn, Psi

    def special(op):
        if isinstance(op, Composite):
            return any(special(n.op) for n in op.fgraph.apply_nodes)
        return isinstance(op, GammaLn | Psi)

    on_rows = computed_from(fgraph, fgraph.inputs[n_params + n_data:])
    return any(node.outputs[0] not in on_rows and special(getattr(node.op, "scalar_op", node.op))
               for node in fgraph.apply_nodes)


def kernel_compiles(op):
    """Whether ``op`` compiles as one kernel on this process's GPU (its
    ``jax_form``, tried here); False without a GPU."""
    import jax

    return jax.default_backend() == "gpu" and isinstance(jax_form(op), Kernel)


def _rewritten(fgraph, mode):
    from pytensor.compile.mode import get_mode

    fg = fgraph.clone()
    get_mode(mode).optimizer.rewrite(fg)
    return fg

"""A GPU rank's pass over its rows as one kernel.

XLA compiles the batched graph of a GLM's log-density and gradient into
several passes over the rows, writing K x n values between them (K points, n
rows).  ``RowsKernel`` stands for the batched graph on GPU ranks: under JAX it
is a Pallas kernel (Triton) in which each program reads one block of
``BLOCK`` rows once and evaluates the graph of one point on them for each of
the K points (``_blocks.Interpreter``), writing one partial sum per output
component; the partial sums are then added up.  Where that does not compile, or costs
more than it should, the values the rows do not enter are computed before it
(``HoistedKernel``).  Where the graph holds what the
interpreter or Triton does not handle, and anywhere but under JAX, it is the
batched graph it stands for, compiled as usual (``data_parallel`` uses it only
where it compiled on the session's own GPU).  The docs page "PyMC" says what
it measured.
"""

import logging
import math
import threading

import numpy as np
from pytensor.graph.basic import Apply
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.op import Op
from pytensor.graph.replace import clone_replace

from .._graph.jax_shapes import jax_mode
from ._blocks import Interpreter, Unsupported, Value, comps_from

__all__ = ["BLOCK", "KERNEL_ENV", "HoistedKernel", "Kernel", "RowsKernel", "jax_form", "kernel_compiles",
           "rows_kernel"]

logger = logging.getLogger("synkhronos.pymc")

BLOCK = 256  # rows per program (a power of two, as Triton's blocks are)
KERNEL_ENV = "SYNKHRONOS_ROWS_KERNEL"  # 0: GPU ranks compile the batched graph as it is
_registered = threading.Event()


class RowsKernel(Op):
    """The outputs of ``batched`` (a graph of stacked parameters, data and
    rows), computed under JAX as one kernel that evaluates ``single`` (the
    graph of one point: parameters, data, rows) at each point."""

    def __init__(self, single, batched, n_params, n_data):
        self.single = single
        self.batched = batched
        self.n_params = n_params
        self.n_data = n_data

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


def rows_kernel(params, data, rows, single, stacked, batched):
    """``batched`` (outputs of ``stacked`` params, ``data`` and ``rows``) as the
    outputs of one ``RowsKernel`` node; ``single`` is the graph of one point
    (outputs of ``params``, ``data``, ``rows``)."""
    holders = [r.type(name=r.name) for r in rows]
    one = FunctionGraph(list(params) + list(data) + holders,
                        clone_replace(list(single), replace=dict(zip(rows, holders))), clone=True)
    many = FunctionGraph(list(stacked) + list(data) + holders,
                         clone_replace(list(batched), replace=dict(zip(rows, holders))), clone=True)
    _register_jax()
    return RowsKernel(one, many, len(params), len(data))(*stacked, *data, *rows)


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
    from pytensor.link.jax.dispatch import jax_funcify

    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    tried = getattr(op, "_tried", None)  # (this process tried it before: data_parallel did)
    if tried is not None and tried.interpret == interpret:
        return tried
    try:
        op._tried = kernel = _tried_kernel(_rewritten(op.single, "JAX"), op.n_params, op.n_data, interpret)
    except Exception as exc:  # what the interpreter, Pallas or Triton does not handle
        logger.info("synkhronos.pymc: the rows' graph compiled as it is, not as one kernel (%s: %s)",
                    type(exc).__name__, (str(exc).splitlines() or [""])[0][:300])
        fn = jax_funcify(_rewritten(op.batched, jax_mode("JAX")), **kwargs)
        return fn if len(op.batched.outputs) > 1 else (lambda *args: fn(*args)[0])
    return kernel


def _tried_kernel(fgraph, n_params, n_data, interpret):
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
            kernel = form(fgraph, n_params, n_data, interpret)
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


class Kernel:
    """``kernel(*stacked_params, *data, *rows) -> outputs`` (one leading axis
    of points each): the Pallas kernel over blocks of rows, then the sum of its
    partial sums."""

    def __init__(self, fgraph, n_params, n_data, interpret):
        self.fgraph = fgraph
        self.n_params, self.n_data = n_params, n_data
        self.interpret = interpret
        ins = fgraph.inputs
        self.params, self.data = ins[:n_params], ins[n_params:n_params + n_data]
        self.rows = ins[n_params + n_data:]
        if not self.rows:
            raise ValueError("no rows")
        on_rows = computed_from(fgraph, self.rows)
        self.partial = [o in on_rows for o in fgraph.outputs]

    def trial(self):
        """Compile for one point and one block (raises what does not)."""
        import jax

        jax.jit(self).lower(*_trial_args(self.params, self.data, self.rows)).compile()

    def __call__(self, *args):
        import jax.numpy as jnp

        params = args[:self.n_params]
        data = args[self.n_params:self.n_params + self.n_data]
        rows = args[self.n_params + self.n_data:]
        points = params[0].shape[0] if params else 1
        n = rows[0].shape[0]
        if n == 0:  # a rank without rows: one block of none (one row read, masked out)
            rows = [jnp.zeros((1,) + r.shape[1:], r.dtype) for r in rows]
        blocks = max(1, -(-n // BLOCK))
        shapes = self._output_shapes(params, data, rows)
        sizes = [math.prod(s) for s in shapes]
        per_point = sum(sizes)
        part = self._pallas(params, data, rows, points, n, blocks, per_point)
        total = jnp.sum(part, axis=1).reshape(points, per_point)
        outs, at = [], 0
        for var, shape, size in zip(self.fgraph.outputs, shapes, sizes):
            outs.append(total[:, at:at + size].reshape((points,) + shape).astype(var.dtype))
            at += size
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _output_shapes(self, params, data, rows):
        """The outputs' shapes at one point (from one interpretation, traced
        abstractly on a block of rows)."""
        import jax
        import jax.numpy as jnp

        found = []

        def probe():
            mask = jnp.ones((BLOCK,), dtype=bool)
            env = self._inputs_env(
                [comps_from(lambda c, p=p: jnp.zeros((), p.dtype), p.shape[1:]) for p in params],
                [comps_from(lambda c, d=d: jnp.zeros((), d.dtype), d.shape) for d in data],
                [comps_from(lambda c, r=r: jnp.zeros((BLOCK,), r.dtype), r.shape[1:]) for r in rows])
            Interpreter(self.fgraph, mask).run(env)
            for o in self.fgraph.outputs:
                if env[o].row is not None:
                    raise ValueError("an output with rows")
                found.append(env[o].comps.shape)
            return jnp.zeros(())

        jax.eval_shape(probe)
        return found

    def _inputs_env(self, params, data, rows):
        env = {}
        for var, comps in zip(self.params, params):
            env[var] = Value(comps)
        for var, comps in zip(self.data, data):
            env[var] = Value(comps)
        for var, comps in zip(self.rows, rows):
            env[var] = Value(comps[None, ...] if comps.ndim else comps.reshape((1,)), row=0)
        return env

    def _pallas(self, params, data, rows, points, n, blocks, per_point):
        import jax
        import jax.numpy as jnp
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import triton as plt

        flat = [a.reshape(-1) for a in (*params, *data, *rows)]
        p_shapes = [p.shape[1:] for p in params]
        d_shapes = [d.shape for d in data]
        r_shapes = [r.shape[1:] for r in rows]

        def body(*refs):
            out = refs[-1]
            p_refs = refs[:len(params)]
            d_refs = refs[len(params):len(params) + len(data)]
            r_refs = refs[len(params) + len(data):-1]
            k, pid = pl.program_id(0), pl.program_id(1)
            index = pid * BLOCK + jnp.arange(BLOCK)
            mask = index < n
            safe = jnp.where(mask, index, 0)

            def row_load(ref, shape):
                width = math.prod(shape)
                return comps_from(lambda c: plt.load(ref.at[safe * width + _flat_index(c, shape)],
                                                      mask=mask, other=0), shape)

            env = self._inputs_env(
                [comps_from(lambda c, ref=ref, s=s: ref[k * math.prod(s) + _flat_index(c, s)], s)
                 for ref, s in zip(p_refs, p_shapes)],
                [comps_from(lambda c, ref=ref, s=s: ref[_flat_index(c, s)], s)
                 for ref, s in zip(d_refs, d_shapes)],
                [row_load(ref, s) for ref, s in zip(r_refs, r_shapes)])
            Interpreter(self.fgraph, mask).run(env)
            m = 0
            for var, partial in zip(self.fgraph.outputs, self.partial):
                for value in env[var].comps.reshape(-1):
                    value = jnp.asarray(value, dtype=dtype)
                    if not partial:  # a rank's constant: once, not once per block
                        value = jnp.where(pid == 0, value, jnp.zeros_like(value))
                    out[k * per_point + m, pid] = value
                    m += 1

        dtype = jnp.float64 if _x64() else jnp.float32
        call = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((points * per_point, blocks), dtype),
                              grid=(points, blocks), interpret=self.interpret)
        return call(*flat)


class HoistedKernel(Kernel):
    """A ``Kernel`` whose graph's values computed from the parameters and data
    alone are computed before it, by XLA, once per point, and passed to it as
    parameters: what Triton does not compile, or what costs the kernel more
    than it does XLA (``lgamma`` and ``digamma`` by ``_special``'s series in
    every program: a Student-t's or a Gamma's normalizing constant, and its
    gradient), then lies outside the kernel where it is not computed row by
    row.  Raises ``Unsupported`` where there is nothing to take out."""

    def __init__(self, fgraph, n_params, n_data, interpret):
        from pytensor.link.jax.dispatch import jax_funcify

        params, data = fgraph.inputs[:n_params], fgraph.inputs[n_params:n_params + n_data]
        rows = fgraph.inputs[n_params + n_data:]
        on_rows = computed_from(fgraph, rows)
        used = [v for node in fgraph.toposort() if node.outputs[0] in on_rows for v in node.inputs]
        hoist = [v for v in dict.fromkeys(used + list(fgraph.outputs))
                 if v not in on_rows and v.owner is not None and None not in v.type.shape]
        if not hoist:
            raise Unsupported("nothing computed from the parameters alone to take out of the kernel")
        holders = [v.type(name="hoisted_%d" % i) for i, v in enumerate(hoist)]
        outputs = clone_replace(list(fgraph.outputs), replace=dict(zip(hoist, holders)))
        body = FunctionGraph(list(params) + holders + list(data) + list(rows), outputs, clone=True)
        super().__init__(body, n_params + len(hoist), n_data, interpret)
        self._outer = (params, data, rows)
        self._head = jax_funcify(FunctionGraph(list(params) + list(data), hoist, clone=True))

    def trial(self):
        import jax

        jax.jit(self).lower(*_trial_args(*self._outer)).compile()

    def __call__(self, *args):
        import jax

        n_params, n_data = len(self._outer[0]), len(self._outer[1])
        params, data = args[:n_params], args[n_params:n_params + n_data]
        hoisted = jax.vmap(lambda *p: tuple(self._head(*p, *data)))(*params)
        return super().__call__(*params, *hoisted, *args[n_params:])


def _trial_args(params, data, rows):
    """Zeros for one point, the data and one block of rows."""
    args = [np.zeros((1,) + _concrete(v.type.shape), dtype=v.dtype) for v in params]
    args += [np.zeros(_concrete(v.type.shape), dtype=v.dtype) for v in data]
    return args + [np.zeros((BLOCK,) + _concrete(v.type.shape[1:]), dtype=v.dtype) for v in rows]


def computed_from(fgraph, inputs):
    """Every variable of ``fgraph`` computed from ``inputs`` (and those)."""
    found = set(inputs)
    for node in fgraph.toposort():
        if any(i in found for i in node.inputs):
            found.update(node.outputs)
    return found


def _x64():
    import jax

    return bool(jax.config.jax_enable_x64)


def _concrete(shape):
    if any(s is None for s in shape):
        raise ValueError("a shape not known before the call: %s" % (shape,))
    return tuple(shape)


def _flat_index(index, shape):
    return int(np.ravel_multi_index(index, shape)) if shape else 0


"""The Pallas kernels of ``_kernel``'s ``RowsKernel``: a GPU rank's pass over
its rows, one program per point and block of rows (``rows_per_program``), each walking the
graph of one point (``_blocks.Interpreter``) on its block and writing one
partial sum per output component, added up after (``Kernel``); the same with
what the rows do not enter computed before it by XLA (``HoistedKernel``)."""

import logging
import math

import numpy as np
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.replace import clone_replace

from ._blocks import Interpreter, Unsupported, Value, comps_from

__all__ = ["BLOCK", "MANY_SUMS", "HoistedKernel", "Kernel", "WIDE_BLOCK", "computed_from", "log_batched",
           "rows_per_program"]

logger = logging.getLogger("synkhronos.pymc")

BLOCK = 512  # rows per program (a power of two, as Triton's blocks are) ...
WIDE_BLOCK = 1024  # ... and where a point has more than MANY_SUMS partial sums
MANY_SUMS = 16  # (partial sums per point)


def rows_per_program(sums):
    """The rows each program of a kernel reads, where it writes ``sums``
    partial sums per point.  Where they are many (a coefficient per group and
    its gradient: 42 for an intercept and a slope per county over 20
    counties), summing them over each block costs more than the block's row
    math, and fewer, wider blocks took less time; where they are few (a GLM's
    log-density and gradient), the wider blocks took longer, and half as
    wide ones (256 rows) as long or longer (docs page "Benchmarks",
    ``benchmarks/rows_kernel_blocks.py``)."""
    return WIDE_BLOCK if sums > MANY_SUMS else BLOCK


class Kernel:
    """``kernel(*stacked_params, *data, *rows) -> outputs`` (one leading axis
    of points each): the Pallas kernel over blocks of rows, then the sum of its
    partial sums.  Where a call's shapes are not what it was tried on and its
    graph's walk does not take them (say, more groups after ``pm.set_data``),
    ``instead()`` (the batched graph's function) computes it."""

    instead = None

    def __init__(self, fgraph, n_params, n_data, interpret, shapes=None):
        self.fgraph = fgraph
        self.shapes = shapes
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

        jax.jit(self).lower(*_trial_args(self.params, self.data, self.rows, self.shapes)).compile()

    def __call__(self, *args):
        try:
            return self._run(*args)
        except Unsupported as exc:
            if self.instead is None:
                raise
            log_batched(exc)
            return self.instead()(*args)

    def _run(self, *args):
        import jax.numpy as jnp

        params = args[:self.n_params]
        data = args[self.n_params:self.n_params + self.n_data]
        rows = args[self.n_params + self.n_data:]
        points = params[0].shape[0] if params else 1
        n = rows[0].shape[0]
        if n == 0:  # a rank without rows: one block of none (one row read, masked out)
            rows = [jnp.zeros((1,) + r.shape[1:], r.dtype) for r in rows]
        shapes = self._output_shapes(params, data, rows)
        sizes = [math.prod(s) for s in shapes]
        per_point = sum(sizes)
        block = rows_per_program(per_point)
        part = self._pallas(params, data, rows, points, n, block, per_point)
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

    def _pallas(self, params, data, rows, points, n, block, per_point):
        """The partial sums, ``(points * per_point, blocks)``: a program per
        point and ``block`` rows."""
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
            index = pid * block + jnp.arange(block)
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
        blocks = max(1, -(-n // block))
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

    def __init__(self, fgraph, n_params, n_data, interpret, shapes=None):
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
        self._outer = (params, data, rows, shapes)
        self._head = jax_funcify(FunctionGraph(list(params) + list(data), hoist, clone=True))

    def trial(self):
        import jax

        jax.jit(self).lower(*_trial_args(*self._outer)).compile()

    def _run(self, *args):
        import jax

        n_params, n_data = len(self._outer[0]), len(self._outer[1])
        params, data = args[:n_params], args[n_params:n_params + n_data]
        hoisted = jax.vmap(lambda *p: tuple(self._head(*p, *data)))(*params)
        return super()._run(*params, *hoisted, *args[n_params:])


def _trial_args(params, data, rows, shapes=None):
    """Zeros for one point, the data and one block of rows; a parameter's or
    datum's shape its type's, else its entry of ``shapes`` (where given)."""
    given = list(params) + list(data)
    known = [_concrete(v.type.shape, s) for v, s in zip(given, shapes or [None] * len(given))]
    args = [np.zeros((1,) + s, dtype=v.dtype) for v, s in zip(params, known)]
    args += [np.zeros(s, dtype=v.dtype) for v, s in zip(data, known[len(params):])]
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


def _concrete(shape, known=None):
    if known is not None and len(known) == len(shape) and all(s in (None, k) for s, k in zip(shape, known)):
        return tuple(known)
    if any(s is None for s in shape):
        raise ValueError("a shape not known before the call: %s" % (shape,))
    return tuple(shape)


def _flat_index(index, shape):
    return int(np.ravel_multi_index(index, shape)) if shape else 0


def log_batched(exc):
    """Log at INFO that the batched graph computes what the kernel did not take, and why."""
    logger.info("synkhronos.pymc: the rows' graph compiled as it is, not as one kernel (%s: %s)",
                type(exc).__name__, (str(exc).splitlines() or [""])[0][:300])

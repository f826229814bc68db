"""Graphs whose shapes are symbolic (inputs of unknown batch and image size, no
static shapes on the parameters, flatten and reshapes computed from shapes) under
PyTensor's JAX linker: in one process, and trained on n ranks step for step like
one process with PyTensor's CPU linker on the same rows.

On CPU workers the functions are compiled with ``mode="JAX"`` (JAX's CPU
backend); ``tests/gpu/test_gpu_shapes.py`` runs the same tests on GPU ranks.
"""

import types

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.extensions import train, updates
from synkhronos.extensions.nnet import conv2d, max_pool2d, softmax_cross_entropy

jax = pytest.importorskip("jax")

ROWS, CLASSES = 23, 3  # 23 rows split unevenly over 2 and 3 ranks
# (batch, num_slices) per step: all rows, an index list, a slice in 2 slices, a short
# last batch, and 2 rows (one rank gets none on 3 ranks).  Each changes the shapes.
STEPS = [(None, 1), ([4, 17, 0, 9, 9, 22, 13, 2, 6, 11], 1), (slice(3, 20), 2), (slice(16, 23), 1),
         ([5, 7], 1)]


def cnn_params(rng, fx):
    """Parameters without static shapes, as ``pytensor.shared`` makes them."""
    w = pytensor.shared((0.3 * rng.standard_normal((4, 2, 3, 3))).astype(fx), name="W")
    v = pytensor.shared((0.2 * rng.standard_normal((4 * 3 * 3, CLASSES))).astype(fx), name="V")
    return [w, v]


def cnn_loss(x, y, params):
    """conv2d -> relu -> max_pool2d -> flatten(2) -> dense -> softmax cross-entropy."""
    w, v = params
    h = max_pool2d(pt.maximum(conv2d(x, w, padding=1), 0), 2)
    return softmax_cross_entropy(h.flatten(2).dot(v), y).mean()


def shape_graphs(x):
    """Values computed from ``x``'s shape, each of which JAX needs concrete."""
    n, c, h, _ = x.shape
    return [x.reshape((n * c, -1)).sum(axis=0),       # reshape to computed sizes
            pt.arange(n // 2).sum(),                    # arange of a computed length
            pt.zeros((n * 2, h - 1)).sum(axis=0),       # alloc of computed sizes
            x.flatten(2).mean(axis=1)]                  # flatten, and a mean dividing by a size


def data(rng, rows, size=6, fx="float32"):
    x = rng.standard_normal((rows, 2, size, size)).astype(fx)
    y = np.eye(CLASSES, dtype=fx)[rng.integers(0, CLASSES, rows)]
    return x, y


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


# -------------------------------------------------------------- one process
def test_jax_mode_compiles_where_plain_jax_mode_may_not():
    """The failure this fixes, and the fix: PyTensor's JAX linker alone cannot
    trace the CNN's gradient before PyTensor 3.3 (3.3 traces it); with the
    rewrite it matches the CPU linker, for two batch sizes and two image sizes
    with one compiled function."""
    from synkhronos._graph.jax_shapes import jax_mode

    fx = "float32"
    x, y = pt.tensor4("x", dtype=fx), pt.matrix("y", dtype=fx)
    params = cnn_params(np.random.default_rng(0), fx)
    loss = cnn_loss(x, y, params)
    outs = [loss] + pytensor.grad(loss, params)
    xv, yv = data(np.random.default_rng(1), 10)
    try:
        pytensor.function([x, y], outs, mode="JAX")(xv, yv)
    except TypeError as exc:
        assert "concrete" in str(exc)
    else:
        assert pytensor.__version__ >= "3.3", pytensor.__version__  # (no 3.10 in the range we support)
    ref = pytensor.function([x, y], outs)
    f = pytensor.function([x, y], outs, mode=jax_mode("JAX"))
    with jax.default_matmul_precision("highest"):
        for rows, size in [(10, 6), (7, 6), (5, 7)]:  # 6 and 7 both pool to 3x3
            xv, yv = data(np.random.default_rng(rows), rows, size)
            for got, want in zip(f(xv, yv), ref(xv, yv)):
                close(got, want, rtol=1e-4)


def test_shape_arithmetic_matches_cpu_linker():
    from synkhronos._graph.jax_shapes import ConcreteShapeOp, jax_mode

    x = pt.tensor4("x", dtype="float32")
    outs = shape_graphs(x)
    ref = pytensor.function([x], outs)
    f = pytensor.function([x], outs, mode=jax_mode("JAX"))
    assert any(isinstance(n.op, ConcreteShapeOp) for n in f.maker.fgraph.apply_nodes)
    for shape in [(5, 2, 4, 3), (2, 3, 5, 5)]:
        xv = np.random.default_rng(len(shape)).standard_normal(shape).astype("float32")
        for got, want in zip(f(xv), ref(xv)):
            close(got, want)


def test_rewrite_leaves_data_alone():
    """Only values computed from shapes are wrapped: arithmetic on data stays JAX's."""
    from pytensor.tensor.shape import Shape_i

    from synkhronos._graph.jax_shapes import ConcreteShapeOp, jax_mode

    x = pt.vector("x", dtype="float32")
    s = x.sum()
    f = pytensor.function([x], [s * 2 + 1, (x * s).mean()], mode=jax_mode("JAX"))
    nodes = f.maker.fgraph.apply_nodes
    wrapped = [n for n in nodes if isinstance(n.op, ConcreteShapeOp)]
    # The mean's divisor (the length, cast) may be wrapped; nothing that reads x's values is.
    for node in wrapped:
        for i in node.inputs:
            assert i.owner is None or isinstance(i.owner.op, (Shape_i, ConcreteShapeOp)), node
    assert len(wrapped) < len(nodes) - 1
    xv = np.arange(5, dtype="float32")
    close(f(xv)[0], xv.sum() * 2 + 1)
    close(f(xv)[1], (xv * xv.sum()).mean())


def test_shape_checks_run_when_traced_without_warnings():
    """PyTensor's check that two inputs of unknown shape broadcast runs when JAX
    traces (the JAX backend alone drops it, with a UserWarning)."""
    import warnings

    from synkhronos._graph.jax_shapes import ConcreteCheck, jax_mode

    a, b = pt.matrix("a", dtype="float32"), pt.matrix("b", dtype="float32")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Skipping")
        f = pytensor.function([a, b], (a * b).sum(axis=1).mean(), mode=jax_mode("JAX"))
        assert any(isinstance(n.op, ConcreteCheck) for n in f.maker.fgraph.apply_nodes)
        av, bv = np.ones((4, 3), "float32"), np.full((4, 3), 2, "float32")
        close(f(av, bv), (av * bv).sum(axis=1).mean())
        with pytest.raises(AssertionError, match="broadcast"):
            f(av, np.ones((5, 3), "float32"))


# ---------------------------------------------------------------- on n ranks
def make_env(n, use_gpu):
    """Fork ``n`` ranks and build the symbolic-shape CNN's training step, a
    function of shape-computed outputs, and a loss over sliceable shared data."""
    synk.fork(n, use_gpu=use_gpu)
    fx = pytensor.config.floatX
    kwargs = {} if use_gpu else {"mode": "JAX"}  # GPU ranks compile with JAX by default
    ns = types.SimpleNamespace(n=n, fx=fx)
    x, y = pt.tensor4("x", dtype=fx), pt.matrix("y", dtype=fx)
    ns.params = cnn_params(np.random.default_rng(3), fx)
    ns.step = train.make_train_step([x, y], cnn_loss(x, y, ns.params), ns.params, rule=updates.adam,
                                    learning_rate=0.05, function_kwargs=kwargs)
    rx, ry = pt.tensor4("x", dtype=fx), pt.matrix("y", dtype=fx)
    ns.ref_params = cnn_params(np.random.default_rng(3), fx)
    ns.ref_step = _plain_adam_step(rx, ry, cnn_loss(rx, ry, ns.ref_params), ns.ref_params)
    xs = pt.tensor4("xs", dtype=fx)
    ns.shapes = synk.function([xs], outputs=[(o, "sum") for o in shape_graphs(xs)[:3]], **kwargs)
    ns.shapes_ref = pytensor.function([xs], shape_graphs(xs)[:3])
    ns.sx = pytensor.shared(np.zeros((1, 2, 6, 6), dtype=fx), name="sx")
    ns.sy = pytensor.shared(np.zeros((1, CLASSES), dtype=fx), name="sy")
    ns.shared_loss = synk.function([], outputs=cnn_loss(ns.sx, ns.sy, ns.params),
                                   sliceable_shareds=[ns.sx, ns.sy], **kwargs)
    synk.distribute()
    ns.x, ns.y = data(np.random.default_rng(4), ROWS, fx=fx)
    ns.dx, ns.dy = synk.data(ns.x), synk.data(ns.y)
    return ns


def _plain_adam_step(x, y, loss, params):
    """Adam on the whole batch in one process, with PyTensor's default linker."""
    _, param_updates, grad_shared = updates.adam(loss, params, learning_rate=0.05)
    flat = updates.flat_gradient(loss, params)
    grad_fn = pytensor.function([x, y], loss, updates=[(grad_shared, flat)])
    update_fn = pytensor.function([], updates=param_updates)

    def step(xv, yv):
        value = grad_fn(xv, yv)
        update_fn()
        return value

    return step


@pytest.fixture(scope="module")
def env():
    yield make_env(2, use_gpu=False)
    synk.close()


def test_symbolic_cnn_trains_like_one_process(env):
    """Every step changes the rows each rank sees (uneven splits, slices, a short
    last batch); the parameters follow one process's within float32 accuracy."""
    for batch, num_slices in STEPS:
        rows = np.arange(ROWS)[batch] if batch is not None else np.arange(ROWS)
        loss = env.step(env.dx, env.dy, batch=batch, num_slices=num_slices)
        ref_loss = env.ref_step(env.x[rows], env.y[rows])
        close(loss, ref_loss, rtol=1e-5)
        for p, rp in zip(env.params, env.ref_params):
            close(p.get_value(), rp.get_value(), rtol=1e-4, atol=1e-6)
            for r in range(env.n):
                close(synk.get_value(r, p), rp.get_value(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("batch,num_slices", [(None, 1), (slice(2, 19), 3), ([3, 1, 4, 1, 5], 1)])
def test_shape_computed_outputs(env, batch, num_slices):
    """Sizes computed from each rank's rows, summed over ranks, equal the sums of
    one process's values over the same split."""
    from synkhronos._common.selections import split_bounds

    rows = np.arange(ROWS)[batch] if batch is not None else np.arange(ROWS)
    got = env.shapes(env.dx, batch=batch, num_slices=num_slices)
    want = None
    for a, b in split_bounds(len(rows), env.n):
        for c, d in split_bounds(b - a, num_slices):
            part = env.shapes_ref(env.x[rows[a:b][c:d]])
            want = part if want is None else [w + p for w, p in zip(want, part)]
    for g, w in zip(got, want):
        close(g, w)


def test_sliceable_shareds_with_symbolic_shapes(env):
    """``batch_s`` on image data in shared variables of unknown shape."""
    synk.scatter([env.sx, env.sy], [env.x, env.y])
    per_rank = [[0, 2, 3], [1, 4]]
    got = env.shared_loss(batch_s=per_rank, num_slices=1)
    from synkhronos._common.selections import split_bounds

    x, y = pt.tensor4("x", dtype=env.fx), pt.matrix("y", dtype=env.fx)
    ref = pytensor.function([x, y], cnn_loss(x, y, env.params))
    losses, weights = [], []
    for (a, _), sel in zip(split_bounds(ROWS, env.n), per_rank):
        rows = np.asarray(sel) + a
        losses.append(ref(env.x[rows], env.y[rows]))
        weights.append(len(rows))
    close(got, np.average(losses, weights=weights), rtol=1e-5)

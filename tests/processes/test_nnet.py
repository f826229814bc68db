"""conv2d and pooling Ops: forward against naive loops, gradients with verify_grad,
the native Numba and the JAX implementations against numpy, and a data-parallel
CNN gradient against one process."""

import importlib.util

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad

import synkhronos as synk
from synkhronos.extensions.nnet import avg_pool2d, conv2d, max_pool2d

HAS_JAX = importlib.util.find_spec("jax") is not None
F = "float64"


def naive_conv(x, w, stride, pad, dil):
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dil
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    for a in range(oh):
        for b in range(ow):
            for i in range(kh):
                for j in range(kw):
                    out[:, :, a, b] += xp[:, :, a * sh + i * dh, b * sw + j * dw] @ w[:, :, i, j].T
    return out


def naive_pool(x, size, stride, pad, mode):
    (kh, kw), (sh, sw), (ph, pw) = size, stride, pad
    fill = -np.inf if mode == "max" else 0
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    oh = (x.shape[2] + 2 * ph - kh) // sh + 1
    ow = (x.shape[3] + 2 * pw - kw) // sw + 1
    out = np.zeros(x.shape[:2] + (oh, ow))
    for a in range(oh):
        for b in range(ow):
            win = xp[:, :, a * sh:a * sh + kh, b * sw:b * sw + kw]
            out[:, :, a, b] = win.max(axis=(2, 3)) if mode == "max" else win.mean(axis=(2, 3))
    return out


CONVS = [  # (stride, padding argument, padding as pairs, dilation)
    (1, 0, (0, 0), 1),
    (2, 1, (1, 1), 1),
    ((1, 2), (2, 1), (2, 1), (2, 1)),
    (1, "same", (1, 1), 1),
    (1, "valid", (0, 0), 2),
]


def _conv_graph(stride, padding, dil, w_value):
    x = pt.tensor4("x", dtype=F)
    w = pytensor.shared(w_value, name="w", shape=w_value.shape)
    return x, w, conv2d(x, w, stride=stride, padding=padding, dilation=dil)


@pytest.mark.parametrize("stride,padding,pairs,dil", CONVS)
def test_conv2d_forward_matches_naive(stride, padding, pairs, dil):
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((2, 3, 9, 8))
    wv = rng.standard_normal((4, 3, 3, 3))
    x, w, y = _conv_graph(stride, padding, dil, wv)
    def pair(v):
        return ((v, v) if isinstance(v, int) else v)
    got = pytensor.function([x], y)(xv)
    np.testing.assert_allclose(got, naive_conv(xv, wv, pair(stride), pairs, pair(dil)), rtol=1e-10)
    if padding == "same":
        assert got.shape[2:] == xv.shape[2:]


def _block_diagonal(w, groups):
    """Dense filters equal to grouped filters ``w``: zero across groups."""
    o, cg = w.shape[:2]
    og = o // groups
    dense = np.zeros((o, cg * groups) + w.shape[2:])
    for k in range(groups):
        dense[k * og:(k + 1) * og, k * cg:(k + 1) * cg] = w[k * og:(k + 1) * og]
    return dense


@pytest.mark.parametrize("groups,c,o", [(2, 4, 6), (3, 3, 3), (3, 3, 6)])  # (3, 3, *): depthwise
def test_grouped_conv2d_matches_dense_block_diagonal(groups, c, o):
    rng = np.random.default_rng(6)
    xv = rng.standard_normal((2, c, 7, 6))
    wv = rng.standard_normal((o, c // groups, 3, 2))
    x = pt.tensor4("x", dtype=F)
    w = pt.tensor4("w", dtype=F)
    got = pytensor.function([x, w], conv2d(x, w, stride=(1, 2), padding=1, groups=groups))(xv, wv)
    want = naive_conv(xv, _block_diagonal(wv, groups), (1, 2), (1, 1), (1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    verify_grad(lambda a, b: conv2d(a, b, stride=(1, 2), padding=1, groups=groups), [xv, wv], rng=rng)


@pytest.mark.parametrize("stride,dil,pad", [(1, 1, 0), (2, 1, 1), (1, 2, (1, 0))])
def test_conv2d_gradients(stride, dil, pad):
    rng = np.random.default_rng(1)
    xv = rng.standard_normal((2, 2, 7, 6))
    wv = rng.standard_normal((3, 2, 3, 2))
    verify_grad(lambda x, w: conv2d(x, w, stride=stride, padding=pad, dilation=dil), [xv, wv], rng=rng)


@pytest.mark.parametrize("mode,pool", [("max", max_pool2d), ("avg", avg_pool2d)])
@pytest.mark.parametrize("size,stride,pad", [(2, None, 0), (3, 2, 1), ((3, 2), (1, 2), (1, 0))])
def test_pool_forward_and_gradient(mode, pool, size, stride, pad):
    rng = np.random.default_rng(2)
    xv = rng.standard_normal((2, 3, 7, 8))  # distinct values: the max is unique
    x = pt.tensor4("x", dtype=F)
    def pair(v):
        return ((v, v) if isinstance(v, int) else v)
    got = pytensor.function([x], pool(x, size, stride, pad))(xv)
    s = pair(size)
    np.testing.assert_allclose(got, naive_pool(xv, s, s if stride is None else pair(stride), pair(pad), mode))
    verify_grad(lambda v: pool(v, size, stride, pad), [xv], rng=rng)


def _cnn(x, w1, w2):
    h = pt.maximum(conv2d(x, w1, padding="same"), 0)
    h = max_pool2d(h, 2)
    h = avg_pool2d(conv2d(h, w2, stride=1, padding=1, groups=2), 2, stride=1)
    return (h ** 2).mean()


def _cnn_case(rng):
    xv = rng.standard_normal((6, 2, 8, 8)).astype(F)
    w1 = rng.standard_normal((4, 2, 3, 3)).astype(F)
    w2 = rng.standard_normal((6, 2, 3, 3)).astype(F)  # 2 groups of 2 channels
    return xv, w1, w2


def _cnn_results(mode, xv, w1v, w2v):
    x = pt.tensor4("x", dtype=F)
    w1 = pytensor.shared(w1v, shape=w1v.shape)
    w2 = pytensor.shared(w2v, shape=w2v.shape)
    loss = _cnn(x, w1, w2)
    return pytensor.function([x], [loss] + pytensor.grad(loss, [x, w1, w2]), mode=mode)(xv)


# Each Op of the CNN above (its convolutions and pools, with their pullbacks): the
# native Numba kernels alone, compiled without rewrites, so that a cold machine
# compiles the kernels rather than the elementwise graph around them.
_NUMBA_CASES = [
    ("conv same", lambda x, w: conv2d(x, w, padding="same"), (6, 2, 8, 8), (4, 2, 3, 3)),
    ("conv groups", lambda x, w: conv2d(x, w, stride=2, padding=1, dilation=(1, 2), groups=2),
     (6, 4, 8, 8), (6, 2, 3, 3)),
    ("max pool", lambda x, w: max_pool2d(x, 2), (6, 4, 8, 8), None),
    ("avg pool", lambda x, w: avg_pool2d(x, 3, stride=2, padding=1), (6, 4, 8, 8), None),
]


def _op_and_pullback(make, xshape, wshape, linker, rng):
    from pytensor.compile.mode import Mode

    x = pt.tensor("x", dtype=F, shape=xshape)
    w = pt.tensor("w", dtype=F, shape=wshape or (1, 1, 1, 1))
    y = make(x, w)
    node = y.owner
    gy = pt.tensor4("gy", dtype=F)
    outputs = [y] + node.op.L_op(node.inputs, node.outputs, [gy])
    inputs = [x, w, gy] if wshape else [x, gy]
    fn = pytensor.function(inputs, outputs, mode=Mode(linker=linker, optimizer=None))
    assert all(type(n.op).__module__ == "synkhronos.extensions.nnet"
               for n in fn.maker.fgraph.apply_nodes), fn.maker.fgraph.apply_nodes
    values = [rng.standard_normal(xshape)] + ([rng.standard_normal(wshape)] if wshape else [])
    shape = [int(d) for d in node.op.infer_shape(None, node, [xshape, wshape])[0]]
    return fn(*values, rng.standard_normal(shape))


@pytest.mark.parametrize("case", _NUMBA_CASES, ids=[c[0] for c in _NUMBA_CASES])
def test_numba_implementation_matches_numpy(case):
    _, make, xshape, wshape = case
    ref = _op_and_pullback(make, xshape, wshape, "py", np.random.default_rng(3))  # numpy perform
    got = _op_and_pullback(make, xshape, wshape, "numba", np.random.default_rng(3))
    assert len(got) == len(ref)
    for r, e in zip(got, ref):
        np.testing.assert_allclose(r, e, rtol=1e-8, atol=1e-10)


@pytest.mark.skipif(not HAS_JAX, reason="JAX not installed")
def test_jax_implementation_matches_numpy():
    import jax

    xv, w1, w2 = _cnn_case(np.random.default_rng(4))
    ref = _cnn_results("FAST_COMPILE", xv, w1, w2)
    with jax.default_matmul_precision("highest"):
        got = _cnn_results("JAX", xv.astype("float32"), w1.astype("float32"), w2.astype("float32"))
    for r, e in zip(got, ref):
        np.testing.assert_allclose(np.asarray(r), e, rtol=2e-4, atol=2e-5)


@pytest.mark.skipif(not HAS_JAX, reason="JAX not installed")
def test_jax_channels_last_layout_matches_numpy(monkeypatch):
    """SYNKHRONOS_CONV_LAYOUT=NHWC hands XLA transposed operands: same numbers."""
    import jax

    from synkhronos.extensions import nnet

    xv, w1, w2 = _cnn_case(np.random.default_rng(6))
    ref = _cnn_results("FAST_COMPILE", xv, w1, w2)
    monkeypatch.setenv(nnet.LAYOUT_ENV, "nhwc")
    assert nnet.jax_conv_layout() == "NHWC"
    with jax.default_matmul_precision("highest"):
        got = _cnn_results("JAX", xv.astype("float32"), w1.astype("float32"), w2.astype("float32"))
    for r, e in zip(got, ref):
        np.testing.assert_allclose(np.asarray(r), e, rtol=2e-4, atol=2e-5)
    monkeypatch.setenv(nnet.LAYOUT_ENV, "NWHC")
    with pytest.raises(ValueError, match="SYNKHRONOS_CONV_LAYOUT must be one of NCHW, NHWC, got 'NWHC'"):
        _cnn_results("JAX", xv.astype("float32"), w1.astype("float32"), w2.astype("float32"))


@pytest.mark.skipif(not HAS_JAX, reason="JAX not installed")
@pytest.mark.parametrize("size,stride,pad", [(3, 2, 1), (2, None, 0), ((3, 2), (1, 2), (1, 0)), (3, 1, 1),
                                             ((1, 3), (2, 1), (0, 1))])
def test_jax_max_pool_gradient_routes_ties_like_numpy(size, stride, pad):
    """JAX's max-pooling gradient (a gather) gives each window's cotangent to its
    first maximum, as the numpy kernel does: inputs with many ties (small integers,
    and all zeros), overlapping and non-overlapping windows, padding."""
    rng = np.random.default_rng(8)
    x, c = pt.tensor4("x", dtype="float32"), pt.tensor4("c", dtype="float32")
    y = max_pool2d(x, size, stride, pad)
    grad = pytensor.grad((y * c).sum(), x)
    fs = [pytensor.function([x, c], [y, grad], mode=m) for m in ("FAST_COMPILE", "JAX")]
    for xv in (np.round(rng.standard_normal((2, 3, 9, 8)) * 2), np.zeros((2, 3, 9, 8))):
        xv = xv.astype("float32")
        cv = rng.standard_normal(fs[0](xv, np.zeros((1, 1, 1, 1), "float32"))[0].shape).astype("float32")
        (want_y, want_g), (got_y, got_g) = [f(xv, cv) for f in fs]
        np.testing.assert_array_equal(np.asarray(got_y), want_y)
        np.testing.assert_allclose(np.asarray(got_g), want_g, rtol=1e-6, atol=1e-6)
        assert np.count_nonzero(want_g) <= cv.size  # each window's cotangent goes to one element


def test_bad_arguments():
    x = pt.tensor4("x")
    with pytest.raises(TypeError, match="ndim=3"):
        conv2d(pt.tensor3("t"), pt.tensor4("w"))
    with pytest.raises(ValueError, match="padding"):
        conv2d(x, pt.tensor4("w"), padding="full")
    with pytest.raises(ValueError, match="static shape"):
        conv2d(x, pt.tensor4("w"), padding="same")
    with pytest.raises(ValueError, match="stride"):
        max_pool2d(x, 2, stride=(1, 2, 3))
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="groups must be a positive int, got %r" % (bad,)):
            conv2d(x, pt.tensor4("w"), groups=bad)
    with pytest.raises(ValueError, match="groups=2 does not fit the input's 3 channels"):
        conv2d(pt.tensor("x", shape=(None, 3, None, None)), pt.tensor("w", shape=(4, 1, 3, 3)), groups=2)
    # Shapes known only when the function runs: the kernels check them.
    f = pytensor.function([x, w := pt.tensor4("w")], conv2d(x, w, groups=2), mode="FAST_COMPILE")
    with pytest.raises(ValueError, match="groups=2 does not fit the input's 4 channels, the filters' 3"):
        f(np.zeros((1, 4, 5, 5), x.dtype), np.zeros((3, 2, 3, 3), x.dtype))


def test_cnn_gradient_on_workers_equals_one_process():
    xv, w1v, w2v = _cnn_case(np.random.default_rng(5))
    synk.fork(3, use_gpu=False)  # 6 rows: 2 per rank
    try:
        fx = pytensor.config.floatX
        x = pt.tensor4("x", dtype=fx)
        w1 = pytensor.shared(w1v.astype(fx), shape=w1v.shape)
        w2 = pytensor.shared(w2v.astype(fx), shape=w2v.shape)
        loss = _cnn(x, w1, w2)
        f = synk.function([x], outputs=[loss] + pytensor.grad(loss, [w1, w2]))
        ref = pytensor.function([x], [loss] + pytensor.grad(loss, [w1, w2]))
        synk.distribute()
        got = f(synk.data(xv.astype(fx)), num_slices=2)
        for g, e in zip(got, ref(xv.astype(fx))):
            np.testing.assert_allclose(g, e, rtol=2e-4, atol=1e-5)
    finally:
        synk.close()


def test_batch_norm_and_cross_entropy_match_numpy():
    from synkhronos.extensions.nnet import batch_norm, log_softmax, softmax_cross_entropy

    rng = np.random.default_rng(6)
    xv = rng.standard_normal((4, 3, 5, 5)) * 3 + 1
    g, b = rng.standard_normal(3), rng.standard_normal(3)
    x = pt.tensor4("x", dtype=F)
    gv, bv = pt.vector("g", dtype=F), pt.vector("b", dtype=F)
    got = pytensor.function([x, gv, bv], batch_norm(x, gv, bv))(xv, g, b)
    mean = xv.mean(axis=(0, 2, 3), keepdims=True)
    var = xv.var(axis=(0, 2, 3), keepdims=True)
    expected = (xv - mean) / np.sqrt(var + 1e-5) * g[None, :, None, None] + b[None, :, None, None]
    np.testing.assert_allclose(got, expected, rtol=1e-10)

    # float32 with a mean far from zero: the one-pass statistics must not cancel, and the
    # gradient must be the two-pass formula's (computed here in float64).
    x32 = (rng.standard_normal((8, 3, 6, 6)) + [[[[1000.0]], [[-300.0]], [[0.0]]]]).astype("float32")
    up = rng.standard_normal(x32.shape)  # the cotangent
    xs = pt.tensor4("xs", dtype="float32")
    y = batch_norm(xs, pt.constant(g.astype("float32")), pt.constant(b.astype("float32")))
    got32, grad32 = pytensor.function([xs], [y, pytensor.grad((y * up.astype("float32")).sum(), xs)])(x32)
    ref = x32.astype(np.float64)
    m, v = ref.mean(axis=(0, 2, 3), keepdims=True), ref.var(axis=(0, 2, 3), keepdims=True)
    expected32 = (ref - m) / np.sqrt(v + 1e-5) * g[None, :, None, None] + b[None, :, None, None]
    np.testing.assert_allclose(got32, expected32, rtol=1e-4, atol=1e-4)
    x64 = pt.tensor4("x64", dtype="float64")
    two_pass = (x64 - x64.mean(axis=(0, 2, 3), keepdims=True)) / pt.sqrt(
        x64.var(axis=(0, 2, 3), keepdims=True) + 1e-5) * g[None, :, None, None] + b[None, :, None, None]
    ref_grad = pytensor.function([x64], pytensor.grad((two_pass * up).sum(), x64))(ref)
    np.testing.assert_allclose(grad32, ref_grad, rtol=1e-3, atol=1e-3)

    logits = rng.standard_normal((6, 4)) * 50  # large: needs the stable form
    targets = np.eye(4)[rng.integers(0, 4, 6)]
    lv, tv = pt.matrix("l", dtype=F), pt.matrix("t", dtype=F)
    lp, ce = pytensor.function([lv, tv], [log_softmax(lv), softmax_cross_entropy(lv, tv)])(logits, targets)
    shifted = logits - logits.max(axis=1, keepdims=True)
    ref_lp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(lp, ref_lp, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ce, -(targets * ref_lp).sum(axis=1).mean(), rtol=1e-10, atol=1e-12)


def test_every_differentiable_op_answers_pytensor_2s_gradient_call():
    """PyTensor 3 asks an Op for ``pullback``, PyTensor 2.x (which PyMC pins) for
    ``L_op``; PyTensor 3's own ``L_op`` would forward to ``pullback``, so only
    the override shows that 2.x gets the gradient too.  Each op's ``L_op`` must
    build the graph ``pullback`` builds."""
    from pytensor.graph.basic import equal_computations
    from pytensor.graph.op import Op

    from synkhronos.extensions import nnet

    ops = [v for v in vars(nnet).values() if isinstance(v, type) and issubclass(v, Op)]
    differentiable = [op for op in ops if op.__module__ == nnet.__name__ and "pullback" in vars(op)]
    assert {op.__name__ for op in differentiable} >= {"Conv2d", "Pool2d"}
    for op in differentiable:
        assert op.L_op is not Op.L_op, op.__name__
    x = pt.tensor4("x", dtype=F)
    for y in (max_pool2d(x, 2), conv2d(x, pt.tensor4("w", dtype=F))):
        node, gy = y.owner, pt.tensor4("gy", dtype=F)
        assert equal_computations(node.op.L_op(node.inputs, node.outputs, [gy]),
                                  node.op.pullback(node.inputs, node.outputs, [gy]))


def test_categorical_crossentropy_is_theanos():
    """The porting table's mapping of ``T.nnet.categorical_crossentropy(p, y)``:
    probabilities and integer labels or one-hot targets, one value per row
    (Theano's definition, written in numpy here); its mean over one-hot targets is
    ``softmax_cross_entropy`` of the logits."""
    from synkhronos.extensions.nnet import categorical_crossentropy, softmax_cross_entropy

    rng = np.random.default_rng(5)
    logits_np = rng.standard_normal((7, 4))
    p_np = np.exp(logits_np) / np.exp(logits_np).sum(axis=1, keepdims=True)
    y_np = rng.integers(0, 4, 7)
    onehot_np = np.eye(4)[y_np]
    want = -np.log(p_np[np.arange(7), y_np])
    p, logits = pt.matrix("p", dtype="float64"), pt.matrix("logits", dtype="float64")
    labels, onehot = pt.vector("y", dtype="int64"), pt.matrix("t", dtype="float64")
    f = pytensor.function([p, labels, onehot, logits],
                          [categorical_crossentropy(p, labels), categorical_crossentropy(p, onehot),
                           softmax_cross_entropy(logits, onehot)])
    by_label, by_onehot, from_logits = f(p_np, y_np, onehot_np, logits_np)
    np.testing.assert_allclose(by_label, want, rtol=1e-12)
    np.testing.assert_allclose(by_onehot, want, rtol=1e-12)
    np.testing.assert_allclose(from_logits, want.mean(), rtol=1e-12)
    with pytest.raises(TypeError, match="targets must be .* integer labels .* dtype=float64"):
        categorical_crossentropy(p, pt.vector("y", dtype="float64"))

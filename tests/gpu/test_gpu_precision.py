"""float32 on GPU ranks means float32: by default every rank computes matrix
products in full float32 and matches PyTensor on the CPU with ``np.allclose``
defaults; ``fork(precision='tf32')`` is the stated choice of TensorFloat-32, on
every rank.  An ordinary float32 script prints no warnings."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk

ROWS, K = 64, 512


def _per_rank_products(precision, caplog):
    """Each rank's sum of products over its ``batch_s`` rows (reduce mode None),
    and plain PyTensor on the CPU over the same rows."""
    caplog.set_level("INFO", logger="synkhronos")  # the status line is a log record
    synk.fork(2, use_gpu=True, precision=precision)
    try:
        assert "precision: %s" % precision in caplog.text
        rng = np.random.default_rng(0)
        xv = rng.standard_normal((2 * ROWS, K)).astype("float32")
        wv = rng.standard_normal((K, 16)).astype("float32")
        x = pytensor.shared(np.zeros((1, K), "float32"), name="x")
        w = pytensor.shared(wv, name="w")
        f = synk.function([], outputs=(x.dot(w).sum(axis=0), None), sliceable_shareds=[x])
        synk.distribute()
        synk.scatter(x, xv)
        sel = [[0, 5, 9, 33, 40, 63], [1, 2, 3, 60]]
        got = f(batch_s=sel)
        xs, ws = pt.matrix("xs"), pt.matrix("ws")
        ref = pytensor.function([xs, ws], xs.dot(ws).sum(axis=0))
        want = [ref(xv[r * ROWS:(r + 1) * ROWS][sel[r]], wv) for r in range(2)]
        return got, want
    finally:
        synk.close()


def test_default_is_full_float32_on_every_rank(caplog):
    got, want = _per_rank_products("highest", caplog)
    for g, w in zip(got, want):
        assert np.allclose(g, w), np.abs(g - w).max()


def test_tf32_is_used_on_every_rank_when_asked(caplog):
    got, want = _per_rank_products("tf32", caplog)
    for g, w in zip(got, want):  # TensorFloat-32 keeps 10 mantissa bits: ~1e-3 relative
        assert not np.allclose(g, w)
        np.testing.assert_allclose(g, w, rtol=5e-2, atol=0.5)


def test_bad_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be 'highest' .* got 'fp16'"):
        synk.fork(2, use_gpu=True, precision="fp16")


SCRIPT = textwrap.dedent("""
    import numpy as np, pytensor, pytensor.tensor as pt
    import synkhronos as synk
    from synkhronos.extensions import nnet, train, updates

    pytensor.config.floatX = "float32"
    synk.fork(2)
    rng = np.random.default_rng(0)
    x, y = pt.tensor4("x"), pt.matrix("y")
    w = pytensor.shared((0.3 * rng.standard_normal((4, 2, 3, 3))).astype("float32"))
    v = pytensor.shared((0.2 * rng.standard_normal((36, 3))).astype("float32"))
    h = nnet.max_pool2d(pt.maximum(nnet.conv2d(x, w, padding=1), 0), 2).flatten(2).dot(v)
    srng = pytensor.shared(np.random.default_rng(1))
    next_rng, keep = pt.random.bernoulli(0.9, size=h.shape, rng=srng, return_next_rng=True)
    loss = nnet.softmax_cross_entropy(h * keep / 0.9, y).mean()
    step = train.make_train_step([x, y], loss, [w, v], rule=updates.adam, learning_rate=0.01)
    drop = synk.function([x], outputs=(keep.sum(), "sum"), updates=[(srng, next_rng)])
    pred = synk.function([x], outputs=[(pt.argmax(h, axis=1), None), (h.shape[0], "sum")])
    synk.distribute()
    xd = synk.data(rng.standard_normal((23, 2, 6, 6)).astype("float32"))
    yd = synk.data(np.eye(3, dtype="float32")[rng.integers(0, 3, 23)])
    for batch in (None, slice(0, 17), [3, 1, 4, 1, 5]):
        step(xd, yd, batch=batch)
    labels, rows = pred(xd)
    assert 0 < drop(xd) < 23 * 3
    assert [a.dtype for a in labels] == ["int64", "int64"] and int(rows) == 23, (labels, rows)
    assert w.get_value().dtype == "float32"
    print("script done")
""")


def test_float32_script_prints_no_warnings(tmp_path):
    """A symbolic-shape CNN with dropout trained on 2 GPUs, with int64 outputs:
    nothing on stderr from any rank, and int64 outputs come back as int64."""
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    env = dict(os.environ)
    env.pop("PYTENSOR_FLAGS", None)  # the user's defaults, not the suite's FAST_COMPILE
    env["PYTENSOR_FLAGS"] = "compiledir=%s" % (tmp_path / "compiledir")
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "script done" in proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr

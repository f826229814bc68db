"""Update rules and training steps: n ranks train exactly like one process on the
concatenated batch (same parameters after k steps), also for uneven splits."""

import types

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.extensions import train, updates

RULES = {
    "sgd": (updates.sgd, dict(learning_rate=0.5)),
    "momentum": (updates.momentum, dict(learning_rate=0.3, momentum=0.8)),
    "nesterov_momentum": (updates.nesterov_momentum, dict(learning_rate=0.3, momentum=0.8)),
    "adagrad": (updates.adagrad, dict(learning_rate=0.2)),
    "rmsprop": (updates.rmsprop, dict(learning_rate=0.05)),
    "adadelta": (updates.adadelta, dict(learning_rate=1.0)),
    "adam": (updates.adam, dict(learning_rate=0.05)),
    "adamax": (updates.adamax, dict(learning_rate=0.05)),
}
ROWS, N_IN, N_OUT = 23, 5, 3
# (batch, num_slices) of the 5 steps: all rows, a shuffled index list, a sliced slice,
# 2 rows (so that one rank gets none after having had some), and all rows in 3 slices.
STEPS = [(None, 1), ([4, 17, 0, 9, 9, 22, 13, 2, 6, 11], 1), (slice(3, 20), 2), ([5, 7], 1), (None, 3)]


def _softmax_loss(x, y, params):
    w, b = params
    logits = x.dot(w) + b
    return -(y * (logits - pt.logsumexp(logits, axis=1, keepdims=True))).sum(axis=1).mean()


def model(rng):
    fx = pytensor.config.floatX
    w = pytensor.shared(rng.standard_normal((N_IN, N_OUT)).astype(fx), name="W")
    b = pytensor.shared(np.zeros(N_OUT, dtype=fx), name="b")
    x = pt.matrix("x")
    y = pt.matrix("y")
    return x, y, [w, b], _softmax_loss(x, y, [w, b])


def make_env(n, use_gpu):
    """Fork ``n`` ranks, build a training step per rule and its reference, distribute."""
    synk.fork(n, use_gpu=use_gpu)
    fx = pytensor.config.floatX
    rng = np.random.default_rng(5)
    ns = types.SimpleNamespace(steps={}, refs={})
    for name, (rule, kw) in RULES.items():
        seed = int(rng.integers(1 << 30))
        x, y, params, loss = model(np.random.default_rng(seed))
        ns.steps[name] = (train.make_train_step([x, y], loss, params, rule=rule, **kw), params)
        # The same rule in one process, on its own copy of the parameters.
        rx, ry, rparams, rloss = model(np.random.default_rng(seed))
        grad_updates, param_updates, _ = rule(rloss, rparams, **kw)
        (gs, flat, _op), = grad_updates
        ns.refs[name] = (pytensor.function([rx, ry], rloss, updates=[(gs, flat)]),
                         pytensor.function([], updates=param_updates), rparams)
    # The rule's own pieces used by hand, as the seed describes (equal splits of 24 rows).
    x, y, params, loss = model(np.random.default_rng(1))
    grad_updates, param_updates, grad_shared = updates.adam(loss, params, learning_rate=0.05)
    ns.manual = (synk.function([x, y], outputs=loss, updates=grad_updates),
                 synk.function([], updates=param_updates), grad_shared, params)
    rx, ry, rparams, rloss = model(np.random.default_rng(1))
    gu, pu, _ = updates.adam(rloss, rparams, learning_rate=0.05)
    ns.manual_ref = (pytensor.function([rx, ry], rloss, updates=[gu[0][:2]]),
                     pytensor.function([], updates=pu), rparams)
    synk.distribute()
    ns.x = rng.standard_normal((24, N_IN)).astype(fx)
    ns.y = np.eye(N_OUT, dtype=fx)[rng.integers(0, N_OUT, 24)]
    ns.dx, ns.dy = synk.data(ns.x[:ROWS]), synk.data(ns.y[:ROWS])
    ns.n = n
    return ns


@pytest.fixture(scope="module")
def env():
    yield make_env(3, use_gpu=False)
    synk.close()


@pytest.mark.parametrize("name", list(RULES))
def test_rule_trains_like_one_process(env, name):
    step, params = env.steps[name]
    f_grad, f_update, rparams = env.refs[name]
    for batch, num_slices in STEPS:
        rows = np.arange(ROWS) if batch is None else np.arange(ROWS)[batch]
        loss = step(env.dx, env.dy, batch=batch, num_slices=num_slices)
        ref_loss = f_grad(env.x[rows], env.y[rows])
        f_update()
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for p, rp in zip(params, rparams):
        assert not np.allclose(rp.get_value(), 0) or p.name == "b"
        np.testing.assert_allclose(p.get_value(), rp.get_value(), rtol=1e-4, atol=1e-6)
        for r in range(env.n):  # every rank holds the same parameters
            np.testing.assert_allclose(synk.get_value(r, p), rp.get_value(), rtol=1e-4, atol=1e-6)


def test_rule_pieces_by_hand(env):
    f_grad, f_update, grad_shared, params = env.manual
    r_grad, r_update, rparams = env.manual_ref
    dx, dy = synk.data(env.x), synk.data(env.y)  # 24 rows: equal parts on 2 or 3 ranks
    for _ in range(2):
        f_grad(dx, dy)
        synk.all_reduce(grad_shared, op="avg")
        f_update()
        r_grad(env.x, env.y)
        r_update()
    for p, rp in zip(params, rparams):
        np.testing.assert_allclose(p.get_value(), rp.get_value(), rtol=1e-4, atol=1e-5)


def test_flat_gradient_and_unflatten():
    fx = pytensor.config.floatX
    a = pytensor.shared(np.ones((2, 3), dtype=fx))
    b = pytensor.shared(np.ones(4, dtype=fx))
    flat = pt.vector("flat")
    views = updates.unflatten(flat, [a, b])
    f = pytensor.function([flat], views)
    va, vb = f(np.arange(10, dtype=flat.dtype))
    np.testing.assert_array_equal(va, np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(vb, np.arange(6, 10))
    g = pytensor.function([], updates.flat_gradient((a ** 2).sum() + 3 * b.sum(), [a, b]))
    np.testing.assert_allclose(g(), [2] * 6 + [3] * 4)
    with pytest.raises(ValueError, match="2 params"):
        updates.flat_gradient([a], [a, b])


def test_rule_outputs():
    fx = pytensor.config.floatX
    w = pytensor.shared(np.ones((3, 2), dtype=fx))
    grad_updates, param_updates, grad_shared = updates.momentum((w ** 2).sum(), [w])
    assert grad_shared.get_value().shape == (6,)
    assert grad_updates[0][0] is grad_shared and grad_updates[0][2] == "avg"
    assert any(p is w for p, _ in param_updates)
    with pytest.raises(ValueError, match="params"):
        updates.sgd((w ** 2).sum(), [])


def test_make_train_step_needs_inputs():
    x, y, params, loss = model(np.random.default_rng(0))
    with pytest.raises(TypeError, match="sliceable shared"):
        train.make_train_step([], loss, params)


@pytest.mark.parametrize("queued", [False, True])
def test_step_on_no_rows_raises_and_keeps_parameters_finite(queued, monkeypatch):
    """With no rows anywhere the step raises.  On a queued device (calls without
    results are posted) the update has run by then, with a zero gradient, and
    must not write NaN into the parameters."""
    synk.close()
    synk.fork(2, use_gpu=False)
    try:
        fx = pytensor.config.floatX
        rng = np.random.default_rng(3)
        data_x = pytensor.shared(rng.standard_normal((6, N_IN)).astype(fx), name="data_x")
        data_y = pytensor.shared(np.eye(N_OUT, dtype=fx)[rng.integers(0, N_OUT, 6)], name="data_y")
        _, _, params, _ = model(rng)
        step = train.make_train_step([], _softmax_loss(data_x, data_y, params), params,
                                     sliceable_shareds=[data_x, data_y], learning_rate=0.5)
        synk.distribute()
        monkeypatch.setattr(synk._session.runtime.current().device, "queued", queued)
        before = params[0].get_value()
        assert np.isfinite(step(batch_s=slice(0, 3)))
        moved = [p.get_value() for p in params]
        assert not np.allclose(moved[0], before)
        with pytest.raises(ValueError, match="no rows"):
            step(batch_s=slice(0, 0))
        for r in range(2):
            for p, m in zip(params, moved):
                np.testing.assert_allclose(synk.get_value(r, p), m, rtol=1e-6)
    finally:
        synk.close()

"""First-order update rules for data-parallel training.

Every rule splits a training step in two, as data parallelism needs:

1. ``grad_updates`` write the raw gradients of all parameters into **one flat
   shared vector** ``grad_shared`` (used in the function that sees the data);
2. the ranks combine it with one collective, e.g. ``synk.all_reduce(grad_shared)``
   (one large NCCL call is faster than one per parameter);
3. ``param_updates`` update the parameters (and the rule's state) from the
   combined vector, reshaped back into each parameter's shape.

Each rule returns ``(grad_updates, param_updates, grad_shared)``.  The formulas
are the usual ones (those of Lasagne's ``updates`` module).  ``grad_updates``
use the ``"avg"`` slice operation, so a call with ``num_slices`` still writes the
mean gradient over the rank's rows.  ``grad_scale`` (a symbolic scalar) multiplies
the combined gradient before it is used; ``synkhronos.extensions.train`` uses it
to turn summed gradients into exact means over uneven splits.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt

__all__ = [
    "flat_gradient",
    "unflatten",
    "sgd",
    "momentum",
    "nesterov_momentum",
    "adagrad",
    "rmsprop",
    "adadelta",
    "adam",
    "adamax",
]


def _shapes(params):
    return [tuple(p.get_value(borrow=True).shape) for p in params]


def flat_gradient(loss_or_grads, params):
    """The gradients of all ``params`` as one flat symbolic vector.

    Parameters
    ----------
    loss_or_grads : scalar Variable or list of Variable
        A loss to differentiate, or the gradients themselves.
    params : list of SharedVariable

    Returns
    -------
    Variable
        1-d, of dtype ``floatX``, with ``sum(p.size)`` entries in parameter order.

    Raises
    ------
    ValueError
        If a list of gradients does not match ``params``.
    """
    if isinstance(loss_or_grads, (list, tuple)):
        grads = list(loss_or_grads)
        if len(grads) != len(params):
            raise ValueError("got %d gradients for %d params" % (len(grads), len(params)))
    else:
        grads = pytensor.grad(loss_or_grads, params)
    fx = pytensor.config.floatX
    return pt.concatenate([pt.cast(g, fx).flatten() for g in grads])


def unflatten(flat, params):
    """Slices of the flat vector ``flat`` shaped like each of ``params``
    (constant shapes, so the result also compiles for JAX)."""
    views, offset = [], 0
    for shape in _shapes(params):
        size = int(np.prod(shape, dtype=np.int64))
        views.append(flat[offset:offset + size].reshape(shape))
        offset += size
    return views


def _setup(loss_or_grads, params, grad_scale):
    params = list(params)
    if not params:
        raise ValueError("params must be a non-empty list of shared variables")
    flat = flat_gradient(loss_or_grads, params)
    size = sum(int(np.prod(s, dtype=np.int64)) for s in _shapes(params))
    fx = pytensor.config.floatX
    grad_shared = pytensor.shared(np.zeros(size, dtype=fx), name="flat_grad", shape=(size,))
    combined = grad_shared if grad_scale is None else grad_shared * pt.cast(grad_scale, fx)
    grad_updates = [(grad_shared, flat, "avg")]
    return params, grad_updates, grad_shared, unflatten(combined, params)


def _zeros_like(p, name):
    v = p.get_value(borrow=True)
    return pytensor.shared(np.zeros(v.shape, dtype=v.dtype), name=name, shape=v.shape)


def _step_count():
    return pytensor.shared(np.asarray(0.0, dtype=pytensor.config.floatX), name="t")


def _cast(value, p):
    return pt.cast(value, p.dtype)


def sgd(loss_or_grads, params, learning_rate=1e-2, grad_scale=None):
    """Stochastic gradient descent: ``p <- p - learning_rate * g``.

    Parameters
    ----------
    loss_or_grads : scalar Variable or list of Variable
    params : list of SharedVariable
    learning_rate : float or scalar Variable
    grad_scale : scalar Variable, optional
        Multiplies the combined gradient.

    Returns
    -------
    grad_updates, param_updates : list of update tuples
    grad_shared : SharedVariable
        The flat gradient vector to combine between the two.
    """
    params, grad_updates, grad_shared, grads = _setup(loss_or_grads, params, grad_scale)
    param_updates = [(p, p - _cast(learning_rate * g, p)) for p, g in zip(params, grads)]
    return grad_updates, param_updates, grad_shared


def momentum(loss_or_grads, params, learning_rate=1e-2, momentum=0.9, grad_scale=None):
    """SGD with momentum: ``v <- momentum * v - learning_rate * g; p <- p + v``.
    Parameters and returns as in ``sgd``."""
    params, grad_updates, grad_shared, grads = _setup(loss_or_grads, params, grad_scale)
    param_updates = []
    for p, g in zip(params, grads):
        v = _zeros_like(p, "velocity")
        v_new = _cast(momentum * v - learning_rate * g, p)
        param_updates += [(v, v_new), (p, p + v_new)]
    return grad_updates, param_updates, grad_shared


def nesterov_momentum(loss_or_grads, params, learning_rate=1e-2, momentum=0.9, grad_scale=None):
    """Nesterov momentum: ``v <- momentum * v - lr * g;
    p <- p + momentum * v - lr * g``.  Parameters and returns as in ``sgd``."""
    params, grad_updates, grad_shared, grads = _setup(loss_or_grads, params, grad_scale)
    param_updates = []
    for p, g in zip(params, grads):
        v = _zeros_like(p, "velocity")
        v_new = _cast(momentum * v - learning_rate * g, p)
        param_updates += [(v, v_new), (p, p + _cast(momentum * v_new - learning_rate * g, p))]
    return grad_updates, param_updates, grad_shared


def adagrad(loss_or_grads, params, learning_rate=1.0, epsilon=1e-6, grad_scale=None):
    """Adagrad: ``a <- a + g**2; p <- p - lr * g / sqrt(a + epsilon)``.
    Parameters and returns as in ``sgd``."""
    params, grad_updates, grad_shared, grads = _setup(loss_or_grads, params, grad_scale)
    param_updates = []
    for p, g in zip(params, grads):
        acc = _zeros_like(p, "accu")
        acc_new = acc + g ** 2
        param_updates += [(acc, _cast(acc_new, p)),
                          (p, p - _cast(learning_rate * g / pt.sqrt(acc_new + epsilon), p))]
    return grad_updates, param_updates, grad_shared


def rmsprop(loss_or_grads, params, learning_rate=1.0, rho=0.9, epsilon=1e-6, grad_scale=None):
    """RMSProp: ``a <- rho * a + (1 - rho) * g**2;
    p <- p - lr * g / sqrt(a + epsilon)``.  Parameters and returns as in ``sgd``."""
    params, grad_updates, grad_shared, grads = _setup(loss_or_grads, params, grad_scale)
    param_updates = []
    for p, g in zip(params, grads):
        acc = _zeros_like(p, "accu")
        acc_new = rho * acc + (1 - rho) * g ** 2
        param_updates += [(acc, _cast(acc_new, p)),
                          (p, p - _cast(learning_rate * g / pt.sqrt(acc_new + epsilon), p))]
    return grad_updates, param_updates, grad_shared


def adadelta(loss_or_grads, params, learning_rate=1.0, rho=0.95, epsilon=1e-6, grad_scale=None):
    """Adadelta: ``a <- rho * a + (1 - rho) * g**2;
    u = g * sqrt(d + epsilon) / sqrt(a + epsilon); p <- p - lr * u;
    d <- rho * d + (1 - rho) * u**2``.  Parameters and returns as in ``sgd``."""
    params, grad_updates, grad_shared, grads = _setup(loss_or_grads, params, grad_scale)
    param_updates = []
    for p, g in zip(params, grads):
        acc = _zeros_like(p, "accu")
        delta = _zeros_like(p, "delta_accu")
        acc_new = rho * acc + (1 - rho) * g ** 2
        update = g * pt.sqrt(delta + epsilon) / pt.sqrt(acc_new + epsilon)
        param_updates += [(acc, _cast(acc_new, p)), (p, p - _cast(learning_rate * update, p)),
                          (delta, _cast(rho * delta + (1 - rho) * update ** 2, p))]
    return grad_updates, param_updates, grad_shared


def adam(loss_or_grads, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8,
         grad_scale=None):
    """Adam: ``t <- t + 1; m <- b1 * m + (1 - b1) * g; v <- b2 * v + (1 - b2) * g**2;
    p <- p - lr * sqrt(1 - b2**t) / (1 - b1**t) * m / (sqrt(v) + epsilon)``.
    Parameters and returns as in ``sgd``."""
    params, grad_updates, grad_shared, grads = _setup(loss_or_grads, params, grad_scale)
    t_prev = _step_count()
    t = t_prev + 1
    step = learning_rate * pt.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
    param_updates = [(t_prev, t)]
    for p, g in zip(params, grads):
        m = _zeros_like(p, "m")
        v = _zeros_like(p, "v")
        m_new = beta1 * m + (1 - beta1) * g
        v_new = beta2 * v + (1 - beta2) * g ** 2
        param_updates += [(m, _cast(m_new, p)), (v, _cast(v_new, p)),
                          (p, p - _cast(step * m_new / (pt.sqrt(v_new) + epsilon), p))]
    return grad_updates, param_updates, grad_shared


def adamax(loss_or_grads, params, learning_rate=2e-3, beta1=0.9, beta2=0.999, epsilon=1e-8,
           grad_scale=None):
    """Adamax: ``t <- t + 1; m <- b1 * m + (1 - b1) * g; u <- max(b2 * u, |g|);
    p <- p - lr / (1 - b1**t) * m / (u + epsilon)``.  Parameters and returns as in ``sgd``."""
    params, grad_updates, grad_shared, grads = _setup(loss_or_grads, params, grad_scale)
    t_prev = _step_count()
    t = t_prev + 1
    step = learning_rate / (1 - beta1 ** t)
    param_updates = [(t_prev, t)]
    for p, g in zip(params, grads):
        m = _zeros_like(p, "m")
        u = _zeros_like(p, "u")
        m_new = beta1 * m + (1 - beta1) * g
        u_new = pt.maximum(beta2 * u, abs(g))
        param_updates += [(m, _cast(m_new, p)), (u, _cast(u_new, p)),
                          (p, p - _cast(step * m_new / (u_new + epsilon), p))]
    return grad_updates, param_updates, grad_shared

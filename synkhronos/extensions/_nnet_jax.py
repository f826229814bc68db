"""JAX implementations of ``synkhronos.extensions.nnet``'s ops (GPU ranks,
``mode="JAX"``), and the layout their convolutions hand to XLA."""

import functools
import os

__all__ = ["LAYOUT_ENV", "jax_conv_layout", "register"]

LAYOUT_ENV = "SYNKHRONOS_CONV_LAYOUT"
_LAYOUTS = ("NCHW", "NHWC")


def jax_conv_layout():
    """The layout the JAX convolution hands to XLA: ``$SYNKHRONOS_CONV_LAYOUT``,
    ``NCHW`` (default: the graph's own) or ``NHWC`` (images transposed to
    channels-last and filters to HWIO around each convolution).  Read when a
    function is compiled; workers inherit the master's environment.

    Raises
    ------
    ValueError
        If the variable holds another value.
    """
    text = os.environ.get(LAYOUT_ENV, "").strip().upper() or "NCHW"
    if text not in _LAYOUTS:
        raise ValueError("%s must be one of %s, got %r" % (LAYOUT_ENV, ", ".join(_LAYOUTS),
                                                          os.environ[LAYOUT_ENV]))
    return text


def register(Conv2d, Conv2dGradInput, Conv2dGradWeight, Pool2d, Pool2dGrad):
    """Register JAX implementations of the ops of ``nnet`` (given, since they
    live there)."""
    import jax
    import jax.numpy as jnp
    from pytensor.link.jax.dispatch import jax_funcify

    @jax_funcify.register(Conv2d)
    def _jax_conv2d(op, **kwargs):
        return _conv_function(op)

    # A cotangent may come in another dtype than the forward output (say float64
    # from a float64 loss over float32 features); JAX's vjp needs the output's.
    @jax_funcify.register(Conv2dGradInput)
    def _jax_conv2d_grad_input(op, **kwargs):
        fwd = _conv_function(op)
        return lambda x, w, gy: jax.vjp(lambda xx: fwd(xx, w), x)[1](gy.astype(jnp.result_type(x, w)))[0]

    @jax_funcify.register(Conv2dGradWeight)
    def _jax_conv2d_grad_weight(op, **kwargs):
        fwd = _conv_function(op)
        return lambda x, w, gy: jax.vjp(lambda ww: fwd(x, ww), w)[1](gy.astype(jnp.result_type(x, w)))[0]

    @jax_funcify.register(Pool2d)
    def _jax_pool2d(op, **kwargs):
        return _pool_function(op)

    @jax_funcify.register(Pool2dGrad)
    def _jax_pool2d_grad(op, **kwargs):
        if op.mode == "max":
            return functools.partial(_max_pool_grad, op)
        fwd = _pool_function(op)
        return lambda x, gy: jax.vjp(fwd, x)[1](gy.astype(x.dtype))[0]


def _conv_function(op):
    """JAX's ``(x, w) -> y`` for convolution ``op``, in the layout that
    ``jax_conv_layout`` names."""
    import jax

    (sh, sw), (ph, pw), (dh, dw) = op.stride, op.padding, op.dilation

    def nchw(x, w):
        return jax.lax.conv_general_dilated(
            x, w, window_strides=(sh, sw), padding=((ph, ph), (pw, pw)), rhs_dilation=(dh, dw),
            dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=op.groups)

    def nhwc(x, w):
        y = jax.lax.conv_general_dilated(
            x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0), window_strides=(sh, sw),
            padding=((ph, ph), (pw, pw)), rhs_dilation=(dh, dw),
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=op.groups)
        return y.transpose(0, 3, 1, 2)

    return nhwc if jax_conv_layout() == "NHWC" else nchw


def _pool_function(op):
    """JAX's ``x -> y`` for pooling ``op`` (max or average)."""
    import jax
    import jax.numpy as jnp

    (kh, kw), (sh, sw), (ph, pw) = op.ws, op.stride, op.padding
    pads = ((0, 0), (0, 0), (ph, ph), (pw, pw))

    def f(x):
        # Literal identities select JAX's differentiable max/sum window reductions.
        if op.mode == "max":
            return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, kh, kw), (1, 1, sh, sw), pads)
        acc = _accumulator(x)
        total = jax.lax.reduce_window(acc, 0.0, jax.lax.add, (1, 1, kh, kw), (1, 1, sh, sw), pads)
        return (total / (kh * kw)).astype(x.dtype)
    return f


def _max_pool_grad(op, x, gy):
    """The gradient of a max pooling as a gather, not JAX's scatter: which window
    position holds each window's first maximum (``argmax``, one pass over ``x``),
    then each input element sums the cotangents of the windows whose maximum it is,
    one shifted, stride-dilated copy of them per window position.  Both passes are
    elementwise (no atomic adds), and their order of ties is ``nnet``'s own."""
    import jax
    import jax.numpy as jnp

    (kh, kw), (sh, sw), (ph, pw) = op.ws, op.stride, op.padding
    gy = _accumulator(gy.astype(x.dtype))  # the cotangent in the output's dtype, summed in float32 at least
    oh, ow = gy.shape[2], gy.shape[3]
    xp = jax.lax.pad(x, jnp.array(-jnp.inf, x.dtype), ((0, 0, 0), (0, 0, 0), (ph, ph, 0), (pw, pw, 0)))
    hp, wp = xp.shape[2], xp.shape[3]

    def window_position(i, j):
        return xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]

    index = jnp.int8 if kh * kw <= 127 else jnp.int32
    best, arg = window_position(0, 0), jnp.zeros(gy.shape, index)
    for k in range(1, kh * kw):
        patch = window_position(*divmod(k, kw))
        better = patch > best
        best, arg = jnp.where(better, patch, best), jnp.where(better, index(k), arg)
    zero = jnp.array(0, gy.dtype)
    dxp = 0
    for k in range(kh * kw):
        i, j = divmod(k, kw)
        routed = jnp.where(arg == k, gy, zero)
        dxp = dxp + jax.lax.pad(routed, zero, ((0, 0, 0), (0, 0, 0), (i, hp - i - sh * (oh - 1) - 1, sh - 1),
                                               (j, wp - j - sw * (ow - 1) - 1, sw - 1)))
    return dxp[:, :, ph:ph + x.shape[2], pw:pw + x.shape[3]].astype(x.dtype)


def _accumulator(x):
    """``x`` in a dtype to sum in: float32 at least (bfloat16 storage under
    ``fork(precision="bf16")`` sums in float32, as its emulation does)."""
    import jax.numpy as jnp

    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


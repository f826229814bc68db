"""JAX implementations of ``synkhronos.extensions.nnet``'s ops (GPU ranks,
``mode="JAX"``), and the layout their convolutions hand to XLA."""

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

    def conv(op):
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

    def pool(op):
        (kh, kw), (sh, sw), (ph, pw) = op.ws, op.stride, op.padding
        pads = ((0, 0), (0, 0), (ph, ph), (pw, pw))

        def f(x):
            # Literal identities select JAX's differentiable max/sum window reductions.
            if op.mode == "max":
                return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, kh, kw), (1, 1, sh, sw), pads)
            total = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 1, kh, kw), (1, 1, sh, sw), pads)
            return total / (kh * kw)
        return f

    @jax_funcify.register(Conv2d)
    def _jax_conv2d(op, **kwargs):
        return conv(op)

    # A cotangent may come in another dtype than the forward output (say float64
    # from a float64 loss over float32 features); JAX's vjp needs the output's.
    @jax_funcify.register(Conv2dGradInput)
    def _jax_conv2d_grad_input(op, **kwargs):
        fwd = conv(op)
        return lambda x, w, gy: jax.vjp(lambda xx: fwd(xx, w), x)[1](gy.astype(jnp.result_type(x, w)))[0]

    @jax_funcify.register(Conv2dGradWeight)
    def _jax_conv2d_grad_weight(op, **kwargs):
        fwd = conv(op)
        return lambda x, w, gy: jax.vjp(lambda ww: fwd(x, ww), w)[1](gy.astype(jnp.result_type(x, w)))[0]

    @jax_funcify.register(Pool2d)
    def _jax_pool2d(op, **kwargs):
        return pool(op)

    @jax_funcify.register(Pool2dGrad)
    def _jax_pool2d_grad(op, **kwargs):
        fwd = pool(op)
        return lambda x, gy: jax.vjp(fwd, x)[1](gy.astype(x.dtype))[0]


"""2-D convolution and pooling for PyTensor, with gradients: ``conv2d``,
``max_pool2d``, ``avg_pool2d``.

PyTensor 3 has no convolution or pooling op, and Theano's ``nnet`` and Lasagne are
gone.  Each Op here has three implementations of the same computation:

* ``perform`` (numpy): im2col and one BLAS product, looping only over kernel
  offsets, never over pixels;
* native Numba (scalar loops around BLAS products, which compile in seconds),
  registered so that graphs using these Ops stay in PyTensor's on-disk cache (a
  perform-only Op would make every process re-link);
* JAX (``jax.lax.conv_general_dilated`` / ``reduce_window``, gradients by
  ``jax.vjp``), registered when JAX is installed, for GPU workers.

Layouts: inputs NCHW, filters OIHW.  Convolution is cross-correlation, as in Theano
and cuDNN.  Grouped convolution (``groups``, PyTorch's and JAX's ``feature_group_count``)
runs each group's channels through the same kernels.  Average pooling counts padding as zeros.
"""

import zlib
from importlib.util import find_spec
from numbers import Integral
from pathlib import Path

import pytensor
import pytensor.tensor as pt
from pytensor.gradient import disconnected_grad
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.link.numba.dispatch.basic import numba_njit, register_funcify_default_op_cache_key

from . import _nnet_jax
from . import _nnet_kernels as numpy_kernels
from . import _nnet_numba as numba_kernels
from ._nnet_jax import LAYOUT_ENV, jax_conv_layout  # noqa: F401  (public here)
from ._nnet_kernels import conv_out_size

__all__ = ["conv2d", "max_pool2d", "avg_pool2d", "batch_norm", "log_softmax", "softmax_cross_entropy",
           "categorical_crossentropy",
           "jax_conv_layout", "LAYOUT_ENV", "Conv2d", "Conv2dGradInput", "Conv2dGradWeight", "Pool2d",
           "Pool2dGrad"]


def _pair(value, argname):
    if isinstance(value, Integral) and not isinstance(value, bool):
        value = (value, value)
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(v, Integral) and not isinstance(v, bool) for v in value)):
        raise ValueError("%s must be an int or a pair of ints, got %r" % (argname, value))
    return int(value[0]), int(value[1])


def _as4d(x, argname):
    x = pt.as_tensor_variable(x)
    if x.ndim != 4:
        raise TypeError("%s must be 4-d (NCHW / OIHW), got ndim=%d" % (argname, x.ndim))
    return x


class _PullbackOp(Op):
    """An Op whose gradient is its ``pullback`` on every PyTensor we support:
    PyTensor 3 asks ``pullback``, PyTensor 2.x ``L_op``.  ``infer_shape(*args)``
    takes the shapes last (PyTensor 3.3 no longer passes ``fgraph``)."""

    def L_op(self, inputs, outputs, output_grads):
        return self.pullback(inputs, outputs, output_grads)


class _ConvBase(_PullbackOp):
    __props__ = ("stride", "padding", "dilation", "groups")
    bf16_product = True  # fork(precision="bf16") computes it in bfloat16 (see the docs' Precision)

    def __init__(self, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
        self.stride = tuple(stride)
        self.padding = tuple(padding)
        self.dilation = tuple(dilation)
        self.groups = int(groups)

    def args(self):
        return self.stride + self.padding + self.dilation + (self.groups,)


class Conv2d(_ConvBase):
    """Cross-correlation of ``x`` (N, C, H, W) with filters ``w`` (O, C / groups, kh, kw)."""

    def make_node(self, x, w):
        x, w = _as4d(x, "x"), _as4d(w, "w")
        dtype = pytensor.scalar.upcast(x.dtype, w.dtype)
        x, w = pt.cast(x, dtype), pt.cast(w, dtype)
        out = pt.tensor(dtype=dtype, shape=(x.type.shape[0], w.type.shape[0], None, None))
        return Apply(self, [x, w], [out])

    def perform(self, node, inputs, outputs):
        x, w = inputs
        outputs[0][0] = numpy_kernels.conv2d_forward(x, w, *self.args())

    def infer_shape(self, *args):
        """The output shape, from the input and filter shapes."""
        (n, _, h, wd), (o, _, kh, kw) = args[-1]
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
        return [(n, o, conv_out_size(h, kh, sh, ph, dh), conv_out_size(wd, kw, sw, pw, dw))]

    def pullback(self, inputs, outputs, cotangents):
        """Gradients with respect to the image and the kernels."""
        x, w = inputs
        (gy,) = cotangents
        props = (self.stride, self.padding, self.dilation, self.groups)
        return [Conv2dGradInput(*props)(x, w, gy), Conv2dGradWeight(*props)(x, w, gy)]


class Conv2dGradInput(_ConvBase):
    """Gradient of ``Conv2d`` with respect to its input: ``(x, w, gy) -> gx``."""

    def make_node(self, x, w, gy):
        x, w, gy = _as4d(x, "x"), _as4d(w, "w"), _as4d(gy, "gy")
        return Apply(self, [x, w, gy], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = numpy_kernels.conv2d_grad_input(*inputs, *self.args())

    def infer_shape(self, *args):
        """The input's shape."""
        return [args[-1][0]]


class Conv2dGradWeight(_ConvBase):
    """Gradient of ``Conv2d`` with respect to its filters: ``(x, w, gy) -> gw``."""

    def make_node(self, x, w, gy):
        x, w, gy = _as4d(x, "x"), _as4d(w, "w"), _as4d(gy, "gy")
        return Apply(self, [x, w, gy], [w.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = numpy_kernels.conv2d_grad_weight(*inputs, *self.args())

    def infer_shape(self, *args):
        """The filters' shape."""
        return [args[-1][1]]


class _PoolBase(_PullbackOp):
    __props__ = ("ws", "stride", "padding", "mode")
    bf16_storage = True  # under fork(precision="bf16") held in bfloat16 like an elementwise result

    def __init__(self, ws, stride, padding, mode):
        if mode not in ("max", "avg"):
            raise ValueError("mode must be 'max' or 'avg', got %r" % (mode,))
        self.ws, self.stride, self.padding, self.mode = tuple(ws), tuple(stride), tuple(padding), mode

    def args(self):
        return self.ws + self.stride + self.padding + (self.mode == "max",)


class Pool2d(_PoolBase):
    """Max or average pooling of ``x`` (N, C, H, W) over ``ws`` windows."""

    def make_node(self, x):
        x = _as4d(x, "x")
        out = pt.tensor(dtype=x.dtype, shape=(x.type.shape[0], x.type.shape[1], None, None))
        return Apply(self, [x], [out])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = numpy_kernels.pool2d_forward(inputs[0], *self.args())

    def infer_shape(self, *args):
        """The pooled shape, from the input shape."""
        n, c, h, w = args[-1][0]
        (kh, kw), (sh, sw), (ph, pw) = self.ws, self.stride, self.padding
        return [(n, c, conv_out_size(h, kh, sh, ph, 1), conv_out_size(w, kw, sw, pw, 1))]

    def pullback(self, inputs, outputs, cotangents):
        """Gradient with respect to the image."""
        return [Pool2dGrad(self.ws, self.stride, self.padding, self.mode)(inputs[0], cotangents[0])]


class Pool2dGrad(_PoolBase):
    """Gradient of ``Pool2d``: ``(x, gy) -> gx`` (a max routes to the first maximum)."""

    def make_node(self, x, gy):
        x, gy = _as4d(x, "x"), _as4d(gy, "gy")
        return Apply(self, [x, gy], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = numpy_kernels.pool2d_grad(*inputs, *self.args())

    def infer_shape(self, *args):
        """The input's shape."""
        return [args[-1][0]]


# ---------------------------------------------------------------------- builders
def _filter_size(w):
    shape = w.type.shape[2:]
    if None in shape and hasattr(w, "get_value"):
        shape = w.get_value(borrow=True).shape[2:]
    if None in shape:
        raise ValueError("padding='same' needs the filter size: give w a static shape "
                         "(e.g. pytensor.shared(value, shape=value.shape))")
    return shape


def conv2d(x, w, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution (cross-correlation) of NCHW ``x`` with OIHW filters ``w``.

    Parameters
    ----------
    x, w : 4-d tensors
        ``w`` has shape (O, C / groups, kh, kw).
    stride, dilation : int or pair of ints
    padding : int, pair of ints, 'valid' or 'same'
        Zero padding on both sides.  'same' keeps H and W at stride 1 and needs
        odd effective filter sizes.
    groups : int
        Split the C input channels and the O filters into this many groups, each
        convolved on its own (``groups=C`` is a depthwise convolution).

    Returns
    -------
    4-d tensor (N, O, H', W')

    Raises
    ------
    TypeError
        If ``x`` or ``w`` is not 4-d.
    ValueError
        For a malformed ``stride``, ``padding``, ``dilation`` or ``groups``, or
        (when the static shapes say so) groups that do not divide the channels.
    """
    x, w = _as4d(x, "x"), _as4d(w, "w")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    if not isinstance(groups, Integral) or isinstance(groups, bool) or groups < 1:
        raise ValueError("groups must be a positive int, got %r" % (groups,))
    c, (o, wc) = x.type.shape[1], w.type.shape[:2]
    if None not in (c, o, wc):
        numpy_kernels.check_groups(c, o, wc, int(groups))
    if padding == "valid":
        padding = (0, 0)
    elif padding == "same":
        sizes = [d * (k - 1) for k, d in zip(_filter_size(w), dilation)]
        if any(s % 2 for s in sizes) or stride != (1, 1):
            raise ValueError("padding='same' needs stride 1 and odd effective filter sizes, got "
                             "filter %s, dilation %s, stride %s" % (_filter_size(w), dilation, stride))
        padding = (sizes[0] // 2, sizes[1] // 2)
    else:
        padding = _pair(padding, "padding")
    return Conv2d(stride, padding, dilation, int(groups))(x, w)


def _pool(x, size, stride, padding, mode):
    ws = _pair(size, "size")
    stride = ws if stride is None else _pair(stride, "stride")
    return Pool2d(ws, stride, _pair(padding, "padding"), mode)(_as4d(x, "x"))


def max_pool2d(x, size, stride=None, padding=0):
    """Max pooling of NCHW ``x`` over ``size`` windows (``stride`` defaults to
    ``size``; padding is ignored by the max).  Parameters as in ``conv2d``."""
    return _pool(x, size, stride, padding, "max")


def avg_pool2d(x, size, stride=None, padding=0):
    """Average pooling of NCHW ``x`` over ``size`` windows (padding counts as
    zeros).  Parameters as in ``conv2d``."""
    return _pool(x, size, stride, padding, "avg")


def batch_norm(x, gamma, beta, epsilon=1e-5):
    """Batch normalisation of NCHW ``x`` with this batch's statistics per channel
    (on each rank, its own rows: as PyTorch DDP without SyncBatchNorm).

    Parameters
    ----------
    x : 4-d tensor
    gamma, beta : vectors of length C
        Scale and shift.
    epsilon : float

    Returns
    -------
    4-d tensor like ``x``
    """
    x = _as4d(x, "x")
    axes = (0, 2, 3)
    # Both statistics from one pass over x (E[d^2] - E[d]^2), which XLA reads once instead
    # of twice.  d is x shifted by one sample per channel, so that the difference does not
    # cancel when a channel's mean is large against its spread.  The shift cancels out of
    # the results; no gradient flows through it.
    sample = disconnected_grad(x[0, :, 0, 0]).dimshuffle("x", 0, "x", "x")
    d = x - sample
    mean_d = d.mean(axis=axes, keepdims=True)
    var = pt.maximum((d * d).mean(axis=axes, keepdims=True) - mean_d * mean_d, 0)
    # One multiply-add per element with factors per channel (as Flax's BatchNorm): XLA
    # fuses the gradient's sums over the batch into fewer reductions than it did for
    # (d - mean) / std * gamma.
    mul = gamma.dimshuffle("x", 0, "x", "x") / pt.sqrt(var + epsilon)
    return d * mul + (beta.dimshuffle("x", 0, "x", "x") - mean_d * mul)


def log_softmax(logits):
    """Log-probabilities over axis 1 of a (N, classes) matrix, computed stably."""
    return logits - pt.logsumexp(logits, axis=1, keepdims=True)


def categorical_crossentropy(probabilities, targets):
    """Theano's ``T.nnet.categorical_crossentropy`` (and Lasagne's objective of the
    name), for ported scripts: the cross-entropy of each row.

    Parameters
    ----------
    probabilities : (N, classes) tensor
        Class probabilities, e.g. a softmax's output.
    targets : (N,) integer tensor or (N, classes) tensor
        Class labels, or one-hot (or soft) targets.

    Returns
    -------
    (N,) tensor
        ``-log p[i, targets[i]]``, or ``-sum_k targets[i, k] log p[i, k]``; take
        ``.mean()`` for a loss.  From logits, ``softmax_cross_entropy`` (the mean
        of this over one-hot targets) is the stable choice.
    """
    probabilities, targets = pt.as_tensor(probabilities), pt.as_tensor(targets)
    if probabilities.ndim != 2:
        raise TypeError("probabilities must be 2-d (N, classes), got ndim=%d" % probabilities.ndim)
    if targets.ndim == 2:
        return -(targets * pt.log(probabilities)).sum(axis=1)
    if targets.ndim == 1 and targets.dtype.startswith(("int", "uint")):
        return -pt.log(probabilities[pt.arange(targets.shape[0]), targets])
    raise TypeError("targets must be (N,) integer labels or (N, classes) one-hot, got ndim=%d dtype=%s"
                    % (targets.ndim, targets.dtype))


def softmax_cross_entropy(logits, targets):
    """Mean cross-entropy of (N, classes) ``logits`` against one-hot (or soft)
    ``targets`` of the same shape."""
    return -(targets * log_softmax(logits)).sum(axis=1).mean()


# ------------------------------------------------------------------ Numba (native)
# PyTensor's Numba cache key covers the Op and its props, not the kernels' code: add
# a checksum of the kernel module so that a changed kernel is never served stale.
_KERNELS_VERSION = zlib.crc32(Path(numba_kernels.__file__).read_bytes())

@register_funcify_default_op_cache_key(Conv2d)
def _numba_conv2d(op, node=None, **kwargs):
    kernel, a = numba_kernels.conv2d_forward, op.args()

    @numba_njit
    def conv2d_numba(x, w):
        return kernel(x, w, a[0], a[1], a[2], a[3], a[4], a[5], a[6])

    return conv2d_numba, _KERNELS_VERSION


@register_funcify_default_op_cache_key(Conv2dGradInput)
def _numba_conv2d_grad_input(op, node=None, **kwargs):
    kernel, a = numba_kernels.conv2d_grad_input, op.args()

    @numba_njit
    def conv2d_grad_input_numba(x, w, gy):
        return kernel(x, w, gy, a[0], a[1], a[2], a[3], a[4], a[5], a[6])

    return conv2d_grad_input_numba, _KERNELS_VERSION


@register_funcify_default_op_cache_key(Conv2dGradWeight)
def _numba_conv2d_grad_weight(op, node=None, **kwargs):
    kernel, a = numba_kernels.conv2d_grad_weight, op.args()

    @numba_njit
    def conv2d_grad_weight_numba(x, w, gy):
        return kernel(x, w, gy, a[0], a[1], a[2], a[3], a[4], a[5], a[6])

    return conv2d_grad_weight_numba, _KERNELS_VERSION


@register_funcify_default_op_cache_key(Pool2d)
def _numba_pool2d(op, node=None, **kwargs):
    kernel, a = numba_kernels.pool2d_forward, op.args()

    @numba_njit
    def pool2d_numba(x):
        return kernel(x, a[0], a[1], a[2], a[3], a[4], a[5], a[6])

    return pool2d_numba, _KERNELS_VERSION


@register_funcify_default_op_cache_key(Pool2dGrad)
def _numba_pool2d_grad(op, node=None, **kwargs):
    kernel, a = numba_kernels.pool2d_grad, op.args()

    @numba_njit
    def pool2d_grad_numba(x, gy):
        return kernel(x, gy, a[0], a[1], a[2], a[3], a[4], a[5], a[6])

    return pool2d_grad_numba, _KERNELS_VERSION


if find_spec("jax") is not None:
    _nnet_jax.register(Conv2d, Conv2dGradInput, Conv2dGradWeight, Pool2d, Pool2dGrad)

"""Convolution and pooling kernels in numpy (the Ops' ``perform``).

Every kernel loops only over kernel offsets (a few iterations) and slices over the
batch, channels and pixels, so it is vectorised: no Python loop over pixels.
Convolutions go through im2col and one BLAS matrix product.

Layouts: inputs NCHW, filters OIHW.  ``sh, sw`` strides, ``ph, pw`` symmetric zero
padding, ``dh, dw`` dilations, ``kh, kw`` pooling window, ``g`` groups (the
channels split into ``g`` independent convolutions, one BLAS product each).
"""

import numpy as np

__all__ = ["conv_out_size", "check_groups", "conv2d_forward", "conv2d_grad_input", "conv2d_grad_weight",
           "pool2d_forward", "pool2d_grad"]


def conv_out_size(size, k, s, p, d):
    """Output length of a convolution or pooling along one axis."""
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _padded(x, ph, pw, fill):
    n, c, h, w = x.shape
    out = np.full((n, c, h + 2 * ph, w + 2 * pw), fill, dtype=x.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = x
    return out

def _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw):
    n, c, h, w = x.shape
    oh = conv_out_size(h, kh, sh, ph, dh)
    ow = conv_out_size(w, kw, sw, pw, dw)
    xp = _padded(x, ph, pw, 0)
    cols = np.empty((n, oh, ow, c, kh, kw), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            cols[:, :, :, :, i, j] = np.transpose(patch, (0, 2, 3, 1))
    return cols.reshape(n * oh * ow, c * kh * kw), oh, ow

def check_groups(c, o, wc, g):
    """Raise ValueError unless ``g`` groups fit input channels ``c``, filters
    ``o`` and filter channels ``wc``."""
    if g < 1 or c % g or o % g or c // g != wc:
        raise ValueError("groups=%d does not fit the input's %d channels, the filters' %d "
                         "outputs and %d channels per group: the channels and outputs must "
                         "divide by groups, and filter channels = input channels / groups"
                         % (g, c, o, wc))


def _by_group(kernel, x, w, dy, g, out_axis, args):
    """``kernel`` on each group's channels of ``x``/``dy`` and filters of ``w``,
    joined on ``out_axis``."""
    cg, og = x.shape[1] // g, w.shape[0] // g
    parts = []
    for k in range(g):
        ins = (x[:, k * cg:(k + 1) * cg], w[k * og:(k + 1) * og])
        if dy is not None:
            ins += (dy[:, k * og:(k + 1) * og],)
        parts.append(kernel(*ins, *args))
    return np.ascontiguousarray(np.concatenate(parts, axis=out_axis))


def conv2d_forward(x, w, sh, sw, ph, pw, dh, dw, g=1):
    """Cross-correlation of ``x`` (N, C, H, W) with filters ``w`` (O, C / g, kh, kw)."""
    check_groups(x.shape[1], w.shape[0], w.shape[1], g)
    if g > 1:
        return _by_group(conv2d_forward, x, w, None, g, 1, (sh, sw, ph, pw, dh, dw))
    n = x.shape[0]
    o, c, kh, kw = w.shape
    cols, oh, ow = _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw)
    wm = np.ascontiguousarray(np.ascontiguousarray(w).reshape(o, c * kh * kw).T)
    out = np.dot(cols, wm).reshape(n, oh, ow, o)
    return np.ascontiguousarray(np.transpose(out, (0, 3, 1, 2)))

def _dy_matrix(dy):
    n, o, oh, ow = dy.shape
    return np.ascontiguousarray(np.transpose(dy, (0, 2, 3, 1))).reshape(n * oh * ow, o)

def conv2d_grad_input(x, w, dy, sh, sw, ph, pw, dh, dw, g=1):
    """Gradient of ``conv2d_forward`` with respect to ``x`` (col2im)."""
    if g > 1:
        return _by_group(conv2d_grad_input, x, w, dy, g, 1, (sh, sw, ph, pw, dh, dw))
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = dy.shape[2], dy.shape[3]
    dcols = np.dot(_dy_matrix(dy), np.ascontiguousarray(w).reshape(o, c * kh * kw))
    dcols = dcols.reshape(n, oh, ow, c, kh, kw)
    dxp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), dtype=dy.dtype)
    for i in range(kh):
        for j in range(kw):
            view = dxp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            view += np.transpose(dcols[:, :, :, :, i, j], (0, 3, 1, 2))
    return np.ascontiguousarray(dxp[:, :, ph:ph + h, pw:pw + wd])

def conv2d_grad_weight(x, w, dy, sh, sw, ph, pw, dh, dw, g=1):
    """Gradient of ``conv2d_forward`` with respect to ``w``."""
    if g > 1:
        return _by_group(conv2d_grad_weight, x, w, dy, g, 0, (sh, sw, ph, pw, dh, dw))
    o, c, kh, kw = w.shape
    cols, _, _ = _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw)
    dw_ = np.dot(np.ascontiguousarray(_dy_matrix(dy).T), cols)
    return dw_.reshape(o, c, kh, kw)

def pool2d_forward(x, kh, kw, sh, sw, ph, pw, is_max):
    """Max or average (padding counted as zeros) pooling over windows."""
    n, c, h, w = x.shape
    oh = conv_out_size(h, kh, sh, ph, 1)
    ow = conv_out_size(w, kw, sw, pw, 1)
    xp = _padded(x, ph, pw, -np.inf if is_max else 0)
    out = np.full((n, c, oh, ow), -np.inf if is_max else 0, dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
            if is_max:
                out = np.maximum(out, patch)
            else:
                out = out + patch
    if not is_max:
        out = out / (kh * kw)
    return out.astype(x.dtype)

def pool2d_grad(x, dy, kh, kw, sh, sw, ph, pw, is_max):
    """Gradient of ``pool2d_forward``; a max routes to the first maximal element."""
    n, c, h, w = x.shape
    oh, ow = dy.shape[2], dy.shape[3]
    xp = _padded(x, ph, pw, -np.inf if is_max else 0)
    dxp = np.zeros(xp.shape, dtype=dy.dtype)
    if is_max:
        best = np.full((n, c, oh, ow), -np.inf, dtype=x.dtype)
        arg = np.zeros((n, c, oh, ow), dtype=np.int64)
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
                better = patch > best
                best = np.where(better, patch, best)
                arg = np.where(better, i * kw + j, arg)
        for i in range(kh):
            for j in range(kw):
                view = dxp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
                view += np.where(arg == i * kw + j, dy, 0).astype(dy.dtype)
    else:
        share = (dy / (kh * kw)).astype(dy.dtype)
        for i in range(kh):
            for j in range(kw):
                view = dxp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
                view += share
    return np.ascontiguousarray(dxp[:, :, ph:ph + h, pw:pw + w])

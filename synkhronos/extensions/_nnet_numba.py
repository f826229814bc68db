"""Convolution and pooling kernels for PyTensor's Numba linker.

Plain scalar loops (im2col, col2im, pooling windows) around BLAS products: Numba
compiles them in seconds, where the sliced numpy formulation of ``_nnet_kernels``
takes minutes to compile.  Same layouts and arguments as ``_nnet_kernels``;
``tests/processes/test_nnet.py`` checks both against each other.
"""

import numpy as np
from pytensor.link.numba.dispatch.basic import numba_njit

__all__ = ["conv2d_forward", "conv2d_grad_input", "conv2d_grad_weight", "pool2d_forward", "pool2d_grad"]


@numba_njit
def _out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


@numba_njit
def _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow):
    n, c, h, w = x.shape
    cols = np.zeros((n * oh * ow, c * kh * kw), dtype=x.dtype)
    for b in range(n):
        for a in range(oh):
            for e in range(ow):
                row = (b * oh + a) * ow + e
                for ch in range(c):
                    for i in range(kh):
                        y = a * sh - ph + i * dh
                        if y < 0 or y >= h:
                            continue
                        for j in range(kw):
                            z = e * sw - pw + j * dw
                            if 0 <= z < w:
                                cols[row, (ch * kh + i) * kw + j] = x[b, ch, y, z]
    return cols


@numba_njit
def _dy_matrix(dy):
    n, o, oh, ow = dy.shape
    m = np.empty((n * oh * ow, o), dtype=dy.dtype)
    for b in range(n):
        for k in range(o):
            for a in range(oh):
                for e in range(ow):
                    m[(b * oh + a) * ow + e, k] = dy[b, k, a, e]
    return m


@numba_njit
def _conv_forward(x, w, sh, sw, ph, pw, dh, dw):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = _out(h, kh, sh, ph, dh), _out(wd, kw, sw, pw, dw)
    cols = _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow)
    prod = np.dot(cols, np.ascontiguousarray(w).reshape(o, c * kh * kw).T.copy())
    out = np.empty((n, o, oh, ow), dtype=x.dtype)
    for b in range(n):
        for a in range(oh):
            for e in range(ow):
                for k in range(o):
                    out[b, k, a, e] = prod[(b * oh + a) * ow + e, k]
    return out


@numba_njit
def _conv_grad_input(x, w, dy, sh, sw, ph, pw, dh, dw):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = dy.shape[2], dy.shape[3]
    dcols = np.dot(_dy_matrix(dy), np.ascontiguousarray(w).reshape(o, c * kh * kw))
    dx = np.zeros(x.shape, dtype=dy.dtype)
    for b in range(n):
        for a in range(oh):
            for e in range(ow):
                row = (b * oh + a) * ow + e
                for ch in range(c):
                    for i in range(kh):
                        y = a * sh - ph + i * dh
                        if y < 0 or y >= h:
                            continue
                        for j in range(kw):
                            z = e * sw - pw + j * dw
                            if 0 <= z < wd:
                                dx[b, ch, y, z] += dcols[row, (ch * kh + i) * kw + j]
    return dx


@numba_njit
def _conv_grad_weight(x, w, dy, sh, sw, ph, pw, dh, dw):
    o, c, kh, kw = w.shape
    oh, ow = dy.shape[2], dy.shape[3]
    cols = _im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow)
    return np.dot(_dy_matrix(dy).T.copy(), cols).reshape(o, c, kh, kw)


# Groups: each group's channels and filters go through the kernels above on their own.
@numba_njit
def _check_groups(x, w, g):
    c, o, wc = x.shape[1], w.shape[0], w.shape[1]
    if g < 1 or c % g != 0 or o % g != 0 or c // g != wc:
        raise ValueError("conv2d: groups do not fit the channels of the input and the filters")
    return c // g, o // g


@numba_njit
def conv2d_forward(x, w, sh, sw, ph, pw, dh, dw, g):
    cg, og = _check_groups(x, w, g)
    if g == 1:
        return _conv_forward(x, w, sh, sw, ph, pw, dh, dw)
    n, kh, kw = x.shape[0], w.shape[2], w.shape[3]
    oh, ow = _out(x.shape[2], kh, sh, ph, dh), _out(x.shape[3], kw, sw, pw, dw)
    out = np.empty((n, w.shape[0], oh, ow), dtype=x.dtype)
    for k in range(g):
        out[:, k * og:(k + 1) * og] = _conv_forward(x[:, k * cg:(k + 1) * cg], w[k * og:(k + 1) * og],
                                                    sh, sw, ph, pw, dh, dw)
    return out


@numba_njit
def conv2d_grad_input(x, w, dy, sh, sw, ph, pw, dh, dw, g):
    cg, og = _check_groups(x, w, g)
    if g == 1:
        return _conv_grad_input(x, w, dy, sh, sw, ph, pw, dh, dw)
    dx = np.empty(x.shape, dtype=dy.dtype)
    for k in range(g):
        dx[:, k * cg:(k + 1) * cg] = _conv_grad_input(
            x[:, k * cg:(k + 1) * cg], w[k * og:(k + 1) * og], dy[:, k * og:(k + 1) * og],
            sh, sw, ph, pw, dh, dw)
    return dx


@numba_njit
def conv2d_grad_weight(x, w, dy, sh, sw, ph, pw, dh, dw, g):
    cg, og = _check_groups(x, w, g)
    if g == 1:
        return _conv_grad_weight(x, w, dy, sh, sw, ph, pw, dh, dw)
    dw_ = np.empty(w.shape, dtype=dy.dtype)
    for k in range(g):
        dw_[k * og:(k + 1) * og] = _conv_grad_weight(
            x[:, k * cg:(k + 1) * cg], w[k * og:(k + 1) * og], dy[:, k * og:(k + 1) * og],
            sh, sw, ph, pw, dh, dw)
    return dw_


@numba_njit
def pool2d_forward(x, kh, kw, sh, sw, ph, pw, is_max):
    n, c, h, w = x.shape
    oh, ow = _out(h, kh, sh, ph, 1), _out(w, kw, sw, pw, 1)
    out = np.empty((n, c, oh, ow), dtype=x.dtype)
    for b in range(n):
        for ch in range(c):
            for a in range(oh):
                for e in range(ow):
                    acc = -np.inf if is_max else 0.0
                    for i in range(kh):
                        y = a * sh - ph + i
                        if y < 0 or y >= h:
                            continue
                        for j in range(kw):
                            z = e * sw - pw + j
                            if 0 <= z < w:
                                v = x[b, ch, y, z]
                                if is_max:
                                    if v > acc:
                                        acc = v
                                else:
                                    acc += v
                    out[b, ch, a, e] = acc if is_max else acc / (kh * kw)
    return out


@numba_njit
def pool2d_grad(x, dy, kh, kw, sh, sw, ph, pw, is_max):
    n, c, h, w = x.shape
    oh, ow = dy.shape[2], dy.shape[3]
    dx = np.zeros(x.shape, dtype=dy.dtype)
    for b in range(n):
        for ch in range(c):
            for a in range(oh):
                for e in range(ow):
                    g = dy[b, ch, a, e]
                    best, by, bz = -np.inf, -1, -1
                    for i in range(kh):
                        y = a * sh - ph + i
                        if y < 0 or y >= h:
                            continue
                        for j in range(kw):
                            z = e * sw - pw + j
                            if z < 0 or z >= w:
                                continue
                            if is_max:
                                if x[b, ch, y, z] > best:
                                    best, by, bz = x[b, ch, y, z], y, z
                            else:
                                dx[b, ch, y, z] += g / (kh * kw)
                    if is_max and by >= 0:
                        dx[b, ch, by, bz] += g
    return dx

"""Convolutions with few input channels (first layers) as GEMMs of window columns.

The window columns of x hold, for each output pixel (n, p, q), the R*S*C input values its
filter window sees, tap (i, j) of channel c at column (i * S + j) * C + c, zero-padded to a
16-byte pitch. With them a convolution is a GEMM whose K is R*S*C:

    forward          y  = act(cols @ w_cols + bias) + residual   (the fused GEMM epilogue)
    weight gradient  dw = cols^T @ dy
    data gradient    dx = col2im(dy @ w_cols^T)                   (col2im_p: sums each x
                                                                   element's window entries)

Below 32 channels the Hopper conv kernels are not used and the sm80 one gathers a 16-byte
chunk of channels per pixel and tap, C padded to a multiple of 8 (C = 1: 8x the products);
it ran MNIST's 28^2 1 -> 128 layer (batch 512) in 0.60 ms, where the layer's output alone
takes ~0.03 to write. The GEMM's K = R*S*C fills its tiles instead, at the cost of writing
the columns (R*S*C values per pixel: for C = 1 and 3x3 filters, 16 columns against an
output of 128 channels; for C = 16, 144). conv.py picks this route wherever jaxgemm's
kernels run: for the forward and weight gradient of 16-bit convolutions with C <=
GEMM_CHANNELS (`gemm_fits`), and for the data gradient of every dtype with C <= 16
(`dgrad_prefers_col2im`); a forced kernel family keeps the conv kernels.

The forward's limit is measured (jaxgemm.bench.conv, bf16, batch 64, one H200, fprop XLA / ours,
this route against the conv kernels): C = 1 3x3 2.8x (28^2 1 -> 128); C = 3 3x3 0.73x
against 0.84x, C = 3 7x7 stride 2 0.38x against 1.16x, C = 16 3x3 0.19x against 0.57x.
JAXGEMM_WINDOW_GEMM_CHANNELS (read when a conv is traced) moves the limit, to measure the
route elsewhere.
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import ad

from jaxgemm import xla_cpu
from jaxgemm.epilogue import EpilogueConfig, fused_gemm_call
from jaxgemm.gemm import GemmConfig, collective_sm_margin, gemm_local
from jaxgemm.kernels import HALF_DTYPES
from jaxgemm.matmul import matmul
from jaxgemm.primitive import (
    Op,
    Result,
    Rule,
    batch_size,
    define,
    fold_batch,
    psum_over,
)

MAX_CHANNELS = 16
GEMM_CHANNELS = 2  # the forward's and weight gradient's limit (measured: the docstring)
_INDEX_LIMIT = 2**31  # col2im's and the columns' 32-bit element indices


def pitch(r, s, c) -> int:
    """Columns per output pixel: R*S*C rounded up to 8 (16-byte rows for every dtype)."""
    return -(-(r * s * c) // 8) * 8


def geometry(config, r, s) -> tuple:
    """(R, S, stride h, w, pad top, left, dilation h, w): col2im's window attributes."""
    (sh, sw), (dh, dw) = config.stride, config.dilation
    return (r, s, sh, sw, config.padding[0][0], config.padding[1][0], dh, dw)


def window_columns(x, cols_shape, geom):
    """The window columns (N, P, Q, pitch) of x (N, H, W, C), in jnp (col2im's transpose)."""
    n, p, q, width = cols_shape
    r, s, sh, sw, ph, pw, dh, dw = geom
    h, w, c = x.shape[1:]
    high = ((p - 1) * sh + (r - 1) * dh + 1 - h - ph, (q - 1) * sw + (s - 1) * dw + 1 - w - pw)
    xp = lax.pad(x, jnp.zeros((), x.dtype), ((0, 0, 0), (ph, high[0], 0), (pw, high[1], 0), (0, 0, 0)))
    taps = [lax.slice(xp, (0, i * dh, j * dw, 0), (n, i * dh + (p - 1) * sh + 1, j * dw + (q - 1) * sw + 1, c),
                      (1, sh, sw, 1)) for i in range(r) for j in range(s)]  # fmt: skip
    cols = jnp.stack(taps, axis=3).reshape(n, p, q, r * s * c)
    return jnp.pad(cols, ((0, 0),) * 3 + ((0, width - r * s * c),))


def window_weights(w):
    """w (R, S, C, K) as the GEMM's (pitch, K) operand, zero rows past R*S*C."""
    r, s, c, k = w.shape
    return jnp.pad(w.reshape(r * s * c, k), ((0, pitch(r, s, c) - r * s * c), (0, 0)))


# ---------------------------------------------------------------------------------------
# Which convolutions take the route.


def _few_channels(config, r, s, c, pixels) -> bool:
    """The route's rule for every pass: the heuristic's choice (no forced kernel family),
    groups 1, C <= 16, a window of more than one tap, 32-bit indices into the columns of
    `pixels` output pixels."""
    return (
        config.kernel is None
        and config.groups == 1
        and c <= MAX_CHANNELS
        and r * s > 1
        and pixels * pitch(r, s, c) < _INDEX_LIMIT
    )


def gemm_fits(x_shape, kernel_hw, dtype, config) -> bool:
    """Whether the forward and weight gradient run as GEMMs of window columns: 16-bit
    operands, 1 to GEMM_CHANNELS channels, some output pixels, and the route's rule."""
    n, h, w, c = x_shape
    r, s = kernel_hw[:2]
    p, q = config.output_hw((h, w), (r, s))
    return (
        jnp.dtype(dtype) in HALF_DTYPES
        and 0 < c <= int(os.environ.get("JAXGEMM_WINDOW_GEMM_CHANNELS", GEMM_CHANNELS))
        and n * p * q > 0
        and _few_channels(config, r, s, c, n * p * q)
    )


def dgrad_prefers_col2im(dy, w, config, input_hw) -> bool:
    """Whether dgrad runs as a GEMM into window columns plus col2im (every dtype), where the
    phase-split kernels would compute C of each 64-wide tile's columns: the route's rule and
    32-bit indices into dx."""
    r, s, c = w.shape[:3]
    n = dy.shape[0]
    return _few_channels(config, r, s, c, math.prod(dy.shape[:3])) and n * math.prod(input_hw) * c < _INDEX_LIMIT


# ---------------------------------------------------------------------------------------
# The three passes. The forward and weight gradient run inside conv.py's lowerings, on one
# device's shards, wherever jaxgemm's kernels run (CUDA, and the CPU handlers under
# JAXGEMM_CPU=ffi, which the tests use); XLA's CPU lowering keeps XLA's convolution.


def _columns(x, config, kernel_hw):
    """x's window columns (N, P, Q, pitch)."""
    r, s = kernel_hw
    p, q = config.output_hw(x.shape[1:3], kernel_hw)
    return window_columns(x, (x.shape[0], p, q, pitch(r, s, x.shape[3])), geometry(config, r, s))


def fprop_via_gemm(x, w, bias, residual, config, want_aux, platform):
    """[y] or [y, aux] (N, P, Q, K): the columns times w_cols with the fused epilogue."""
    cols = _columns(x, config, w.shape[:2])
    out_shape = cols.shape[:3] + (w.shape[3],)
    res = None if residual is None else residual.reshape(-1, out_shape[3])
    epi = EpilogueConfig(config.activation, 0.0, want_aux)
    y, aux = fused_gemm_call(GemmConfig(out_dtype=config.out_dtype), epi, cols.reshape(-1, cols.shape[3]),
                             window_weights(w), None, bias, res, platform)  # fmt: skip
    return [o.reshape(out_shape) for o in ([y, aux] if want_aux else [y])]


def wgrad_via_gemm(x, dy, config, kernel_hw, platform, axes):
    """dw (R, S, C, K) = cols^T @ dy, summed over the mesh axes that shard the images."""
    r, s = kernel_hw
    c, k = x.shape[3], dy.shape[3]
    sharded = platform == "cuda" and bool((axes or {}).get("n"))
    gemm = GemmConfig(transpose_a=True, out_dtype=x.dtype, weight_gradient=True,
                      sm_margin=collective_sm_margin() if sharded else 0)  # fmt: skip
    cols = _columns(x, config, kernel_hw)
    (dw,) = gemm_local(cols.reshape(-1, cols.shape[3]), dy.reshape(-1, k), config=gemm, platform=platform)
    return psum_over(dw[: r * s * c].reshape(r, s, c, k), axes or {}, ("n",), ("kr", "ks", "c", "k"))


def dgrad_via_col2im(dy, w, config, input_hw):
    """dx as cols = dy @ w_cols^T on jaxgemm.matmul (fp32 accumulation, rounded to the input
    dtype), then the jaxgemm_col2im kernel sums each dx element's window entries in float32
    (ffi_src/conv/col2im.h)."""
    r, s, c, k = w.shape
    cols = matmul(dy.reshape(-1, k), window_weights(w).T).reshape(*dy.shape[:3], pitch(r, s, c))
    return col2im_op.bind(cols, geometry=geometry(config, r, s), input_hw=input_hw, channels=c)[0]


# ---------------------------------------------------------------------------------------
# col2im_p: dx from window columns (linear; its transpose is window_columns).

_X = ("n", "hi", "wi", "c")


def _col2im_abstract(cols, *, geometry, input_hw, channels):
    return [Result((cols.shape[0], *input_hw, channels), cols.dtype)]


def _col2im_rule(cols, **params):
    return Rule((("n", "ho", "wo", "x"),), (_X,), frozenset({"hi", "wi", "ho", "wo", "x", "c"}))


def _col2im_local(cols, *, geometry, input_hw, channels, platform, axes):
    dx = jax.ShapeDtypeStruct((cols.shape[0], *input_hw, channels), cols.dtype)
    if xla_cpu.enabled(platform):  # the transpose of the window columns, in XLA
        return [xla_cpu.pull_back(lambda x: window_columns(x, cols.shape, geometry), dx.shape, dx.dtype, cols)]
    r, s, sh, sw, ph, pw, dh, dw = (np.int64(v) for v in geometry)
    return [jax.ffi.ffi_call("jaxgemm_col2im", dx)(
        cols, r=r, s=s, stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw, dil_h=dh, dil_w=dw)]


def _col2im_batch(args, dims, **params):
    size = batch_size(args, dims)
    (dx,) = col2im_op.bind(fold_batch(args[0], dims[0], size), **params)
    return [dx.reshape((size, -1) + dx.shape[1:])], [0]


def _col2im_jvp(primals, tangents, **params):
    (dcols,) = tangents
    outs = col2im_op.bind(*primals, **params)
    if type(dcols) is ad.Zero:
        return outs, [ad.Zero.from_primal_value(outs[0])]
    return outs, col2im_op.bind(dcols, **params)


def _col2im_transpose(cts, cols, *, geometry, input_hw, channels):
    (ct,) = cts
    return [None if type(ct) is ad.Zero else window_columns(ct, cols.aval.shape, geometry)]


col2im_op = define(Op(
    "jaxgemm_col2im", abstract=_col2im_abstract, rule=_col2im_rule, local=_col2im_local,
    batch=_col2im_batch, jvp=_col2im_jvp, transpose=_col2im_transpose,
))  # fmt: skip
col2im_p = col2im_op.primitive

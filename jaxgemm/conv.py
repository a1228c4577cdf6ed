"""`jaxgemm.conv2d`: implicit-GEMM 2-D convolution (NHWC activations, HWIO weights) with
the GEMM's fused epilogue, and its gradient.

Three primitives, one per kernel kind (ffi_src/conv/problem.h has the math):

    conv2d_p        y = act(conv(x, w) + bias) + residual, optionally aux = pre-activation
    conv2d_dgrad_p  dx from dy and w (the transposed convolution, strided ones included;
                    16-bit stride-1 ones run as a forward convolution, see conv2d_dgrad)
    conv2d_wgrad_p  dw from x and dy (split over N*P*Q, fp32 partials summed by XLA)

each with abstract eval, a lowering to the jaxgemm_conv FFI call (CPU and CUDA) and a
batching rule that folds vmap into the image batch N (per-example weights fall back to a
loop). `conv2d` is a custom VJP: the backward pass computes dz = dy * act'(z) and the bias
gradient in one fused kernel (epilogue.bias_act_grad), then dgrad and wgrad on our kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from jaxgemm import _ffi, activations
from jaxgemm.epilogue import bias_act_grad
from jaxgemm.gemm import SUPPORTED_DTYPES, _kernel_out_dtype
from jaxgemm.matmul import matmul

_FPROP, _DGRAD, _WGRAD = 0, 1, 2  # ConvKind ids (ffi_src/conv/problem.h)
_TILE = 128  # output tile of every conv kernel (rows and columns)
# ConvConfig.kernel -> the handler's KernelFamily id (ffi_src/gemm/dispatch.h).
_CONV_KERNELS = {None: 0, "sm80": 2, "sm90": 3}


@dataclasses.dataclass(frozen=True)
class ConvConfig:
    """Static attributes of a convolution (hashable: primitive parameters).

    stride, dilation: (h, w); padding: ((top, bottom), (left, right)); out_dtype: what the
    forward kernel writes (the input dtype or float32); kernel: the CUDA kernel family of
    fprop, dgrad and wgrad, for tests and tuning (None: the heuristic; "sm80": never the
    sm90 kernels; "sm90": the sm90 kernel or an error where it cannot run)."""

    stride: tuple[int, int] = (1, 1)
    padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    activation: str | None = None
    out_dtype: Any = jnp.dtype(jnp.float32)
    kernel: str | None = None

    def __post_init__(self):
        if self.kernel not in _CONV_KERNELS:
            raise ValueError(f"ConvConfig.kernel must be None, 'sm80' or 'sm90', got {self.kernel!r}")

    def output_hw(self, hw, rs) -> tuple[int, int]:
        """(P, Q) of an input of spatial size hw and a kernel of spatial size rs."""
        out = []
        for size, taps, stride, dil, (lo, hi) in zip(hw, rs, self.stride, self.dilation, self.padding):
            span = size + lo + hi - ((taps - 1) * dil + 1)
            out.append(max(0, span // stride + 1))
        return tuple(out)


def _attrs(config: ConvConfig, kind: int, activation: str | None = None) -> dict:
    return dict(
        kind=np.int64(kind),
        stride_h=np.int64(config.stride[0]),
        stride_w=np.int64(config.stride[1]),
        pad_h=np.int64(config.padding[0][0]),
        pad_w=np.int64(config.padding[1][0]),
        dil_h=np.int64(config.dilation[0]),
        dil_w=np.int64(config.dilation[1]),
        groups=np.int64(config.groups),
        activation=np.int64(activations.activation_id(activation)),
        kernel=np.int64(_CONV_KERNELS[config.kernel]),
    )


def _ffi_conv(kind, a, b, out_shape, out_dtype, config, *, bias=None, residual=None, want_aux=False, activation=None):
    """The jaxgemm_conv FFI call (ffi_src/ffi/conv_decode.h has the contract): (out, aux)."""
    empty = jnp.zeros((0,), out_dtype)
    results = (
        jax.ShapeDtypeStruct(out_shape, out_dtype),
        jax.ShapeDtypeStruct(out_shape if want_aux else (0,), out_dtype),
    )
    return jax.ffi.ffi_call("jaxgemm_conv", results)(
        a,
        b,
        empty if bias is None else bias,
        empty if residual is None else residual,
        **_attrs(config, kind, activation),
    )


def _nonempty(*shapes) -> bool:
    return all(math.prod(s) > 0 for s in shapes)


# ---------------------------------------------------------------------------------------
# conv2d_p: the forward kernel with its epilogue.

conv2d_p = Primitive("jaxgemm_conv2d")
conv2d_p.multiple_results = True


def _fprop_shape(x_shape, w_shape, config):
    p, q = config.output_hw(x_shape[1:3], w_shape[:2])
    return (x_shape[0], p, q, w_shape[3])


def _check_operands(x, w, config, who):
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"{who}: needs x (N, H, W, C) and w (R, S, C/groups, K), got x{x.shape} and w{w.shape}")
    if x.dtype != w.dtype:
        raise TypeError(f"{who}: x and w need one dtype, got {x.dtype} and {w.dtype}")
    g = config.groups
    if w.shape[2] * g != x.shape[3] or w.shape[3] % g:
        raise ValueError(
            f"{who}: with groups={g}, x{x.shape} has C={x.shape[3]} channels but w{w.shape} expects "
            f"{w.shape[2] * g} (w's third dim times groups) and needs K={w.shape[3]} divisible by groups"
        )


def _fprop_abstract_eval(x, w, *rest, config, has_bias, has_residual, want_aux):
    _check_operands(x, w, config, "conv2d_p")
    if len(rest) != int(has_bias) + int(has_residual):
        raise ValueError("conv2d_p: operand count does not match has_bias / has_residual")
    y = jax.core.ShapedArray(_fprop_shape(x.shape, w.shape, config), config.out_dtype)
    return [y, y] if want_aux else [y]


def _fprop_lowering(ctx, x, w, *rest, config, has_bias, has_residual, want_aux):
    (y_aval, *_) = ctx.avals_out

    def run(x, w, *rest):
        bias = rest[0] if has_bias else None
        residual = rest[-1] if has_residual else None
        y, aux = _ffi_conv(
            _FPROP, x, w, y_aval.shape, y_aval.dtype, config,
            bias=bias, residual=residual, want_aux=want_aux, activation=config.activation,
        )  # fmt: skip
        return [y, aux] if want_aux else [y]

    return mlir.lower_fun(run, multiple_results=True)(ctx, x, w, *rest)


def _size_of(args, dims):
    return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def _map_fallback(prim, args, dims, **params):
    """vmap as a loop: for batched weights, and for wgrad, whose examples never share."""
    moved = [jnp.moveaxis(a, d, 0) for a, d in zip(args, dims) if d is not None]

    def one(batched):
        it = iter(batched)
        return prim.bind(*[next(it) if d is not None else a for a, d in zip(args, dims)], **params)

    out = lax.map(one, moved)
    return out, ([0] * len(out) if prim.multiple_results else 0)


def _fold_batch(x, d, size):
    """(B, N, ...) with the vmapped axis first (broadcast when unbatched) -> (B*N, ...)."""
    x = jnp.broadcast_to(x, (size,) + x.shape) if d is None else jnp.moveaxis(x, d, 0)
    return x.reshape((-1,) + x.shape[2:])


def _fprop_batch(args, dims, *, config, has_bias, has_residual, want_aux):
    params = dict(config=config, has_bias=has_bias, has_residual=has_residual, want_aux=want_aux)
    w_dim, bias_dim = dims[1], (dims[2] if has_bias else None)
    if w_dim is not None or bias_dim is not None:
        return _map_fallback(conv2d_p, args, dims, **params)
    size = _size_of(args, dims)
    x = _fold_batch(args[0], dims[0], size)
    rest = list(args[2:])
    if has_residual:
        rest[-1] = _fold_batch(rest[-1], dims[-1], size)
    outs = conv2d_p.bind(x, args[1], *rest, **params)
    return [o.reshape((size, -1) + o.shape[1:]) for o in outs], [0] * len(outs)


# ---------------------------------------------------------------------------------------
# conv2d_dgrad_p: dx = the transposed convolution of dy.

conv2d_dgrad_p = Primitive("jaxgemm_conv2d_dgrad")


def _dgrad_abstract_eval(dy, w, *, config, input_hw):
    if dy.ndim != 4 or w.ndim != 4 or dy.shape[3] != w.shape[3] or dy.dtype != w.dtype:
        raise ValueError(f"conv2d_dgrad_p: dy{dy.shape} {dy.dtype} does not fit w{w.shape} {w.dtype}")
    return jax.core.ShapedArray((dy.shape[0], *input_hw, w.shape[2] * config.groups), dy.dtype)


def _phase_taps(phase, taps, stride, pad, dil):
    """Taps of one dimension whose input rows land on dgrad output rows of `phase`."""
    return [t for t in range(taps) if (phase + pad - t * dil) % stride == 0]


def _dgrad_tap_order(r, s, config: ConvConfig):
    """Taps r * S + s in the kernels' phase order (DgradTapRows in ffi_src/conv/implicit_gemm.h):
    output phases (y outer, x inner), then each phase's taps (r outer, s inner)."""
    (sh, sw), (dh, dw) = config.stride, config.dilation
    pad_h, pad_w = config.padding[0][0], config.padding[1][0]
    order = []
    for py in range(sh):
        rows = _phase_taps(py, r, sh, pad_h, dh)
        for px in range(sw):
            order += [i * s + j for i in rows for j in _phase_taps(px, s, sw, pad_w, dw)]
    return order


def _dgrad_weight(w, config: ConvConfig):
    """w (R, S, Cg, K) -> (R, S, Kg, C): per group, B of dgrad as a dense row-major matrix,
    its taps in phase order (a static permutation; none for stride 1)."""
    r, s, cg, k = w.shape
    g = config.groups
    wt = w.reshape(r, s, cg, g, k // g).transpose(0, 1, 4, 3, 2).reshape(r * s, k // g, cg * g)
    order = _dgrad_tap_order(r, s, config)
    if order != list(range(r * s)):
        wt = wt[np.asarray(order)]
    return wt.reshape(r, s, k // g, cg * g)


def _dgrad_lowering(ctx, dy, w, *, config, input_hw):
    (dx_aval,) = ctx.avals_out

    def run(dy, w):
        if not _nonempty(dy.shape, w.shape):
            return jnp.zeros(dx_aval.shape, dx_aval.dtype)
        return _ffi_conv(_DGRAD, dy, _dgrad_weight(w, config), dx_aval.shape, dx_aval.dtype, config)[0]

    return mlir.lower_fun(run, multiple_results=False)(ctx, dy, w)


def _dgrad_batch(args, dims, *, config, input_hw):
    if dims[1] is not None:
        return _map_fallback(conv2d_dgrad_p, args, dims, config=config, input_hw=input_hw)
    size = _size_of(args, dims)
    dx = conv2d_dgrad_p.bind(_fold_batch(args[0], dims[0], size), args[1], config=config, input_hw=input_hw)
    return dx.reshape((size, -1) + dx.shape[1:]), 0


# ---------------------------------------------------------------------------------------
# conv2d_wgrad_p: dw = sum over (n, p, q) of x-windows times dy.

conv2d_wgrad_p = Primitive("jaxgemm_conv2d_wgrad")


def _wgrad_abstract_eval(x, dy, *, config, kernel_hw, split):
    if x.ndim != 4 or dy.ndim != 4 or x.shape[0] != dy.shape[0] or x.dtype != dy.dtype:
        raise ValueError(f"conv2d_wgrad_p: x{x.shape} {x.dtype} does not fit dy{dy.shape} {dy.dtype}")
    return jax.core.ShapedArray((*kernel_hw, x.shape[3] // config.groups, dy.shape[3]), x.dtype)


def _wgrad_split(m, n, k, groups, platform, forced, sm90=False) -> int:
    """Chunks of N*P*Q computed in parallel (one fp32 partial each), within the kernels'
    65535 grid rows. sm80 / SIMT: about two blocks per SM, chunks of at least 512 pixels.
    sm90 (`sm90`: the persistent kernel will run it): the count minimizing a cost model."""
    limit = max(1, 65535 // groups)
    if forced is not None:
        return min(max(1, int(forced)), limit)
    if platform != "cuda" or not _ffi.WITH_CUDA:
        return 1
    sm_count = _ffi.cuda_sm_count()
    if sm_count <= 0:
        return 1
    if sm90:
        return _sm90_wgrad_split(m, n, k, sm_count)
    tiles = math.ceil(m / _TILE) * math.ceil(n / _TILE) * groups
    return int(max(1, min(math.ceil(2 * sm_count / tiles), k // 512, 128, limit)))


def _sm90_wgrad_split(m, n, k, sm_count) -> int:
    """The persistent sm90 wgrad (128 x tile_n tiles, tile_n = 64 for n <= 64 as in
    RunSm90ConvWgrad, else 128; k-tiles of 64 pixels): rounds of sm_count work items times
    the k-tiles of a chunk (+2 for a tile's pipeline fill and epilogue, ~0.5 us per
    128 x 128 x 64 k-tile, in proportion for 128 x 64), plus writing and summing the
    partials (~3 TB/s). Chunks of at least 4 k-tiles."""
    tile_n = 64 if n <= 64 else 128
    tiles = math.ceil(m / 128) * math.ceil(n / tile_n)
    k_tiles = math.ceil(k / 64)
    k_tile_s = 0.5e-6 * tile_n / 128

    def cost(split):
        rounds = math.ceil(tiles * split / sm_count)
        return rounds * (math.ceil(k_tiles / split) + 2) * k_tile_s + split * m * n * 8 / 3e12

    return min(range(1, max(1, min(128, k_tiles // 4)) + 1), key=cost)


def _sm90_wgrad_likely(dtype, channels, groups, kernel) -> bool:
    """Whether the CUDA wgrad of x with `channels` channels will run on the sm90 kernel
    (Sm90ConvSupports in ffi_src/conv/sm90_conv.cu has the full rule; this is its shape part)."""
    return (
        kernel != "sm80"
        and _ffi.WITH_CUDA
        and _ffi.cuda_compute_capability() == 90
        and jnp.dtype(dtype) in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
        and groups == 1
        and channels % 64 == 0
    )


def _wgrad_lowering(ctx, x, dy, *, config, kernel_hw, split, platform):
    (dw_aval,) = ctx.avals_out
    r, s, cg, k = dw_aval.shape
    pixels = math.prod(ctx.avals_in[1].shape[:3])  # N*P*Q: the GEMM's k
    x_aval = ctx.avals_in[0]
    sm90 = platform == "cuda" and _sm90_wgrad_likely(x_aval.dtype, x_aval.shape[3], config.groups, config.kernel)
    parts = _wgrad_split(r * s * cg, k // config.groups, pixels, config.groups, platform, split, sm90)

    def run(x, dy):
        if not _nonempty(x.shape, dy.shape, dw_aval.shape):
            return jnp.zeros(dw_aval.shape, dw_aval.dtype)
        partials = _ffi_conv(_WGRAD, x, dy, (parts, *dw_aval.shape), jnp.float32, config)[0]
        return partials.sum(axis=0).astype(dw_aval.dtype)

    return mlir.lower_fun(run, multiple_results=False)(ctx, x, dy)


def _wgrad_batch(args, dims, **params):
    return _map_fallback(conv2d_wgrad_p, args, dims, **params)


@functools.partial(jax.jit, static_argnames=("prim", "params"))
def _impl(*args, prim, params):
    # Eager calls compile the primitive alone, like any jitted function.
    return prim.bind(*args, **dict(params))


def _register(prim, abstract_eval, lowering, batcher, per_platform=False):
    prim.def_impl(lambda *args, **params: _impl(*args, prim=prim, params=tuple(sorted(params.items()))))
    prim.def_abstract_eval(abstract_eval)
    batching.primitive_batchers[prim] = batcher
    for platform in ("cpu", "cuda"):
        rule = functools.partial(lowering, platform=platform) if per_platform else lowering
        mlir.register_lowering(prim, rule, platform=platform)


_register(conv2d_p, _fprop_abstract_eval, _fprop_lowering, _fprop_batch)
_register(conv2d_dgrad_p, _dgrad_abstract_eval, _dgrad_lowering, _dgrad_batch)
_register(conv2d_wgrad_p, _wgrad_abstract_eval, _wgrad_lowering, _wgrad_batch, per_platform=True)


def _dgrad_as_fprop(dy, w, config: ConvConfig, input_hw) -> ConvConfig | None:
    """The forward convolution that equals dgrad, for stride 1 and groups 1 with 16-bit
    operands whose channel counts fit the tensor-core kernels (None otherwise): dx is dy
    convolved with the spatially flipped, (C, K)-swapped filters, stride 1, the same
    dilation and the complementary padding (R - 1) * dil - pad on each side. It runs on the
    forward kernels (sm90 on Hopper); strided dgrad keeps its phase-split kernel."""
    r, s, c, k = w.shape
    if (
        config.stride != (1, 1)
        or config.groups != 1
        or dy.dtype not in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
        or c % 8
        or k % 8
        or not _nonempty(dy.shape, w.shape, input_hw)
    ):
        return None
    (pt, pb), (pl, pr) = config.padding
    span_h, span_w = (r - 1) * config.dilation[0], (s - 1) * config.dilation[1]
    padding = ((span_h - pt, span_h - pb), (span_w - pl, span_w - pr))
    fprop = ConvConfig((1, 1), padding, config.dilation, 1, None, dy.dtype, config.kernel)
    return fprop if fprop.output_hw(dy.shape[1:3], (r, s)) == tuple(input_hw) else None


def _tensor_core_channel_pad(dtype, groups, c, k) -> int:
    """Zero channels added to x and w of a 16-bit first layer (C = 3, 4; groups 1) so the
    tensor-core kernels, which move 16-byte chunks of channels, take it instead of SIMT;
    their gradients are sliced off."""
    if jnp.dtype(dtype) == jnp.float32 or groups != 1 or c % 8 == 0 or k % 8:
        return 0
    return -c % 8


def _pad_channels(a, extra, axis):
    if not extra:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, extra)
    return jnp.pad(a, widths)


_COL2IM_MAX_CHANNELS = 16


def _dgrad_prefers_col2im(dy, w, config: ConvConfig, input_hw) -> bool:
    """Whether dgrad runs as a GEMM into im2col columns plus col2im (conv2d_dgrad): for few
    input channels (first layers), where the phase-split kernels would compute C of each
    64-wide tile's columns, the GEMM's R*S*C columns fill its tiles. Heuristic only (a
    forced kernel family keeps the conv kernels); 32-bit indices in col2im."""
    r, s, c, k = w.shape
    pitch = _col2im_pitch(r, s, c)
    n, p, q = dy.shape[:3]
    return (
        config.kernel is None
        and config.groups == 1
        and c <= _COL2IM_MAX_CHANNELS
        and r * s > 1
        and n * p * q * pitch < 2**31
        and n * math.prod(input_hw) * c < 2**31
    )


def _col2im_pitch(r, s, c) -> int:
    return -(-(r * s * c) // 8) * 8  # 16-byte rows for every dtype: vector stores, TMA


def _dgrad_via_col2im(dy, w, config: ConvConfig, input_hw):
    """dx as cols = dy @ w^T, one row of R*S*C window values per output pixel, on
    jaxgemm.matmul (fp32 accumulation, rounded to the input dtype), then the jaxgemm_col2im
    kernel sums each dx element's window entries in float32 (ffi_src/conv/col2im.h)."""
    r, s, c, k = w.shape
    pitch = _col2im_pitch(r, s, c)
    w_cols = jnp.pad(w.reshape(r * s * c, k), ((0, pitch - r * s * c), (0, 0))).T
    cols = matmul(dy.reshape(-1, k), w_cols).reshape(*dy.shape[:3], pitch)
    (sh, sw), (dh, dw) = config.stride, config.dilation
    dx = jax.ShapeDtypeStruct((dy.shape[0], *input_hw, c), dy.dtype)
    return jax.ffi.ffi_call("jaxgemm_col2im", dx, vmap_method="broadcast_all")(
        cols,
        r=np.int64(r), s=np.int64(s), stride_h=np.int64(sh), stride_w=np.int64(sw),
        pad_h=np.int64(config.padding[0][0]), pad_w=np.int64(config.padding[1][0]),
        dil_h=np.int64(dh), dil_w=np.int64(dw),
    )  # fmt: skip


def conv2d_dgrad(dy, w, config: ConvConfig, input_hw):
    """dx (N, *input_hw, C) of the convolution `config` from dy (N, P, Q, K)."""
    input_hw = tuple(int(v) for v in input_hw)
    if _dgrad_prefers_col2im(dy, w, config, input_hw):
        return _dgrad_via_col2im(dy, w, config, input_hw)
    c = w.shape[2]
    w = _pad_channels(w, _tensor_core_channel_pad(dy.dtype, config.groups, c, w.shape[3]), 2)
    fprop = _dgrad_as_fprop(dy, w, config, input_hw)
    if fprop is not None:
        w_t = jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2)
        dx = conv2d_p.bind(dy, w_t, config=fprop, has_bias=False, has_residual=False, want_aux=False)[0]
    else:
        dx = conv2d_dgrad_p.bind(dy, w, config=config, input_hw=input_hw)
    return dx[..., :c] if dx.shape[3] != c * config.groups else dx


def conv2d_wgrad(x, dy, config: ConvConfig, kernel_hw, split: int | None = None):
    """dw (R, S, C/groups, K) of the convolution `config`; `split` forces the number of
    N*P*Q chunks (None: the CUDA lowering picks, 1 on CPU)."""
    c = x.shape[3]
    x = _pad_channels(x, _tensor_core_channel_pad(x.dtype, config.groups, c, dy.shape[3]), 3)
    dw = conv2d_wgrad_p.bind(x, dy, config=config, kernel_hw=tuple(int(v) for v in kernel_hw), split=split)
    return dw[:, :, :c, :] if x.shape[3] != c else dw


# ---------------------------------------------------------------------------------------
# The differentiable op.


def _fprop(config, x, w, bias, residual, want_aux):
    extra = _tensor_core_channel_pad(x.dtype, config.groups, x.shape[3], w.shape[3])
    x, w = _pad_channels(x, extra, 3), _pad_channels(w, extra, 2)
    ops = [o for o in (bias, residual) if o is not None]
    return conv2d_p.bind(
        x, w, *ops, config=config, has_bias=bias is not None, has_residual=residual is not None, want_aux=want_aux
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _conv(config, x, w, bias, residual):
    return _fprop(config, x, w, bias, residual, False)[0]


def _conv_fwd(config, x, w, bias, residual):
    # act'(z) read off y where it can be (relu without a residual): then no z is written.
    from_output = activations.derivative_from_output(config.activation) and residual is None
    want_aux = config.activation is not None and not from_output
    outs = _fprop(config, x, w, bias, residual, want_aux)
    at = outs[0] if from_output else (outs[1] if want_aux else None)
    # The residual's cotangent is dy: keep only its dtype, in an empty array.
    marker = None if residual is None else jnp.zeros((0,), residual.dtype)
    return outs[0], (x, w, at, bias, marker)


def _conv_bwd(config, saved, dy):
    x, w, at, bias, residual = saved
    k = w.shape[3]
    if config.activation is None:
        dz = dy
        dbias = None if bias is None else dy.astype(jnp.float32).sum(axis=(0, 1, 2))
    else:
        dz, dbias = bias_act_grad(dy.reshape(-1, k), at.reshape(-1, k), None, config.activation)
        dz = dz.reshape(dy.shape)
    dz_in = dz.astype(x.dtype)
    dx = conv2d_dgrad(dz_in, w, config, x.shape[1:3])
    dw = conv2d_wgrad(x, dz_in, config, w.shape[:2])
    return (
        dx,
        dw,
        None if bias is None else dbias.astype(bias.dtype),
        None if residual is None else dy.astype(residual.dtype),
    )


_conv.defvjp(_conv_fwd, _conv_bwd)


def _conv1x1_prefers_matmul(dtype, stride, c, k) -> bool:
    """Whether an unpadded 1x1 convolution (groups 1) runs faster as jaxgemm.matmul. Measured
    on the H200 (ResNet-50's 56^2 1x1s, batch 64, forward + backward): float32 is 2.7-3x
    faster on the SIMT conv kernels than through the SIMT GEMM's gradient, and 16-bit
    stride-1 convs whose wgrad takes the sm90 conv kernel (C % 64 == 0) are 1.15x faster
    on the conv kernels; other 16-bit ones (strided: their dgrad phases lack taps) take
    the GEMM."""
    if dtype == jnp.float32:
        return False
    hopper_conv = _sm90_wgrad_likely(dtype, c, 1, None) and k % 8 == 0
    return not (hopper_conv and tuple(stride) == (1, 1))


def _conv1x1_as_matmul(x, w, stride, bias, activation, residual, out_dtype):
    """An unpadded 1x1 convolution is a GEMM of the (strided) pixels with w as (C, K): it
    runs on jaxgemm.matmul (sm90 on Hopper), whose VJP gives the gradients (the strided
    slice's transpose scatters dx back into the skipped pixels as zeros)."""
    sh, sw = stride
    if sh > 1 or sw > 1:
        x = x[:, ::sh, ::sw, :]
    n, p, q, c = x.shape
    k = w.shape[3]
    res = None if residual is None else residual.reshape(n * p * q, k)
    y = matmul(x.reshape(n * p * q, c), w.reshape(c, k), bias=bias, activation=activation, residual=res,
               out_dtype=out_dtype)  # fmt: skip
    return y.reshape(n, p, q, k)


# ---------------------------------------------------------------------------------------
# Argument checking and the public entry.


def _pair(v, name):
    if isinstance(v, (int, np.integer)):
        v = (int(v), int(v))
    try:
        v = tuple(int(e) for e in v)
    except TypeError:
        raise ValueError(f"jaxgemm.conv2d: {name} must be an int or a pair of ints, got {v!r}") from None
    if len(v) != 2 or min(v) < 1:
        raise ValueError(f"jaxgemm.conv2d: {name} must be a positive int or a pair of positive ints, got {v!r}")
    return v


def _padding(padding, hw, rs, stride, dilation):
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            raise ValueError(f"jaxgemm.conv2d: padding {padding!r} is not 'SAME', 'VALID', an int or pairs")
        eff = [(t - 1) * d + 1 for t, d in zip(rs, dilation)]
        return tuple(tuple(int(v) for v in pad) for pad in lax.padtype_to_pads(hw, eff, stride, padding.upper()))
    if isinstance(padding, (int, np.integer)):
        return ((int(padding),) * 2,) * 2
    try:
        pads = tuple(padding)
        if len(pads) == 2 and all(isinstance(v, (int, np.integer)) for v in pads):  # (ph, pw)
            return tuple((int(v), int(v)) for v in pads)
        pads = tuple((int(lo), int(hi)) for lo, hi in pads)
        if len(pads) == 2:
            return pads
    except (TypeError, ValueError):
        pass
    raise ValueError(
        f"jaxgemm.conv2d: padding must be 'SAME', 'VALID', an int, (ph, pw) or ((top, bottom), (left, right)), "
        f"got {padding!r}"
    )


def _check_dtype(dtype, what):
    dtype = jnp.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"jaxgemm.conv2d: {what} dtype {dtype} is not supported; use one of {names}")
    return dtype


def conv2d(
    x,
    w,
    *,
    stride=1,
    padding="SAME",
    dilation=1,
    groups=1,
    bias=None,
    activation=None,
    residual=None,
    out_dtype=None,
    kernel=None,
):
    """2-D convolution of NHWC `x` with HWIO `w` and a fused epilogue, on jaxgemm's kernels.

    Returns `act(conv(x, w) + bias) + residual`, where `conv` equals
    `lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation,
    dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups)`, accumulated
    in float32 (exact float32 for float32 inputs; tensor cores for 16-bit inputs). Its
    gradient runs the fused bias/activation backward kernel, then jaxgemm's data-gradient
    and weight-gradient convolution kernels. Unpadded 16-bit 1x1 convolutions with
    groups=1 run as one GEMM (`jaxgemm.matmul`) on the strided pixels, gradients included,
    unless the Hopper conv kernels take them (stride 1, C % 64 == 0). The data gradient
    of convolutions with few input channels (C <= 16, groups=1: first layers) is a GEMM
    into window columns plus a col2im kernel.

    Args:
      x: (N, H, W, C) input.
      w: (R, S, C // groups, K) filters.
      stride, dilation: an int or an (h, w) pair of positive ints (dilation of the filter).
      padding: "SAME", "VALID", an int, an (h, w) pair, or ((top, bottom), (left, right)).
      groups: feature groups; C and K must be divisible by it.
      bias: (K,) per output channel.
      activation: None, "relu", "gelu" (tanh approximation, = `jax.nn.gelu`),
        "gelu_exact", "silu", "sigmoid" or "tanh".
      residual: added after the activation; broadcastable to the output (N, P, Q, K).
      out_dtype: result dtype; defaults to the promoted input dtype.
      kernel: for tests and tuning, the CUDA kernel family of the forward convolution and
        of both gradients: None lets the heuristic pick, "sm80" avoids the Hopper kernels,
        "sm90" requires them (an error where they cannot run: the sm90 weight gradient
        needs C % 64 == 0, the strided data gradient taps in every output phase). A
        family forced here also keeps 1x1 convolutions, and the data gradient of convs
        with C <= 16 (otherwise a GEMM into window columns plus col2im), on the conv
        kernels.

    Returns:
      (N, P, Q, K) output.

    Raises:
      TypeError: unsupported dtypes (float32, float16 and bfloat16 are supported).
      ValueError: wrong ranks, channel counts that do not fit `groups`, non-positive
        strides or dilations, bad padding, an unknown activation, or a bias / residual
        that does not fit the output.
    """
    x, w = jnp.asarray(x), jnp.asarray(w)
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"jaxgemm.conv2d: needs x (N, H, W, C) and w (R, S, C/groups, K), got x{x.shape} and w{w.shape}")
    dtype = _check_dtype(jnp.result_type(x.dtype, w.dtype), "input")
    out_dtype = dtype if out_dtype is None else _check_dtype(out_dtype, "output")
    activations.activation_id(activation)
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"jaxgemm.conv2d: groups must be a positive int, got {groups!r}")
    groups = int(groups)
    n, h, wd, c = x.shape
    r, s, cg, k = w.shape
    if cg * groups != c or k % groups:
        raise ValueError(
            f"jaxgemm.conv2d: x{x.shape} has C={c} channels; with groups={groups}, w{w.shape} must be "
            f"(R, S, C/groups={c // groups if c % groups == 0 else c / groups}, K) with K divisible by groups"
        )
    if r < 1 or s < 1:
        raise ValueError(f"jaxgemm.conv2d: w{w.shape} has an empty spatial window")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    pads = _padding(padding, (h, wd), (r, s), stride, dilation)
    kernel_dtype = _kernel_out_dtype(dtype, out_dtype)
    if kernel not in _CONV_KERNELS:
        raise ValueError(f"jaxgemm.conv2d: kernel must be None, 'sm80' or 'sm90', got {kernel!r}")
    config = ConvConfig(stride, pads, dilation, groups, activation, kernel_dtype, kernel)
    out_shape = (n, *config.output_hw((h, wd), (r, s)), k)
    if bias is not None:
        bias = jnp.asarray(bias)
        _check_dtype(bias.dtype, "bias")
        if bias.shape != (k,):
            raise ValueError(f"jaxgemm.conv2d: bias must have shape ({k},) (one per output channel), got {bias.shape}")
        bias = bias.astype(kernel_dtype)
    if residual is not None:
        residual = jnp.asarray(residual)
        _check_dtype(residual.dtype, "residual")
        try:
            fits = jnp.broadcast_shapes(residual.shape, out_shape) == out_shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"jaxgemm.conv2d: residual of shape {residual.shape} does not fit the output {out_shape}")
        residual = jnp.broadcast_to(residual.astype(kernel_dtype), out_shape)
    if not _nonempty(out_shape):
        return jnp.zeros(out_shape, out_dtype)
    x, w = x.astype(dtype), w.astype(dtype)
    if kernel is None and r == s == 1 and groups == 1 and c > 0 and pads == ((0, 0), (0, 0)):
        if _conv1x1_prefers_matmul(dtype, stride, c, k):
            return _conv1x1_as_matmul(x, w, stride, bias, activation, residual, out_dtype)
    return _conv(config, x, w, bias, residual).astype(out_dtype)

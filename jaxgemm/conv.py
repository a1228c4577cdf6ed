"""`jaxgemm.conv2d`: implicit-GEMM 2-D convolution (NHWC activations, HWIO weights) with
the GEMM's fused epilogue, and its gradient.

Primitives in primitive.py's pattern, one per kernel kind (ffi_src/conv/problem.h has
the math):

    conv2d_p        y = act(conv(x, w) + bias) + residual, optionally aux = pre-activation
    conv2d_dgrad_p  dx from dy and w (the transposed convolution, strided ones included;
                    16-bit stride-1 ones run as a forward convolution, see conv2d_dgrad)
    conv2d_wgrad_p  dw from x and dy (split over N*P*Q, fp32 partials summed by XLA)

Convolutions with few input channels (first layers) run as GEMMs of window columns
instead, inside these primitives' lowerings wherever jaxgemm's kernels run: the 16-bit
forward and weight gradient for C <= 2, the data gradient for C <= 16 (conv_windows.py,
with its col2im_p).

Batching folds vmap into the image batch N (per-example weights fall back to a loop).
Sharding: images and output channels partition freely, input channels as a contraction
(partial sums, summed before the epilogue), windows stay whole. The plain convolution is
bilinear: its transposes are dgrad and wgrad, whose own transposes are the forward conv
and each other, so every derivative order runs on these kernels. The fused op's JVP puts
the epilogue's tangent through epilogue.epilogue_tangent, whose transpose is the fused
bias/activation backward kernel.
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
from jax.interpreters import ad

from jaxgemm import _ffi, _jaxgemm, activations, conv_windows, xla_cpu
from jaxgemm._compat import cotangent_sharding
from jaxgemm.epilogue import EpilogueConfig, epilogue_in_jax, epilogue_tangent
from jaxgemm.gemm import collective_sm_margin, kernel_out_dtype
from jaxgemm.kernels import CONV_KERNEL_FAMILIES, HALF_DTYPES, SUPPORTED_DTYPES
from jaxgemm.matmul import matmul
from jaxgemm.primitive import (
    BILINEAR,
    Op,
    Result,
    Rule,
    batch_size,
    canonical_out_sharding,
    constrain_output,
    define,
    fold_batch,
    psum_over,
)

_FPROP, _DGRAD, _WGRAD = (_jaxgemm.conv_kinds()[k] for k in ("fprop", "dgrad", "wgrad"))  # ConvKind ids
_TILE = 128  # output tile of every conv kernel (rows and columns)


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
        if self.kernel not in CONV_KERNEL_FAMILIES:
            raise ValueError(f"ConvConfig.kernel must be None, 'sm80' or 'sm90', got {self.kernel!r}")

    def output_hw(self, hw, rs) -> tuple[int, int]:
        """(P, Q) of an input of spatial size hw and a kernel of spatial size rs."""
        out = []
        for size, taps, stride, dil, (lo, hi) in zip(hw, rs, self.stride, self.dilation, self.padding):
            span = size + lo + hi - ((taps - 1) * dil + 1)
            out.append(max(0, span // stride + 1))
        return tuple(out)


def _attrs(config: ConvConfig, kind: int, activation: str | None = None, sm_margin: int = 0) -> dict:
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
        kernel=np.int64(CONV_KERNEL_FAMILIES[config.kernel]),
        sm_margin=np.int64(sm_margin),
    )


def _ffi_conv(kind, a, b, out_shape, out_dtype, config, *, bias=None, residual=None, want_aux=False, activation=None,
              sm_margin=0):  # fmt: skip
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
        **_attrs(config, kind, activation, sm_margin),
    )


def _nonempty(*shapes) -> bool:
    return all(math.prod(s) > 0 for s in shapes)


# ---------------------------------------------------------------------------------------
# conv2d_p: the forward kernel with its epilogue.

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


def _fprop_abstract(x, w, *rest, config, has_bias, has_residual, want_aux, out_sharding=None):
    _check_operands(x, w, config, "conv2d_p")
    if len(rest) != int(has_bias) + int(has_residual):
        raise ValueError("conv2d_p: operand count does not match has_bias / has_residual")
    y = Result(_fprop_shape(x.shape, w.shape, config), config.out_dtype)
    return [y, y] if want_aux else [y]


# Factors of a convolution's dims: images n, input channels c (cg per group), output
# channels k; the windows (hi, wi: input; ho, wo: output; kr, ks: filter taps) stay whole,
# and so do the channels of grouped convolutions.
_X, _Y, _W = ("n", "hi", "wi", "c"), ("n", "ho", "wo", "k"), ("kr", "ks", "c", "k")
_WINDOW = frozenset({"hi", "wi", "ho", "wo", "kr", "ks"})


def _conv_rule(config: ConvConfig, operands, results) -> Rule:
    if config.groups == 1:
        return Rule(operands, results, _WINDOW)
    rename = {"c": "cg"}
    grouped = tuple(tuple(rename.get(f, f) if dims is _W else f for f in dims) for dims in operands)
    return Rule(grouped, results, _WINDOW | {"c", "cg", "k"})


def _fprop_rule(x, w, *rest, config, has_bias, has_residual, want_aux, out_sharding=None):
    operands = (_X, _W) + ((("k",),) if has_bias else ()) + ((_Y,) if has_residual else ())
    return _conv_rule(config, operands, (_Y,) * (2 if want_aux else 1))


def _fprop_local(x, w, *rest, config, has_bias, has_residual, want_aux, platform, axes, out_sharding=None):
    bias = rest[0] if has_bias else None
    residual = rest[-1] if has_residual else None
    if xla_cpu.enabled(platform):
        z = psum_over(xla_cpu.conv(x, w, config, out_sharding), axes, ("c",), _Y)
        return _conv_epilogue(z, bias, residual, config, want_aux)
    if not axes.get("c") and conv_windows.gemm_fits(x.shape, w.shape, x.dtype, config):
        return conv_windows.fprop_via_gemm(x, w, bias, residual, config, want_aux, platform)
    shape = _fprop_shape(x.shape, w.shape, config)
    # 16-bit first layers' channels padded for the tensor-core kernels, here, so that the
    # gradients see the layer's own channels (dgrad of C = 3 takes the col2im path).
    extra = _tensor_core_channel_pad(x.dtype, config.groups, x.shape[3], w.shape[3])
    x, w = _pad_channels(x, extra, 3), _pad_channels(w, extra, 2)
    if not axes.get("c"):
        y, aux = _ffi_conv(_FPROP, x, w, shape, config.out_dtype, config, bias=bias, residual=residual,
                           want_aux=want_aux, activation=config.activation)  # fmt: skip
        return [y, aux] if want_aux else [y]
    # Input channels sharded: partial sums, summed, then the epilogue once.
    z = psum_over(_ffi_conv(_FPROP, x, w, shape, config.out_dtype, config)[0], axes, ("c",), _Y)
    return _conv_epilogue(z, bias, residual, config, want_aux)


def _conv_epilogue(z, bias, residual, config: ConvConfig, want_aux):
    """The kernel's epilogue in JAX, on a summed or XLA-computed convolution."""
    epi = EpilogueConfig(config.activation, 0.0, want_aux)
    return epilogue_in_jax(z, None, bias, residual, epi, config.out_dtype)


def _map_fallback(op, args, dims, **params):
    """vmap as a loop: for batched weights, and for wgrad, whose examples never share."""
    moved = [jnp.moveaxis(a, d, 0) for a, d in zip(args, dims) if d is not None]

    def one(batched):
        it = iter(batched)
        return op.bind(*[next(it) if d is not None else a for a, d in zip(args, dims)], **params)

    out = lax.map(one, moved)
    return out, [0] * len(out)


def _fprop_batch(args, dims, *, config, has_bias, has_residual, want_aux, out_sharding=None):
    params = dict(config=config, has_bias=has_bias, has_residual=has_residual, want_aux=want_aux)
    w_dim, bias_dim = dims[1], (dims[2] if has_bias else None)
    if w_dim is not None or bias_dim is not None:
        return _map_fallback(conv_op, args, dims, **params)
    size = batch_size(args, dims)
    x = fold_batch(args[0], dims[0], size)
    rest = list(args[2:])
    if has_residual:
        rest[-1] = fold_batch(rest[-1], dims[-1], size)
    outs = conv_op.bind(x, args[1], *rest, **params)
    return [o.reshape((size, -1) + o.shape[1:]) for o in outs], [0] * len(outs)


# ---------------------------------------------------------------------------------------
# conv2d_dgrad_p: dx = the transposed convolution of dy.

def _dgrad_abstract(dy, w, *, config, input_hw, out_sharding=None):
    if dy.ndim != 4 or w.ndim != 4 or dy.shape[3] != w.shape[3] or dy.dtype != w.dtype:
        raise ValueError(f"conv2d_dgrad_p: dy{dy.shape} {dy.dtype} does not fit w{w.shape} {w.dtype}")
    return [Result((dy.shape[0], *input_hw, w.shape[2] * config.groups), dy.dtype)]


def _dgrad_rule(dy, w, *, config, input_hw, out_sharding=None):
    return _conv_rule(config, (_Y, _W), (_X,))


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
        wt = jnp.stack([wt[i] for i in order])  # static slices: no constant index array
    return wt.reshape(r, s, k // g, cg * g)


def _dgrad_local(dy, w, *, config, input_hw, platform, axes, out_sharding=None):
    if xla_cpu.enabled(platform):
        return [psum_over(xla_cpu.conv_dgrad(dy, w, config, input_hw, out_sharding), axes, ("k",), _X)]
    shape = (dy.shape[0], *input_hw, w.shape[2] * config.groups)
    if not _nonempty(dy.shape, w.shape):
        return [jnp.zeros(shape, dy.dtype)]
    dx = _ffi_conv(_DGRAD, dy, _dgrad_weight(w, config), shape, dy.dtype, config)[0]
    return [psum_over(dx, axes, ("k",), _X)]


def _dgrad_batch(args, dims, *, config, input_hw, out_sharding=None):
    if dims[1] is not None:
        return _map_fallback(dgrad_op, args, dims, config=config, input_hw=input_hw)
    size = batch_size(args, dims)
    (dx,) = dgrad_op.bind(fold_batch(args[0], dims[0], size), args[1], config=config, input_hw=input_hw)
    return [dx.reshape((size, -1) + dx.shape[1:])], [0]


def _dgrad_transpose(cts, dy, w, *, config, input_hw, out_sharding=None):
    """dx = dgrad(dy, w) is bilinear: its transposes are the forward conv and wgrad."""
    (ct,) = cts
    if type(ct) is ad.Zero:
        return [None, None]
    if ad.is_undefined_primal(dy):
        return [_plain_conv(ct.astype(w.dtype), w, config, dy.aval.dtype, cotangent_sharding(dy.aval, ct)), None]
    return [None, conv2d_wgrad(ct.astype(dy.dtype), dy, config, w.aval.shape[:2],
                               out_sharding=cotangent_sharding(w.aval, ct))]


# ---------------------------------------------------------------------------------------
# conv2d_wgrad_p: dw = sum over (n, p, q) of x-windows times dy.

def _wgrad_abstract(x, dy, *, config, kernel_hw, split, out_sharding=None):
    if x.ndim != 4 or dy.ndim != 4 or x.shape[0] != dy.shape[0] or x.dtype != dy.dtype:
        raise ValueError(f"conv2d_wgrad_p: x{x.shape} {x.dtype} does not fit dy{dy.shape} {dy.dtype}")
    return [Result((*kernel_hw, x.shape[3] // config.groups, dy.shape[3]), x.dtype)]


def _wgrad_rule(x, dy, *, config, kernel_hw, split, out_sharding=None):
    return _conv_rule(config, (_X, _Y), (_W,))


def _wgrad_split(m, n, k, groups, platform, forced, sm90=False, sm_margin=0) -> int:
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
        # The launcher's tile rule and cost model (conv/sm90_wgrad_split.h), on the SMs the
        # handler leaves the kernel.
        return int(_jaxgemm.sm90_conv_wgrad_split(m, n, k, _ffi.kernel_sm_count(sm_margin)))
    tiles = math.ceil(m / _TILE) * math.ceil(n / _TILE) * groups
    return int(max(1, min(math.ceil(2 * sm_count / tiles), k // 512, 128, limit)))


def _sm90_wgrad_likely(dtype, channels, groups, kernel) -> bool:
    """Whether the CUDA wgrad of x with `channels` channels will run on the sm90 kernel
    (Sm90ConvSupports in ffi_src/conv/sm90_conv.cu has the full rule; this is its shape part)."""
    return (
        kernel != "sm80"
        and _ffi.hopper()
        and jnp.dtype(dtype) in HALF_DTYPES
        and groups == 1
        and channels % 64 == 0
    )


def _wgrad_local(x, dy, *, config, kernel_hw, split, platform, axes, out_sharding=None):
    if xla_cpu.enabled(platform):
        return [psum_over(xla_cpu.conv_wgrad(x, dy, config, kernel_hw, out_sharding), axes, ("n",), _W)]
    shape = (*kernel_hw, x.shape[3] // config.groups, dy.shape[3])
    r, s, cg, k = shape
    if not _nonempty(x.shape, dy.shape, shape):
        return [jnp.zeros(shape, x.dtype)]
    if conv_windows.gemm_fits(x.shape, shape, x.dtype, config):
        return [conv_windows.wgrad_via_gemm(x, dy, config, kernel_hw, platform, axes)]
    pixels = math.prod(dy.shape[:3])  # N*P*Q: the GEMM's k
    sm90 = platform == "cuda" and _sm90_wgrad_likely(x.dtype, x.shape[3], config.groups, config.kernel)
    # Images sharded: the partial sums are all-reduced beside the next layer's wgrad, which
    # leaves SMs free for NCCL (gemm.collective_sm_margin).
    margin = collective_sm_margin() if platform == "cuda" and (axes or {}).get("n") else 0
    parts = _wgrad_split(r * s * cg, k // config.groups, pixels, config.groups, platform, split, sm90, margin)
    partials = _ffi_conv(_WGRAD, x, dy, (parts, *shape), jnp.float32, config, sm_margin=margin)[0]
    # Images sharded (data parallel): each device's weight gradient is a partial sum.
    return [psum_over(partials.sum(axis=0), axes, ("n",), _W).astype(x.dtype)]


def _wgrad_batch(args, dims, **params):
    return _map_fallback(wgrad_op, args, dims, **params)


def _wgrad_transpose(cts, x, dy, *, config, kernel_hw, split, out_sharding=None):
    """dw = wgrad(x, dy) is bilinear: its transposes are dgrad and the forward conv."""
    (ct,) = cts
    if type(ct) is ad.Zero:
        return [None, None]
    if ad.is_undefined_primal(x):
        return [conv2d_dgrad(dy, ct.astype(dy.dtype), config, x.aval.shape[1:3], cotangent_sharding(x.aval, ct)), None]
    return [None, _plain_conv(x, ct.astype(x.dtype), config, dy.aval.dtype, cotangent_sharding(dy.aval, ct))]


def _fprop_transpose(cts, x, w, *rest, config, has_bias, has_residual, want_aux, out_sharding=None):
    """The plain forward conv (the JVP's tangents) is linear in x and in w."""
    assert not (rest or want_aux or config.activation), "only the plain conv2d_p is transposed"
    (ct,) = cts
    if type(ct) is ad.Zero:
        return [None, None]
    if ad.is_undefined_primal(x):
        return [conv2d_dgrad(ct.astype(w.dtype), w, config, x.aval.shape[1:3], cotangent_sharding(x.aval, ct)), None]
    return [None, conv2d_wgrad(x, ct.astype(x.dtype), config, w.aval.shape[:2], out_sharding=cotangent_sharding(w.aval, ct))]


def _plain_conv(x, w, config: ConvConfig, out_dtype, out_sharding=None):
    plain = dataclasses.replace(config, activation=None, out_dtype=jnp.dtype(out_dtype))
    return conv_op.bind(x, w, config=plain, has_bias=False, has_residual=False, want_aux=False,
                        out_sharding=out_sharding)[0]  # fmt: skip


def _fprop_jvp(primals, tangents, *, config, has_bias, has_residual, want_aux, out_sharding=None):
    x, w, *rest = primals
    dx, dw, *drest = (None if type(t) is ad.Zero else t for t in tangents)
    dbias = drest[0] if has_bias else None
    dres = drest[-1] if has_residual else None
    act = config.activation
    from_output = activations.derivative_from_output(act) and not has_residual
    keep_z = want_aux or (act is not None and not from_output)
    outs = conv_op.bind(*primals, config=config, has_bias=has_bias, has_residual=has_residual, want_aux=keep_z,
                        out_sharding=out_sharding)  # fmt: skip
    y = outs[0]
    parts = ([_plain_conv(dx, w, config, y.dtype)] if dx is not None else []) + (
        [_plain_conv(x, dw, config, y.dtype)] if dw is not None else [])
    if not parts and dbias is None and dres is None:
        return outs[: 1 + want_aux], [ad.Zero.from_primal_value(o) for o in outs[: 1 + want_aux]]
    t = functools.reduce(jnp.add, parts) if parts else jnp.zeros_like(y)
    k = y.shape[-1]
    if act is None and dbias is None:
        ydot = t
    else:
        at = None if act is None else (y if from_output else outs[1]).reshape(-1, k)
        ydot = epilogue_tangent(t.reshape(-1, k), dbias, at, act).reshape(y.shape)
    if dres is not None:
        ydot = ydot + dres.astype(y.dtype)
    if not want_aux:
        return [y], [ydot]
    zdot = t if dbias is None else t + dbias.astype(t.dtype)
    return outs, [ydot, zdot]


conv_op = define(Op(
    "jaxgemm_conv2d", abstract=_fprop_abstract, rule=_fprop_rule, local=_fprop_local,
    batch=_fprop_batch, jvp=_fprop_jvp, transpose=_fprop_transpose,
))  # fmt: skip
dgrad_op = define(Op(
    "jaxgemm_conv2d_dgrad", abstract=_dgrad_abstract, rule=_dgrad_rule, local=_dgrad_local,
    batch=_dgrad_batch, jvp=BILINEAR, transpose=_dgrad_transpose,
))  # fmt: skip
wgrad_op = define(Op(
    "jaxgemm_conv2d_wgrad", abstract=_wgrad_abstract, rule=_wgrad_rule, local=_wgrad_local,
    batch=_wgrad_batch, jvp=BILINEAR, transpose=_wgrad_transpose,
))  # fmt: skip
conv2d_p, conv2d_dgrad_p, conv2d_wgrad_p = conv_op.primitive, dgrad_op.primitive, wgrad_op.primitive


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
        or dy.dtype not in HALF_DTYPES
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


def conv2d_dgrad(dy, w, config: ConvConfig, input_hw, out_sharding=None):
    """dx (N, *input_hw, C) of the convolution `config` from dy (N, P, Q, K) (typed with
    `out_sharding` in Explicit mode)."""
    input_hw = tuple(int(v) for v in input_hw)
    if conv_windows.dgrad_prefers_col2im(dy, w, config, input_hw):
        return conv_windows.dgrad_via_col2im(dy, w, config, input_hw)
    c = w.shape[2]
    w = _pad_channels(w, _tensor_core_channel_pad(dy.dtype, config.groups, c, w.shape[3]), 2)
    fprop = _dgrad_as_fprop(dy, w, config, input_hw)
    if fprop is not None:
        w_t = jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2)
        dx = conv_op.bind(dy, w_t, config=fprop, has_bias=False, has_residual=False, want_aux=False,
                          out_sharding=out_sharding)[0]  # fmt: skip
    else:
        (dx,) = dgrad_op.bind(dy, w, config=config, input_hw=input_hw, out_sharding=out_sharding)
    return dx[..., :c] if dx.shape[3] != c * config.groups else dx


def conv2d_wgrad(x, dy, config: ConvConfig, kernel_hw, split: int | None = None, out_sharding=None):
    """dw (R, S, C/groups, K) of the convolution `config`; `split` forces the number of
    N*P*Q chunks (None: the CUDA lowering picks, 1 on CPU)."""
    c = x.shape[3]
    if not conv_windows.gemm_fits(x.shape, kernel_hw, x.dtype, config):  # (window columns need no padding)
        x = _pad_channels(x, _tensor_core_channel_pad(x.dtype, config.groups, c, dy.shape[3]), 3)
    (dw,) = wgrad_op.bind(x, dy, config=config, kernel_hw=tuple(int(v) for v in kernel_hw), split=split,
                          out_sharding=out_sharding)  # fmt: skip
    return dw[:, :, :c, :] if x.shape[3] != c else dw


# ---------------------------------------------------------------------------------------
# The differentiable op.


def _conv(config, x, w, bias, residual, out_sharding=None):
    ops = [o for o in (bias, residual) if o is not None]
    return conv_op.bind(x, w, *ops, config=config, has_bias=bias is not None, has_residual=residual is not None,
                        want_aux=False, out_sharding=out_sharding)[0]  # fmt: skip


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
    out_sharding=None,
):
    """2-D convolution of NHWC `x` with HWIO `w` and a fused epilogue, on jaxgemm's kernels.

    Returns `act(conv(x, w) + bias) + residual`, where `conv` equals
    `lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation,
    dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups)`, accumulated
    in float32 (exact float32 for float32 inputs; tensor cores for 16-bit inputs). Its
    gradient runs the fused bias/activation backward kernel, then jaxgemm's data-gradient
    and weight-gradient convolution kernels. Unpadded 16-bit 1x1 convolutions with
    groups=1 run as one GEMM (`jaxgemm.matmul`) on the strided pixels, gradients included,
    unless the Hopper conv kernels take them (stride 1, C % 64 == 0). Convolutions
    with few input channels (groups=1: first layers) run as GEMMs of their window
    columns (R*S*C input values per output pixel): on CUDA the 16-bit forward and weight
    gradient with C <= 2, and the data gradient of every dtype with C <= 16 (plus a
    col2im kernel).

    Args:
      x: (N, H, W, C) input.
      w: (R, S, C // groups, K) filters.
      stride, dilation: an int or an (h, w) pair of positive ints (dilation of the filter).
      padding: "SAME", "VALID", an int, an (h, w) pair, or ((top, bottom), (left, right)).
      groups: feature groups; C and K must be divisible by it.
      bias: (K,) per output channel.
      activation: None, "relu", "gelu" (tanh approximation, = `jax.nn.gelu`),
        "gelu_exact", "silu", "sigmoid" or "tanh", or the jax.nn function of one.
      residual: added after the activation; broadcastable to the output (N, P, Q, K).
      out_dtype: result dtype; defaults to the inputs' dtype promoted with bias and residual.
      out_sharding: the result's sharding (a NamedSharding, or a PartitionSpec on the
        current mesh), as for `lax.conv_general_dilated`; in Explicit mode needed where the
        input channels are sharded in both x and w.
      kernel: for tests and tuning, the CUDA kernel family of the forward convolution and
        of both gradients: None lets the heuristic pick, "sm80" avoids the Hopper kernels,
        "sm90" requires them (an error where they cannot run: the sm90 weight gradient
        needs C % 64 == 0, the strided data gradient taps in every output phase). A
        family forced here also keeps 1x1 convolutions and few-channel convs
        (otherwise GEMMs of window columns) on the conv kernels.

    Returns:
      (N, P, Q, K) output.

    Raises:
      TypeError: unsupported dtypes (float32, float16 and bfloat16 are supported).
      ValueError: wrong ranks, channel counts that do not fit `groups`, non-positive
        strides or dilations, bad padding, an unknown activation, or a bias / residual
        that does not fit the output.
    """
    x, w = jnp.asarray(x), jnp.asarray(w)
    out_sharding = canonical_out_sharding(out_sharding, "jaxgemm.conv2d")
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"jaxgemm.conv2d: needs x (N, H, W, C) and w (R, S, C/groups, K), got x{x.shape} and w{w.shape}")
    dtype = _check_dtype(jnp.result_type(x.dtype, w.dtype), "input")
    if out_dtype is None:  # promoted with bias and residual, as `conv(x, w) + bias` would be
        extra = [jnp.asarray(v).dtype for v in (bias, residual) if v is not None]
        out_dtype = _check_dtype(jnp.result_type(dtype, *extra), "output")
    else:
        out_dtype = _check_dtype(out_dtype, "output")
    activation = activations.canonical(activation)
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
    kernel_dtype = kernel_out_dtype(dtype, out_dtype)
    if kernel not in CONV_KERNEL_FAMILIES:
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
            y = _conv1x1_as_matmul(x, w, stride, bias, activation, residual, out_dtype)
            return constrain_output(y, out_sharding)
    y = _conv(config, x, w, bias, residual, out_sharding).astype(out_dtype)
    return constrain_output(y, out_sharding)

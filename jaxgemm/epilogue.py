"""GEMMs with a fused epilogue, and their derivatives.

    z = alpha * op(a) @ op(b) + beta * c + bias,   y = act(z) + residual,   aux = z

Three primitives (primitive.py's pattern):

    gemm_epilogue_p     the forward pass: one jaxgemm_gemm kernel
    epilogue_tangent_p  dy = act'(z) * (dz + dbias): the epilogue's tangent, linear in
                        (dz, dbias); elementwise jnp
    bias_act_grad_p     (dz, dbias) = (dy * act'(z), sum of dz over rows): its transpose,
                        one fused kernel (jaxgemm_bias_act_grad)

The JVP of the fused GEMM is the bilinear GEMM's tangents (gemm_p) through
epilogue_tangent_p; reverse mode is JAX's transpose of it, so `grad` runs the fused
forward, bias_act_grad_p, then dgrad and wgrad on jaxgemm's GEMMs (input dtype, fp32
accumulation). The two epilogue primitives are each other's transposes and differentiate
through act'' (activations.py), so every order of derivative composes. For relu without a
residual act'(z) is read off y, so the forward keeps no z.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad

from jaxgemm import activations, xla_cpu
from jaxgemm.gemm import (
    GemmConfig,
    broadcast_batch,
    gemm_abstract,
    gemm_dims,
    kernel_out_dtype,
    mn_major_for_simt,
    pad_axis,
    tf32_operands,
    batch_factors,
    call_gemm_ffi,
    gemm_local,
    gemm_op,
    gemm_rule,
    gemm_workspace_bytes,
    pad_rows_for_tensor_cores,
    rows_typed_sharded,
    runs_as_tf32,
    runs_on_simt_f32,
    unbroadcast,
)
from jaxgemm.kernels import HALF_DTYPES
from jaxgemm.primitive import Op, Result, Rule, all_to_front, define, psum_over

# The bias/activation backward's grid: a block covers 512 bytes of each row's columns
# (bias_act_grad.cu's vector kernel: 32 threads x 16 bytes) over a chunk of at least 64
# rows. Up to 256 chunks; more where the columns are few, until the grid holds ~2048
# blocks (8 resident on each of an H200's 132 SMs, two waves): a conv's 128 channels of
# 400k pixels in 256 chunks kept 2 blocks an SM.
_ROWS_PER_CHUNK = 64
_CHUNKS = 256
_TARGET_BLOCKS = 2048


def _bag_chunks(rows: int, cols: int, itemsize: int) -> int:
    col_blocks = max(1, math.ceil(cols * itemsize / 512))
    wanted = max(_CHUNKS, math.ceil(_TARGET_BLOCKS / col_blocks))
    return max(1, min(math.ceil(rows / _ROWS_PER_CHUNK), wanted, 65535))  # 65535: the grid's y limit


@dataclasses.dataclass(frozen=True)
class EpilogueConfig:
    """Static epilogue options (hashable: a primitive parameter)."""

    activation: str | None = None
    beta: float = 0.0
    want_aux: bool = False


    def __post_init__(self):
        activations.activation_id(self.activation)


def present_operands(operands, flags):
    """The optional operands in `flags`'s order, None for the absent ones."""
    it = iter(operands)
    return [next(it) if flag else None for flag in flags]


def _tangent_or_none(t):
    return None if t is None or type(t) is ad.Zero else t


def _plus_bias(t, dbias):
    """t (*batch, rows, n) in float32, plus dbias (*batch, n) on every row if given."""
    t = t.astype(jnp.float32)
    return t if dbias is None else t + jnp.expand_dims(dbias.astype(jnp.float32), -2)


# ---------------------------------------------------------------------------------------
# bias_act_grad_p: (dz, dbias) = (dy * act'(at) + extra, sum over rows of dz).


def _bag_abstract(dy, at, *extra, activation, has_extra):
    if dy.shape != at.shape or dy.ndim < 2 or dy.dtype != at.dtype:
        raise ValueError(f"bias_act_grad_p: dy{dy.shape} {dy.dtype} and z{at.shape} {at.dtype} must match, rank >= 2")
    return [Result(dy.shape, dy.dtype), Result(dy.shape[:-2] + dy.shape[-1:], jnp.float32)]


def _bag_rule(dy, at, *extra, activation, has_extra):
    dims = tuple(f"b{i}" for i in range(dy.ndim - 2)) + ("r", "n")
    return Rule((dims,) * (2 + len(extra)), (dims, dims[:-2] + ("n",)))


def _bag_local(dy, at, *extra, activation, has_extra, platform, axes):
    if xla_cpu.enabled(platform):
        dz, dbias = xla_cpu.bias_act_grad(dy, at, extra[0] if has_extra else None, activation)
        return [dz, psum_over(dbias, axes, ("r",))]
    rows, n = dy.shape[-2:]
    chunks = _bag_chunks(rows, n, jnp.dtype(dy.dtype).itemsize)
    results = (
        jax.ShapeDtypeStruct(dy.shape, dy.dtype),
        jax.ShapeDtypeStruct(dy.shape[:-2] + (chunks, n), jnp.float32),
    )
    dz, partials = jax.ffi.ffi_call("jaxgemm_bias_act_grad", results)(
        dy, at, extra[0] if has_extra else jnp.zeros((0,), dy.dtype),
        activation=np.int64(activations.activation_id(activation)),
    )  # fmt: skip
    # Rows sharded: each device sums its rows; the bias gradient is their sum.
    return [dz, psum_over(partials.sum(axis=-2), axes, ("r",))]


def _bag_batch(args, dims, **params):
    return bias_act_grad_op.bind(*all_to_front(args, dims), **params), [0, 0]


def _bag_jvp(primals, tangents, *, activation, has_extra):
    dy, at, *extra = primals
    ddy, dat, *dextra = tangents
    dz, dbias = bias_act_grad_op.bind(*primals, activation=activation, has_extra=has_extra)
    t_dz = t_dbias = None
    ddy, dextra = _tangent_or_none(ddy), [_tangent_or_none(t) for t in dextra]
    if ddy is not None or any(t is not None for t in dextra):
        ddy = jnp.zeros_like(dy) if ddy is None else ddy
        lin = [e if e is not None else jnp.zeros_like(dy) for e in dextra]
        t_dz, t_dbias = bias_act_grad_op.bind(ddy, at, *lin, activation=activation, has_extra=has_extra)
    if _tangent_or_none(dat) is not None and activation is not None:
        curve = (dy.astype(jnp.float32) * activations.second_derivative(activation, at) * dat.astype(jnp.float32))
        t_dz = curve.astype(dy.dtype) if t_dz is None else t_dz + curve.astype(dy.dtype)
        t_dbias = curve.sum(axis=-2) if t_dbias is None else t_dbias + curve.sum(axis=-2)
    out = [dz, dbias]
    if t_dz is None:
        return out, [ad.Zero.from_primal_value(dz), ad.Zero.from_primal_value(dbias)]
    return out, [t_dz, t_dbias]


def _bag_transpose(cts, dy, at, *extra, activation, has_extra):
    ct_dz, ct_dbias = (None if type(c) is ad.Zero else c for c in cts)
    if ct_dz is None:
        ct_dz = jnp.zeros_like(at)  # dy's shape and dtype
    through = ct_dz if ct_dbias is None else ct_dz + jnp.expand_dims(ct_dbias, -2).astype(ct_dz.dtype)
    ct_dy = epilogue_tangent(ct_dz, ct_dbias, at, activation) if ad.is_undefined_primal(dy) else None
    ct_extra = [through if ad.is_undefined_primal(e) else None for e in extra]
    return [ct_dy, None, *ct_extra]


bias_act_grad_op = define(Op(
    "jaxgemm_bias_act_grad", abstract=_bag_abstract, rule=_bag_rule, local=_bag_local,
    batch=_bag_batch, jvp=_bag_jvp, transpose=_bag_transpose,
))  # fmt: skip


def bias_act_grad(dy, z, extra, activation: str | None):
    """(dz, dbias) for dy, z of shape (*batch, rows, n): dz = dy * act'(z) (+ extra),
    dbias (*batch, n) in float32, summed over rows in a fixed order."""
    extra = () if extra is None else (extra.astype(dy.dtype),)
    return tuple(bias_act_grad_op.bind(dy, z.astype(dy.dtype), *extra, activation=activation, has_extra=bool(extra)))


# ---------------------------------------------------------------------------------------
# epilogue_tangent_p: act'(at) * (t + dbias), linear in (t, dbias).


def _et_abstract(t, *rest, activation, has_bias):
    return [Result(t.shape, t.dtype)]


def _et_rule(t, *rest, activation, has_bias):
    dims = tuple(f"b{i}" for i in range(t.ndim - 2)) + ("r", "n")
    operands = [dims]
    if has_bias:
        operands.append(batch_factors(rest[0].shape[:-1], t.shape[:-2], "s") + ("n",))
    if activation is not None:
        operands.append(dims)
    return Rule(tuple(operands), (dims,))


def _et_local(t, *rest, activation, has_bias, platform, axes):
    dbias, at = present_operands(rest, (has_bias, activation is not None))
    z = _plus_bias(t, dbias)
    if activation is not None:
        z = z * activations.derivative(activation, at)
    return [z.astype(t.dtype)]


def _et_batch(args, dims, *, activation, has_bias):
    return epilogue_tangent_op.bind(*all_to_front(args, dims), activation=activation, has_bias=has_bias), [0]


def _et_jvp(primals, tangents, *, activation, has_bias):
    t, *rest = primals
    dt, *drest = tangents
    dbias, at = present_operands(rest, (has_bias, activation is not None))
    ddbias, dat = present_operands(drest, (has_bias, activation is not None))
    (out,) = epilogue_tangent_op.bind(*primals, activation=activation, has_bias=has_bias)
    lin_t, lin_b = _tangent_or_none(dt), _tangent_or_none(ddbias)
    tangent = None
    if lin_t is not None or lin_b is not None:
        tangent = epilogue_tangent(jnp.zeros_like(t) if lin_t is None else lin_t,
                                   None if not has_bias else (jnp.zeros_like(dbias) if lin_b is None else lin_b),
                                   at, activation)  # fmt: skip
    if activation is not None and _tangent_or_none(dat) is not None:
        z = _plus_bias(t, dbias)
        curve = (z * activations.second_derivative(activation, at) * dat.astype(jnp.float32)).astype(t.dtype)
        tangent = curve if tangent is None else tangent + curve
    return [out], [ad.Zero.from_primal_value(out) if tangent is None else tangent]


def _et_transpose(cts, t, *rest, activation, has_bias):
    (ct,) = cts
    dbias, at = present_operands(rest, (has_bias, activation is not None))
    if type(ct) is ad.Zero:
        return [None] * (1 + len(rest))
    if activation is None:
        dz, db = ct, ct.astype(jnp.float32).sum(axis=-2)
    else:
        dz, db = bias_act_grad(ct, at, None, activation)
    ct_t = dz if ad.is_undefined_primal(t) else None
    ct_b = None
    if has_bias and ad.is_undefined_primal(dbias):
        ct_b = unbroadcast(db, dbias.aval.shape).astype(dbias.aval.dtype)
    return [ct_t] + ([ct_b] if has_bias else []) + ([None] if activation is not None else [])


epilogue_tangent_op = define(Op(
    "jaxgemm_epilogue_tangent", abstract=_et_abstract, rule=_et_rule, local=_et_local,
    batch=_et_batch, jvp=_et_jvp, transpose=_et_transpose, custom_call=False,
))  # fmt: skip


def epilogue_tangent(t, dbias, at, activation: str | None):
    """act'(at) * (t + dbias) (dbias (*batch, n) broadcast over rows, or None)."""
    operands = [t] + ([dbias] if dbias is not None else []) + ([at.astype(t.dtype)] if activation is not None else [])
    return epilogue_tangent_op.bind(*operands, activation=activation, has_bias=dbias is not None)[0]


# ---------------------------------------------------------------------------------------
# gemm_epilogue_p: the fused forward GEMM.

_FLAGS = ("has_c", "has_bias", "has_residual")


def _out_shape(a, b, config):
    """Output shape for equal-rank operands (batch dims 1 or shared)."""
    m, _, n, _ = gemm_dims(a.shape, b.shape, config)
    return broadcast_batch(a.shape[:-2], b.shape[:-2]) + (m, n)


def _fused_abstract(a, b, *rest, config, epi, has_c, has_bias, has_residual, out_sharding=None):
    (y,) = gemm_abstract(a, b, config=config)  # checks the GEMM's operands
    return [y, y] if epi.want_aux else [y]


def _fused_rule(a, b, *rest, config, epi, has_c, has_bias, has_residual, out_sharding=None):
    product = gemm_rule(a.shape, b.shape, config)
    (out,) = product.results
    out_batch = _out_shape(a, b, config)[:-2]
    c, bias, residual = present_operands(rest, (has_c, has_bias, has_residual))
    operands = list(product.operands)
    if c is not None:
        operands.append(batch_factors(c.shape[:-2], out_batch, "c") + ("m", "n"))
    if bias is not None:
        operands.append(batch_factors(bias.shape[:-1], out_batch, "s") + ("n",))
    if residual is not None:
        operands.append(batch_factors(residual.shape[:-2], out_batch, "r") + ("m", "n"))
    return Rule(tuple(operands), (out,) * (2 if epi.want_aux else 1))


def epilogue_in_jax(acc, c, bias, residual, epi, out_dtype):
    """The kernels' epilogue in JAX (float32), on a product or convolution summed over a
    sharded contraction or computed by XLA: bias (*batch, n) is added to every row."""
    z = acc.astype(jnp.float32)
    if c is not None:
        z = z + epi.beta * c.astype(jnp.float32)
    z = _plus_bias(z, bias)
    y = activations.apply(epi.activation, z)
    if residual is not None:
        y = y + residual.astype(jnp.float32)
    return [y.astype(out_dtype)] + ([z.astype(out_dtype)] if epi.want_aux else [])


def _fused_local(a, b, *rest, config, epi, has_c, has_bias, has_residual, platform, axes, out_sharding=None):
    c, bias, residual = present_operands(rest, (has_c, has_bias, has_residual))
    if xla_cpu.enabled(platform) and not axes.get("k"):
        acc = xla_cpu.gemm(a, b, transpose_a=config.transpose_a, transpose_b=config.transpose_b, alpha=config.alpha,
                           out_dtype=jnp.float32, out_sharding=out_sharding)  # fmt: skip
        return epilogue_in_jax(acc, c, bias, residual, epi, config.out_dtype)
    if not axes.get("k"):
        y, aux = fused_gemm_call(config, epi, a, b, c, bias, residual, platform)
        return [y, aux] if epi.want_aux else [y]
    # K sharded: the bias, activation and residual act once, on the summed product.
    (acc,) = gemm_local(a, b, config=config, platform=platform, axes=axes)
    return epilogue_in_jax(acc, c, bias, residual, epi, config.out_dtype)


def fused_gemm_call(config, epi, a, b, c, bias, residual, platform):
    """[y, aux] of the jaxgemm_gemm call with the epilogue `epi`, on one device (aux empty
    unless epi.want_aux), with the operands prepared as each kernel family wants them."""
    out_shape = _out_shape(a, b, config)
    call_config = config
    m_pad = n_pad = 0
    if a.dtype in HALF_DTYPES and config.kernel is None:
        # 16-bit rows padded to the tensor cores' 16 bytes, c, bias and residual with them
        # (as in the plain GEMM; also for the CPU handlers, so that the tests run it).
        a, b, m_pad, n_pad = pad_rows_for_tensor_cores(a, b, config)
        c, residual = (None if x is None else pad_axis(pad_axis(x, -2, m_pad), -1, n_pad) for x in (c, residual))
        bias = None if bias is None else pad_axis(bias, -1, n_pad)
    elif platform == "cuda":
        # On a Hopper GPU the tf32 kernel takes its operands as tf32_operands stores them,
        # the SIMT float32 kernels large ones M- / N-major.
        if runs_as_tf32(a.dtype, config, platform):
            a, b, call_config = tf32_operands(a, b, config)
        elif runs_on_simt_f32(a.dtype, config, platform):
            a, b, call_config = mn_major_for_simt(a, b, config)
    padded_shape = out_shape[:-2] + (out_shape[-2] + m_pad, out_shape[-1] + n_pad)
    outs = call_gemm_ffi(
        a, b, c=c, bias=bias, residual=residual, config=call_config, out_shape=padded_shape,
        activation=activations.activation_id(epi.activation), beta=epi.beta, want_aux=epi.want_aux,
        workspace_bytes=gemm_workspace_bytes(a.shape, b.shape, a.dtype, call_config, 1, platform),
    )  # fmt: skip
    if m_pad or n_pad:
        outs = [o if o.ndim == 1 else o[..., : out_shape[-2], : out_shape[-1]] for o in outs]
    return outs


def _fused_batch(args, dims, *, config, epi, has_c, has_bias, has_residual, out_sharding=None):
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    moved = [x[None] if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims)]
    if dims[0] is None and dims[1] is None:  # only an epilogue operand is batched
        moved[0] = jnp.broadcast_to(moved[0], (size,) + moved[0].shape[1:])
    a, b, *rest = moved
    c, bias, residual = present_operands(rest, (has_c, has_bias, has_residual))
    out = fused_matmul(a, b, c, bias, residual, config, epi)  # a or b carries the vmapped axis
    outs = list(out) if epi.want_aux else [out]
    return outs, [0] * len(outs)


def _fused_jvp(primals, tangents, *, config, epi, has_c, has_bias, has_residual, out_sharding=None):
    flags = (has_c, has_bias, has_residual)
    a, b, *rest = primals
    da, db, *drest = (_tangent_or_none(t) for t in tangents)
    c, bias, residual = present_operands(rest, flags)
    dc, dbias, dres = present_operands(drest, flags)
    act = epi.activation
    from_output = activations.derivative_from_output(act) and residual is None
    keep_z = epi.want_aux or (act is not None and not from_output)
    outs = fused_op.bind(*primals, config=config, epi=dataclasses.replace(epi, want_aux=keep_z),
                         **dict(zip(_FLAGS, flags)), out_sharding=out_sharding)  # fmt: skip
    y, z = outs[0], (outs[1] if keep_z else None)
    parts = []
    if da is not None:
        parts.append(gemm_op.bind(da, b, config=config)[0])
    if db is not None:
        parts.append(gemm_op.bind(a, db, config=config)[0])
    if dc is not None and epi.beta != 0:
        parts.append((epi.beta * dc).astype(y.dtype))
    t = functools.reduce(jnp.add, parts) if parts else jnp.zeros_like(y)
    if dbias is not None and dbias.ndim < t.ndim - 1:
        dbias = dbias.reshape((1,) * (t.ndim - 1 - dbias.ndim) + dbias.shape)
    if not parts and dbias is None and dres is None:
        zero = [ad.Zero.from_primal_value(y)] * (2 if epi.want_aux else 1)
        return [y, z] if epi.want_aux else [y], zero
    ydot = t if (act is None and dbias is None) else epilogue_tangent(t, dbias, y if from_output else z, act)
    if dres is not None:
        ydot = ydot + dres.astype(y.dtype)
    if not epi.want_aux:
        return [y], [ydot]
    zdot = t if dbias is None else t + jnp.expand_dims(dbias, -2).astype(t.dtype)
    return [y, z], [ydot, zdot]


fused_op = define(Op(
    "jaxgemm_gemm_epilogue", abstract=_fused_abstract, rule=_fused_rule, local=_fused_local,
    batch=_fused_batch, jvp=_fused_jvp,
))  # fmt: skip
gemm_epilogue_p = fused_op.primitive


def fused_matmul(a, b, c, bias, residual, config: GemmConfig, epi: EpilogueConfig, out_sharding=None):
    """The fused GEMM (shapes validated by jaxgemm.matmul): operands brought to equal rank,
    batch folded into M when b and bias are shared; returns y, or (y, aux) with
    `epi.want_aux`. `out_sharding` types y in Explicit mode."""
    rank = max(a.ndim, b.ndim)
    a = a.reshape((1,) * (rank - a.ndim) + a.shape)
    b = b.reshape((1,) * (rank - b.ndim) + b.shape)
    out_shape = _out_shape(a, b, config)
    m, n = out_shape[-2:]
    kernel_dtype = kernel_out_dtype(a.dtype, config.out_dtype)
    kernel_config = dataclasses.replace(config, out_dtype=kernel_dtype)

    def as_matrix_operand(x):  # c, residual: the output's rank, matrix dims exact
        if x is None:
            return None
        x = x.astype(kernel_dtype)
        if x.shape[-2:] != (m, n):
            return jnp.broadcast_to(x, out_shape)
        return x.reshape((1,) * (rank - x.ndim) + x.shape)

    c, residual = as_matrix_operand(c), as_matrix_operand(residual)
    if bias is not None:
        bias = bias.astype(kernel_dtype)
        bias = bias.reshape((1,) * (rank - 1 - bias.ndim) + bias.shape)

    def bind(a, b, c, bias, residual, out_sharding):
        operands = [x for x in (c, bias, residual) if x is not None]
        return fused_op.bind(a, b, *operands, config=kernel_config, epi=epi, has_c=c is not None,
                             has_bias=bias is not None, has_residual=residual is not None,
                             out_sharding=out_sharding)  # fmt: skip

    b_shared = all(d == 1 for d in b.shape[:-2])
    bias_shared = bias is None or all(d == 1 for d in bias.shape[:-1])
    if rank > 2 and not config.transpose_a and b_shared and bias_shared and not rows_typed_sharded(a):
        # One large GEMM: batch folded into M (c and residual follow the output's layout).
        fold = lambda x: None if x is None else jnp.broadcast_to(x, out_shape).reshape(-1, n)  # noqa: E731
        outs = bind(a.reshape(-1, a.shape[-1]), b.reshape(b.shape[-2:]), fold(c),
                    None if bias is None else bias.reshape(n), fold(residual), None)  # fmt: skip
        outs = [o.reshape(out_shape) for o in outs]
    else:
        outs = bind(a, b, c, bias, residual, out_sharding)
    outs = [o.astype(config.out_dtype) for o in outs]
    return tuple(outs) if epi.want_aux else outs[0]

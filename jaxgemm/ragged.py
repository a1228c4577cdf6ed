"""jaxgemm.ragged_dot: one GEMM per group of rows (mixture-of-experts layers), with
`jax.lax.ragged_dot`'s semantics and an optional per-group bias, activation and residual.

Two primitives in primitive.py's pattern, each bilinear in its two arrays (the group sizes
are integers, not differentiated) and each the other's transpose partner, and the product
with its epilogue, differentiated through them:

    ragged_dot_p       out[m, n]    = lhs[rows of group j] @ rhs[j]     lhs (m, k), rhs (g, k, n)
    ragged_wgrad_p     dw[g, k, n]  = lhs[rows of j]^T @ dy[rows of j]  the weight gradient
    ragged_epilogue_p  act(out + bias[j]) + residual (and out + bias[j] for the JVP)

Rows past sum(group_sizes) belong to no group: their outputs are zero.

ragged_dot_p also takes rhs stored (g, n, k) (`transpose_rhs`: the input gradient's
weights, read as they are stored). On a Hopper GPU with 16-bit inputs their `local` is the
grouped kernel (ffi_src/gemm/sm90/grouped.cuh: group sizes read on the device); on a CPU
with JAXGEMM_CPU=ffi (the tests) the same calls' reference handler
(ffi_src/gemm/cpu_grouped.cc); elsewhere XLA's own ragged dot.

Sharding (the rule): rows (m) split as in data parallelism, each device taking its rows'
share of every group (`local_sizes`): no collective in the product, an all-reduce of the
weight gradient's partial sums, or a reduce-scatter over the experts where the gradient is
wanted split like weights sharded over the experts (FSDP-like); k and n split as in a GEMM.
Experts (g) split in an operand are gathered: computing them where they are would need the
tokens moved to their experts' devices (an all-to-all), which a shard_map over the routing
does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import ad

from jaxgemm import _ffi, _jaxgemm, activations, xla_cpu
from jaxgemm._compat import cotangent_sharding, xla_out_sharding
from jaxgemm.epilogue import present_operands, epilogue_tangent
from jaxgemm.kernels import HALF_DTYPES, SUPPORTED_DTYPES
from jaxgemm.primitive import (BILINEAR, SCATTER, Op, Result, Rule, all_to_front, canonical_out_sharding,
                               constrain_output, define, psum_over)  # fmt: skip

REPLICATED_DIMS = frozenset({"g"})


def product_precision(dtype, precision):
    """None means exact float32 for float32 inputs, as in jaxgemm.matmul."""
    return lax.Precision.HIGHEST if precision is None and jnp.dtype(dtype) == jnp.float32 else precision


# ---------------------------------------------------------------------------------------
# The grouped Hopper kernel (jaxgemm_ragged_dot): modes of ffi/ragged_handler_cuda.cu.

_ROWS, _ROWS_RHS_T, _CONTRACTION = (_jaxgemm.grouped_modes()[k] for k in ("rows", "rows_rhs_t", "contraction"))
_MAX_GROUPS = int(_jaxgemm.max_grouped_groups)  # the shared-memory table's limit


def _grouped_kernel_runs(dtype, out_dtype, platform, groups, *dims) -> bool:
    """Whether jaxgemm's grouped GEMM takes this product: on a CPU the reference handler where
    JAXGEMM_CPU=ffi asks for it (xla_cpu.py); on a GPU the grouped kernel: a Hopper GPU,
    16-bit inputs, an output of their type or float32, at most _MAX_GROUPS groups, dims in
    whole 16-byte rows."""
    if platform == "cpu":
        return not xla_cpu.enabled(platform)
    dtype, out_dtype = jnp.dtype(dtype), jnp.dtype(out_dtype)
    return (platform == "cuda" and _ffi.hopper()
            and dtype in HALF_DTYPES and out_dtype in (dtype, jnp.float32)
            and 1 <= groups <= _MAX_GROUPS and all(d % 8 == 0 for d in dims))  # fmt: skip


def _grouped_call(mode, lhs, rhs, group_sizes, out_shape, out_dtype):
    call = jax.ffi.ffi_call("jaxgemm_ragged_dot", jax.ShapeDtypeStruct(out_shape, out_dtype))
    return call(lhs, rhs, group_sizes, mode=np.int64(mode))


def local_sizes(group_sizes, rows, axes):
    """The group sizes of this device's `rows` rows where m is split over the mesh axes
    axes["m"] (device i holds rows [i rows, (i + 1) rows)): each group's rows clipped to them."""
    names = axes.get("m", ())
    if not names:
        return group_sizes
    first = lax.axis_index(names) * rows
    ends = jnp.cumsum(group_sizes)
    clip = lambda r: jnp.clip(r - first, 0, rows)  # noqa: E731
    return (clip(ends) - clip(ends - group_sizes)).astype(group_sizes.dtype)


def result_sizes(group_sizes, rows, axes):
    """The group sizes of a (m, n) result's `rows` rows on this device: m split over axes["m"],
    or reduce-scattered over a split k's axes (psum_over)."""
    return local_sizes(group_sizes, rows, {"m": axes.get("m", ()) + axes.get(SCATTER + "m", ())})


# ---------------------------------------------------------------------------------------
# ragged_dot_p


def _dot_abstract(lhs, rhs, group_sizes, *, out_dtype, precision, transpose_rhs=False, out_sharding=None):
    return [Result((lhs.shape[0], rhs.shape[1 if transpose_rhs else 2]), out_dtype)]


def _dot_rule(lhs, rhs, group_sizes, *, transpose_rhs=False, **params):
    rhs_dims = ("g", "n", "k") if transpose_rhs else ("g", "k", "n")
    return Rule((("m", "k"), rhs_dims, ("g",)), (("m", "n"),), REPLICATED_DIMS)


def dot_local(lhs, rhs, group_sizes, *, out_dtype, precision, platform, transpose_rhs=False, out_sharding=None,
               axes=None):  # fmt: skip
    axes = axes or {}
    group_sizes = local_sizes(group_sizes, lhs.shape[0], axes)
    out_shape = (lhs.shape[0], rhs.shape[1 if transpose_rhs else 2])
    if _grouped_kernel_runs(lhs.dtype, out_dtype, platform, rhs.shape[0], lhs.shape[1], out_shape[1]):
        mode = _ROWS_RHS_T if transpose_rhs else _ROWS
        out = _grouped_call(mode, lhs, rhs, group_sizes, out_shape, out_dtype)
    else:
        rhs = _swap_kn(rhs) if transpose_rhs else rhs
        typed = xla_out_sharding(lhs, rhs, [(0, 0), (1, 2)])
        out = lax.ragged_dot(lhs, rhs, group_sizes, precision=precision, preferred_element_type=out_dtype, **typed)
    return [psum_over(out, axes, ("k",), ("m", "n"))]


def _swap_kn(w):
    return jnp.swapaxes(w, -1, -2)


def _dot_transpose(cts, lhs, rhs, group_sizes, *, out_dtype, precision, transpose_rhs=False, out_sharding=None):
    (ct,) = cts
    if type(ct) is ad.Zero:
        return [None, None, None]
    if ad.is_undefined_primal(lhs):  # d lhs[rows of j] = ct[rows of j] @ W_j^T, W_j = op(rhs[j])
        dlhs = ragged_dot_op.bind(ct.astype(rhs.dtype), rhs, group_sizes, out_dtype=lhs.aval.dtype,
                                  precision=precision, transpose_rhs=not transpose_rhs,
                                  out_sharding=cotangent_sharding(lhs.aval, ct))[0]  # fmt: skip
        return [dlhs, None, None]
    # d W_j = lhs[rows of j]^T @ ct[rows of j]; stored transposed, ct[rows of j]^T @ lhs[...].
    x, dy = (ct.astype(lhs.dtype), lhs) if transpose_rhs else (lhs, ct.astype(lhs.dtype))
    drhs = ragged_wgrad_op.bind(x, dy, group_sizes, out_dtype=rhs.aval.dtype, groups=rhs.aval.shape[0],
                                precision=precision, out_sharding=cotangent_sharding(rhs.aval, ct))[0]  # fmt: skip
    return [None, drhs, None]


def _fold_batch(args, dims):
    """vmap as one wider ragged product: the operands with the vmapped axis first (an
    unbatched one broadcast), batch b's rows after batch b - 1's, and per batch one more
    group, after its own, that takes its rows past sum(group_sizes) (they must stay zero,
    or out of the weight gradient). Returns (x, y, group_sizes, batch)."""
    x, y, group_sizes = all_to_front(args, dims)
    b, m, _ = x.shape
    rest = m - group_sizes.sum(axis=1, keepdims=True)
    group_sizes = jnp.concatenate([group_sizes, rest.astype(group_sizes.dtype)], axis=1).reshape(-1)
    return x.reshape(b * m, -1), y, group_sizes, b


def _dot_batch(args, dims, out_sharding=None, **params):
    lhs, rhs, group_sizes, b = _fold_batch(args, dims)
    rhs = jnp.concatenate([rhs, jnp.zeros_like(rhs[:, :1])], axis=1)  # the extra groups' zero weights
    (out,) = ragged_dot_op.bind(lhs, rhs.reshape(-1, *rhs.shape[2:]), group_sizes, **params)
    return [out.reshape(b, -1, out.shape[-1])], [0]


ragged_dot_op = define(Op(
    "jaxgemm_ragged_dot", abstract=_dot_abstract, rule=_dot_rule, local=dot_local, batch=_dot_batch,
    jvp=BILINEAR, transpose=_dot_transpose, rule_on_cpu=True,
))  # fmt: skip


# ---------------------------------------------------------------------------------------
# ragged_wgrad_p


def _wgrad_abstract(lhs, dy, group_sizes, *, out_dtype, groups, precision, out_sharding=None):
    return [Result((groups, lhs.shape[1], dy.shape[1]), out_dtype)]


def _wgrad_rule(lhs, dy, group_sizes, **params):
    # The group sizes stay whole ("s"); the result's groups ("g", in no operand) may come
    # split where the partial sums over m are reduce-scattered (experts sharded as
    # parameters, FSDP-like: each device keeps its experts' share of the gradient).
    return Rule((("m", "k"), ("m", "n"), ("s",)), (("g", "k", "n"),), frozenset({"s"}))


_RAGGED_CONTRACTING = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[])


def _wgrad_local(lhs, dy, group_sizes, *, out_dtype, groups, precision, platform, out_sharding=None, axes=None):
    axes = axes or {}
    group_sizes = local_sizes(group_sizes, lhs.shape[0], axes)
    if _grouped_kernel_runs(lhs.dtype, out_dtype, platform, groups, lhs.shape[1], dy.shape[1]):
        out_shape = (groups, lhs.shape[1], dy.shape[1])
        dw = _grouped_call(_CONTRACTION, lhs, dy, group_sizes, out_shape, out_dtype)
    else:
        typed = xla_out_sharding(lhs, dy, [None, (0, 1), (1, 1)])
        dw = lax.ragged_dot_general(lhs, dy, group_sizes, _RAGGED_CONTRACTING, precision=precision,
                                    preferred_element_type=out_dtype, **typed)  # fmt: skip
    return [psum_over(dw, axes, ("m",), ("g", "k", "n"))]


def _wgrad_transpose(cts, lhs, dy, group_sizes, *, out_dtype, groups, precision, out_sharding=None):
    (ct,) = cts
    if type(ct) is ad.Zero:
        return [None, None, None]
    if ad.is_undefined_primal(lhs):  # d lhs[rows of j] = dy[rows of j] @ ct[j]^T
        return [ragged_dot_op.bind(dy, ct.astype(dy.dtype), group_sizes, out_dtype=lhs.aval.dtype,
                                   precision=precision, transpose_rhs=True,
                                   out_sharding=cotangent_sharding(lhs.aval, ct))[0], None, None]  # fmt: skip
    return [None, ragged_dot_op.bind(lhs, ct.astype(lhs.dtype), group_sizes, out_dtype=dy.aval.dtype,
                                     precision=precision, out_sharding=cotangent_sharding(dy.aval, ct))[0],
            None]  # fmt: skip


def _wgrad_batch(args, dims, *, out_dtype, groups, precision, out_sharding=None):
    lhs, dy, group_sizes, b = _fold_batch(args, dims)
    (dw,) = ragged_wgrad_op.bind(lhs, dy.reshape(lhs.shape[0], -1), group_sizes, out_dtype=out_dtype,
                                 groups=b * (groups + 1), precision=precision)  # fmt: skip
    return [dw.reshape(b, groups + 1, *dw.shape[1:])[:, :groups]], [0]  # (without the extra groups)


ragged_wgrad_op = define(Op(
    "jaxgemm_ragged_wgrad", abstract=_wgrad_abstract, rule=_wgrad_rule, local=_wgrad_local,
    batch=_wgrad_batch, jvp=BILINEAR, transpose=_wgrad_transpose, rule_on_cpu=True,
))  # fmt: skip


# ---------------------------------------------------------------------------------------
# ragged_epilogue_p: the product with its epilogue, per row of group j
#     z = lhs_row @ rhs[j] + bias[j],   y = act(z) + residual_row,   aux = z
# (rows of no group: y = residual, z = 0). The JVP is ragged_dot_p's tangents through
# epilogue.py's epilogue_tangent_p, so reverse mode and every higher order run on the
# bilinear primitives above; the forward is one grouped kernel on a Hopper GPU (16-bit
# output), else the product and the epilogue in JAX.

def _group_of_rows(group_sizes, m):
    """Each row's group; g for rows past sum(group_sizes) (negative sizes count as 0)."""
    return jnp.searchsorted(jnp.cumsum(jnp.maximum(group_sizes, 0)), jnp.arange(m), side="right")


def _bias_rows(bias, group_sizes, m):
    """bias[group of each row] in float32 (m, n); 0 on rows of no group."""
    g, group = bias.shape[0], _group_of_rows(group_sizes, m)
    rows = jnp.take(bias.astype(jnp.float32), jnp.minimum(group, g - 1), axis=0)
    return jnp.where((group < g)[:, None], rows, 0)


def biased(product, bias, group_sizes):
    """product (rounded to its dtype) + bias[group of each row], in float32; 0 on rows of no
    group (their product is 0 and they take no bias)."""
    z = product.astype(jnp.float32)
    return z if bias is None else z + _bias_rows(bias, group_sizes, z.shape[0])


def epilogue_in_jax(z, group_sizes, bias, activation, residual, want_aux):
    """[y] or [y, aux] from the product z (this device's rows), in float32, as the kernel:
    z rounded to its dtype, plus the bias, then y."""
    out_dtype = z.dtype
    in_group = (_group_of_rows(group_sizes, z.shape[0]) < group_sizes.shape[0])[:, None]
    z = biased(z, bias, group_sizes)
    y = jnp.where(in_group, activations.apply(activation, z), 0)
    if residual is not None:
        y = y + residual.astype(jnp.float32)
    return [y.astype(out_dtype)] + ([z.astype(out_dtype)] if want_aux else [])


def _epi_abstract(lhs, rhs, group_sizes, *rest, out_dtype, want_aux, **params):
    y = Result((lhs.shape[0], rhs.shape[2]), out_dtype)
    return [y, y] if want_aux else [y]


def _epi_rule(lhs, rhs, group_sizes, *rest, want_aux, has_bias, has_residual, **params):
    operands = [("m", "k"), ("g", "k", "n"), ("g",)]
    operands += [("g", "n")] * has_bias + [("m", "n")] * has_residual
    return Rule(tuple(operands), (("m", "n"),) * (2 if want_aux else 1), REPLICATED_DIMS)


def _epi_local(lhs, rhs, group_sizes, *rest, out_dtype, precision, activation, want_aux, has_bias, has_residual,
               platform, out_sharding=None, axes=None):  # fmt: skip
    axes = axes or {}
    bias, residual = present_operands(rest, (has_bias, has_residual))
    sizes = local_sizes(group_sizes, lhs.shape[0], axes)
    m, k, n, g = lhs.shape[0], lhs.shape[1], rhs.shape[2], rhs.shape[0]
    if not axes.get("k") and fused_kernel_runs(lhs.dtype, out_dtype, platform, g, k, n):
        aux_shape = (m, n) if want_aux else (0,)
        call = jax.ffi.ffi_call("jaxgemm_ragged_epilogue", (jax.ShapeDtypeStruct((m, n), out_dtype),
                                                            jax.ShapeDtypeStruct(aux_shape, out_dtype)))  # fmt: skip
        bias = jnp.zeros((0,), jnp.float32) if bias is None else bias.astype(jnp.float32)
        residual = jnp.zeros((0,), out_dtype) if residual is None else residual.astype(out_dtype)
        y, aux = call(lhs, rhs, sizes, bias, residual, activation=np.int64(activations.activation_id(activation)))
        return [y, aux] if want_aux else [y]
    # XLA's ragged dot, or k split: the epilogue acts once, on the summed product, whose
    # rows may come reduce-scattered (a sequence-parallel output).
    (z,) = dot_local(lhs, rhs, group_sizes, out_dtype=out_dtype, precision=precision, platform=platform, axes=axes)
    return epilogue_in_jax(z, result_sizes(group_sizes, z.shape[0], axes), bias, activation, residual, want_aux)


def fused_kernel_runs(dtype, out_dtype, platform, groups, k, n) -> bool:
    """The grouped GEMM's epilogue: k >= 1, and on a GPU 16-bit outputs of the inputs' type
    (float32 ones take the product from the kernel and the epilogue in JAX)."""
    same = jnp.dtype(out_dtype) == jnp.dtype(dtype) or platform == "cpu"
    return same and k > 0 and _grouped_kernel_runs(dtype, out_dtype, platform, groups, k, n)


def _epi_batch(args, dims, *, want_aux, **params):
    """vmap: the product and the epilogue as separate ops (the folded product's extra groups,
    _fold_batch, would take the epilogue where their rows must take none)."""

    def one(lhs, rhs, group_sizes, *rest):
        (z,) = ragged_dot_op.bind(lhs, rhs, group_sizes, out_dtype=params["out_dtype"], precision=params["precision"])
        bias, residual = present_operands(rest, (params["has_bias"], params["has_residual"]))
        return epilogue_in_jax(z, group_sizes, bias, params["activation"], residual, want_aux)

    outs = jax.vmap(one)(*all_to_front(args, dims))
    return outs, [0] * len(outs)


def affine_tangent(lhs, dlhs, w, dw, dbias, group_sizes, out_dtype, precision):
    """The tangent of lhs @ w[group] + bias[group] (bilinear, then linear in the bias): the
    sum of the parts whose tangents are given, or None where none is."""
    product = dict(out_dtype=out_dtype, precision=precision)
    parts = []
    if dlhs is not None:
        parts.append(ragged_dot_op.bind(dlhs, w, group_sizes, **product)[0])
    if dw is not None:
        parts.append(ragged_dot_op.bind(lhs, dw, group_sizes, **product)[0])
    if dbias is not None:
        parts.append(_bias_rows(dbias, group_sizes, lhs.shape[0]).astype(out_dtype))
    return functools.reduce(jnp.add, parts) if parts else None


def _epi_jvp(primals, tangents, *, out_dtype, precision, activation, want_aux, has_bias, has_residual,
             out_sharding=None):  # fmt: skip
    lhs, rhs, group_sizes, *rest = primals
    dlhs, drhs, _, *drest = (None if type(t) is ad.Zero else t for t in tangents)
    bias, residual = present_operands(rest, (has_bias, has_residual))
    dbias, dres = present_operands(drest, (has_bias, has_residual))
    from_output = activations.derivative_from_output(activation) and residual is None
    keep_z = want_aux or (activation is not None and not from_output)
    outs = ragged_epilogue_op.bind(*primals, out_dtype=out_dtype, precision=precision, activation=activation,
                                   want_aux=keep_z, has_bias=has_bias, has_residual=has_residual,
                                   out_sharding=out_sharding)  # fmt: skip
    y, z = outs[0], (outs[1] if keep_z else None)
    t = affine_tangent(lhs, dlhs, rhs, drhs, dbias, group_sizes, out_dtype, precision)
    if t is None and dres is None:
        zero = ad.Zero.from_primal_value(y)
        return [y, z] if want_aux else [y], [zero] * (2 if want_aux else 1)
    t = jnp.zeros_like(y) if t is None else t
    ydot = t if activation is None else epilogue_tangent(t, None, y if from_output else z, activation)
    if dres is not None:
        ydot = ydot + dres.astype(y.dtype)
    return ([y, z], [ydot, t]) if want_aux else ([y], [ydot])


ragged_epilogue_op = define(Op(
    "jaxgemm_ragged_epilogue", abstract=_epi_abstract, rule=_epi_rule, local=_epi_local, batch=_epi_batch,
    jvp=_epi_jvp, rule_on_cpu=True,
))  # fmt: skip


# ---------------------------------------------------------------------------------------
# The public function.


def _check(lhs, rhs, group_sizes, bias, residual):
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
            raise TypeError(f"jaxgemm.ragged_dot: {name} dtype {x.dtype} is not supported; use one of "
                            + ", ".join(str(d) for d in SUPPORTED_DTYPES))  # fmt: skip
    if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.ndim != 1:
        raise ValueError(f"jaxgemm.ragged_dot: needs lhs (m, k), rhs (g, k, n) and group_sizes (g,); got shapes "
                         f"{lhs.shape}, {rhs.shape}, {group_sizes.shape}")  # fmt: skip
    if lhs.shape[1] != rhs.shape[1] or rhs.shape[0] != group_sizes.shape[0]:
        raise ValueError(f"jaxgemm.ragged_dot: lhs {lhs.shape}, rhs {rhs.shape} and group_sizes "
                         f"{group_sizes.shape} disagree on k or g")  # fmt: skip
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"jaxgemm.ragged_dot: group_sizes must be integers, got {group_sizes.dtype}")
    if bias is not None and bias.shape != (rhs.shape[0], rhs.shape[2]):
        raise ValueError(f"jaxgemm.ragged_dot: bias of shape {bias.shape} is not (g, n) = "
                         f"{(rhs.shape[0], rhs.shape[2])}")  # fmt: skip
    if residual is not None and residual.shape != (lhs.shape[0], rhs.shape[2]):
        raise ValueError(f"jaxgemm.ragged_dot: residual of shape {residual.shape} is not (m, n) = "
                         f"{(lhs.shape[0], rhs.shape[2])}")  # fmt: skip


def group_sizes_for(group_sizes, m, op):
    """`group_sizes` as int32 in the form every route computes with (the grouped kernel, its
    CPU reference, XLA's ragged dot, the per-group bias and the sharding's local sizes).

    Concrete sizes must be >= 0 and sum to at most m (a ValueError names them). Traced ones
    are made so: group j's rows end at the running maximum of the cumulative sizes clipped to
    [0, m]. That is lax.ragged_dot's grouping wherever lax's groups do not overlap (all sizes
    >= 0, whatever their sum; rows past m are cut off); where a negative size makes two
    groups claim a row (lax adds both products), the row stays with the first.
    """
    try:
        sizes = np.asarray(group_sizes)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        ends = lax.cummax(jnp.clip(jnp.cumsum(group_sizes.astype(np.int32)), 0, m))
        return jnp.diff(ends, prepend=jnp.zeros((1,), np.int32))
    if (sizes < 0).any() or sizes.sum() > m:
        raise ValueError(f"{op}: group_sizes {sizes.tolist()} must be >= 0 and sum to at most m = {m} "
                         f"(sum {sizes.sum()})")  # fmt: skip
    return group_sizes.astype(np.int32)


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None, *,
               out_sharding=None, bias=None, activation=None, residual=None):  # fmt: skip
    """`jax.lax.ragged_dot` with an optional fused per-group bias, activation and residual.

    Rows of `lhs` come in consecutive groups of `group_sizes[j]` rows; group j's rows are
    multiplied by `rhs[j]` (a mixture-of-experts layer: tokens sorted by expert). Rows past
    sum(group_sizes) belong to no group and come out zero.

    Args:
      lhs: (m, k) float32, float16 or bfloat16.
      rhs: (g, k, n), one matrix per group.
      group_sizes: (g,) integers (int32 as lax takes them), >= 0, summing to at most m:
        checked when they are concrete; traced ones (under jit) are clipped the same way
        on every backend: rows past m are cut off as lax cuts them, and where a negative
        size would put a row in two groups (lax.ragged_dot adds both products) the row
        stays with the first (`group_sizes_for`).
      precision: as for `jaxgemm.matmul`: None (exact float32 for float32 inputs) or a
        `jax.lax.Precision`.
      preferred_element_type: the result dtype; default the inputs' promoted dtype.
      group_offset: not supported: lax.ragged_dot raises NotImplementedError for it, and
        so does this.
      out_sharding: the result's sharding (a NamedSharding, or a PartitionSpec on the
        current mesh), as for `jax.lax.ragged_dot` (Explicit mode: needed where k is split
        in both operands).
      bias: (g, n), added to each row of group j before the activation.
      activation: None, a name in `jaxgemm.ACTIVATIONS` or its jax.nn function.
      residual: (m, n), added after the activation (to every row: rows of no group come
        out as the residual).

    Returns:
      (m, n): activation(lhs_rows(j) @ rhs[j] + bias[j]) + residual for the rows of each
      group j.

    Differentiable in lhs, rhs and bias (forward and reverse mode, any order: unlike
    lax.ragged_dot, grad of grad works), vmap-able, jit-able, partitioned by sharded jit
    in Auto and Explicit modes: rows (each device takes its share of every group), k and n
    split; experts split in rhs are gathered, and their gradient reduce-scattered back
    (rows split over the same axis). On a Hopper GPU, 16-bit products (k and n multiples
    of 8, at most 1024 groups) run on jaxgemm's grouped kernel, forward and backward;
    others on XLA's own ragged dot. There the bias, activation and residual are fused into
    the kernel for 16-bit outputs (float32 outputs, vmap and a split k apply them in JAX,
    after the product).
    """
    if group_offset is not None:
        raise NotImplementedError("jaxgemm.ragged_dot: group_offset is not supported (lax.ragged_dot does not "
                                  "implement it either)")  # fmt: skip
    out_sharding = canonical_out_sharding(out_sharding, "jaxgemm.ragged_dot")
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    bias = None if bias is None else jnp.asarray(bias)
    residual = None if residual is None else jnp.asarray(residual)
    _check(lhs, rhs, group_sizes, bias, residual)
    activation = activations.canonical(activation)
    activations.activation_id(activation)
    dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
    out_dtype = jnp.dtype(preferred_element_type) if preferred_element_type is not None else dtype
    lhs, rhs = lhs.astype(dtype), rhs.astype(dtype)
    group_sizes = group_sizes_for(group_sizes, lhs.shape[0], "jaxgemm.ragged_dot")
    params = dict(out_dtype=out_dtype, precision=product_precision(dtype, precision), out_sharding=out_sharding)
    if bias is None and activation is None and residual is None:
        (out,) = ragged_dot_op.bind(lhs, rhs, group_sizes, **params)
    else:
        extra = [x for x in (bias, residual) if x is not None]
        flags = dict(has_bias=bias is not None, has_residual=residual is not None)
        (out,) = ragged_epilogue_op.bind(lhs, rhs, group_sizes, *extra, activation=activation, want_aux=False,
                                         **flags, **params)  # fmt: skip
    return constrain_output(out, out_sharding)


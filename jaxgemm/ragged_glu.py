"""jaxgemm.ragged_glu: a mixture-of-experts layer's gated linear unit, both of its products in
one grouped GEMM. Per row of group j (rows sorted by group, as for ragged_dot):

    out = act(lhs_row @ w_gate[j] + bias_gate[j]) * (lhs_row @ w_up[j] + bias_up[j])

(SwiGLU experts with activation="silu", GEGLU with "gelu"); rows past sum(group_sizes)
come out zero.

One primitive in primitive.py's pattern, ragged_glu_p, whose results are out and, for its
JVP, the two pre-activations z_gate and z_up. The JVP is ragged_dot_p's tangents of both
products, combined elementwise (act'(z_gate) z_up dz_gate + act(z_gate) dz_up), so reverse
mode and every higher order run on ragged.py's bilinear primitives. On a Hopper GPU with
16-bit outputs the forward is one grouped kernel (GroupedMode::kRowsGated: an item's tile
holds 128 columns of each weight, so each thread combines its own gate and up values); on
a CPU with JAXGEMM_CPU=ffi the same call's reference handler; elsewhere two ragged products
and the combination in JAX. Sharding: ragged_dot's rule, both weights alike.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad

from jaxgemm import activations
from jaxgemm.epilogue import present_operands
from jaxgemm.kernels import SUPPORTED_DTYPES
from jaxgemm.primitive import Op, Result, Rule, all_to_front, canonical_out_sharding, constrain_output, define
from jaxgemm.ragged import (REPLICATED_DIMS, affine_tangent, biased, dot_local, fused_kernel_runs, group_sizes_for,
                            local_sizes, product_precision, ragged_dot_op, result_sizes)  # fmt: skip


def _glu_in_jax(p_gate, p_up, group_sizes, bias_gate, bias_up, activation, want_aux):
    """[out] or [out, z_gate, z_up] from the two products (this device's rows), as the kernel."""
    out_dtype = p_gate.dtype
    z_gate, z_up = biased(p_gate, bias_gate, group_sizes), biased(p_up, bias_up, group_sizes)
    out = (activations.apply(activation, z_gate) * z_up).astype(out_dtype)
    return [out] + ([z_gate.astype(out_dtype), z_up.astype(out_dtype)] if want_aux else [])


def _abstract(lhs, w_gate, w_up, group_sizes, *rest, out_dtype, want_aux, **params):
    out = Result((lhs.shape[0], w_gate.shape[2]), out_dtype)
    return [out] * (3 if want_aux else 1)


def _rule(lhs, w_gate, w_up, group_sizes, *rest, want_aux, has_bias_gate, has_bias_up, **params):
    operands = [("m", "k"), ("g", "k", "n"), ("g", "k", "n"), ("g",)] + [("g", "n")] * (has_bias_gate + has_bias_up)
    return Rule(tuple(operands), (("m", "n"),) * (3 if want_aux else 1), REPLICATED_DIMS)


def _local(lhs, w_gate, w_up, group_sizes, *rest, out_dtype, precision, activation, want_aux, has_bias_gate,
           has_bias_up, platform, out_sharding=None, axes=None):  # fmt: skip
    axes = axes or {}
    bias_gate, bias_up = present_operands(rest, (has_bias_gate, has_bias_up))
    m, k, n, g = lhs.shape[0], lhs.shape[1], w_gate.shape[2], w_gate.shape[0]
    if not axes.get("k") and fused_kernel_runs(lhs.dtype, out_dtype, platform, g, k, n):
        aux = jax.ShapeDtypeStruct((m, n) if want_aux else (0,), out_dtype)
        call = jax.ffi.ffi_call("jaxgemm_ragged_glu", (jax.ShapeDtypeStruct((m, n), out_dtype), aux, aux))
        f32 = lambda b: jnp.zeros((0,), jnp.float32) if b is None else b.astype(jnp.float32)  # noqa: E731
        sizes = local_sizes(group_sizes, m, axes)
        outs = call(lhs, w_gate, w_up, sizes, f32(bias_gate), f32(bias_up),
                    activation=np.int64(activations.activation_id(activation)))  # fmt: skip
        return list(outs) if want_aux else [outs[0]]
    # XLA's ragged dot, or k split: the combination acts once, on the summed products, whose
    # rows may come reduce-scattered.
    product = dict(out_dtype=out_dtype, precision=precision, platform=platform, axes=axes)
    (p_gate,) = dot_local(lhs, w_gate, group_sizes, **product)
    (p_up,) = dot_local(lhs, w_up, group_sizes, **product)
    sizes = result_sizes(group_sizes, p_gate.shape[0], axes)
    return _glu_in_jax(p_gate, p_up, sizes, bias_gate, bias_up, activation, want_aux)


def _batch(args, dims, *, want_aux, **params):
    """vmap: the two products and the combination as separate ops (as ragged_dot's epilogue)."""

    def one(lhs, w_gate, w_up, group_sizes, *rest):
        product = dict(out_dtype=params["out_dtype"], precision=params["precision"])
        (p_gate,) = ragged_dot_op.bind(lhs, w_gate, group_sizes, **product)
        (p_up,) = ragged_dot_op.bind(lhs, w_up, group_sizes, **product)
        bias_gate, bias_up = present_operands(rest, (params["has_bias_gate"], params["has_bias_up"]))
        return _glu_in_jax(p_gate, p_up, group_sizes, bias_gate, bias_up, params["activation"], want_aux)

    outs = jax.vmap(one)(*all_to_front(args, dims))
    return outs, [0] * len(outs)


def _jvp(primals, tangents, *, out_dtype, precision, activation, want_aux, has_bias_gate, has_bias_up,
         out_sharding=None):  # fmt: skip
    lhs, w_gate, w_up, group_sizes, *rest = primals
    dlhs, dw_gate, dw_up, _, *drest = (None if type(t) is ad.Zero else t for t in tangents)
    dbias_gate, dbias_up = present_operands(drest, (has_bias_gate, has_bias_up))
    out, z_gate, z_up = ragged_glu_op.bind(*primals, out_dtype=out_dtype, precision=precision, activation=activation,
                                           want_aux=True, has_bias_gate=has_bias_gate, has_bias_up=has_bias_up,
                                           out_sharding=out_sharding)  # fmt: skip
    tangent = functools.partial(affine_tangent, lhs, dlhs, group_sizes=group_sizes, out_dtype=out_dtype,
                                precision=precision)  # fmt: skip
    t_gate, t_up = tangent(w_gate, dw_gate, dbias_gate), tangent(w_up, dw_up, dbias_up)
    primal_out = [out, z_gate, z_up] if want_aux else [out]
    if t_gate is None and t_up is None:
        return primal_out, [ad.Zero.from_primal_value(x) for x in primal_out]
    zg, zu = z_gate.astype(jnp.float32), z_up.astype(jnp.float32)
    dout = jnp.zeros_like(zg)
    if t_gate is not None:
        dout = dout + activations.derivative(activation, zg) * zu * t_gate.astype(jnp.float32)
    if t_up is not None:
        dout = dout + activations.apply(activation, zg) * t_up.astype(jnp.float32)
    if not want_aux:
        return primal_out, [dout.astype(out.dtype)]
    zero = jnp.zeros_like(out)
    return primal_out, [dout.astype(out.dtype), zero if t_gate is None else t_gate, zero if t_up is None else t_up]


ragged_glu_op = define(Op(
    "jaxgemm_ragged_glu", abstract=_abstract, rule=_rule, local=_local, batch=_batch, jvp=_jvp, rule_on_cpu=True,
))  # fmt: skip


def _check(lhs, w_gate, w_up, group_sizes, bias_gate, bias_up):
    for name, x in (("lhs", lhs), ("w_gate", w_gate), ("w_up", w_up)):
        if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
            raise TypeError(f"jaxgemm.ragged_glu: {name} dtype {x.dtype} is not supported; use one of "
                            + ", ".join(str(d) for d in SUPPORTED_DTYPES))  # fmt: skip
    if lhs.ndim != 2 or w_gate.ndim != 3 or w_up.shape != w_gate.shape or group_sizes.shape != w_gate.shape[:1]:
        raise ValueError(f"jaxgemm.ragged_glu: needs lhs (m, k), w_gate and w_up (g, k, n) and group_sizes (g,); "
                         f"got {lhs.shape}, {w_gate.shape}, {w_up.shape}, {group_sizes.shape}")  # fmt: skip
    if lhs.shape[1] != w_gate.shape[1]:
        raise ValueError(f"jaxgemm.ragged_glu: lhs {lhs.shape} and w_gate {w_gate.shape} disagree on k")
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"jaxgemm.ragged_glu: group_sizes must be integers, got {group_sizes.dtype}")
    for name, bias in (("bias_gate", bias_gate), ("bias_up", bias_up)):
        if bias is not None and bias.shape != (w_gate.shape[0], w_gate.shape[2]):
            raise ValueError(f"jaxgemm.ragged_glu: {name} of shape {bias.shape} is not (g, n) = "
                             f"{(w_gate.shape[0], w_gate.shape[2])}")  # fmt: skip


def ragged_glu(lhs, w_gate, w_up, group_sizes, activation="silu", *, bias_gate=None, bias_up=None, precision=None,
               preferred_element_type=None, out_sharding=None):  # fmt: skip
    """A gated linear unit per group of rows: for the rows of group j,
    `act(lhs @ w_gate[j] + bias_gate[j]) * (lhs @ w_up[j] + bias_up[j])`.

    The expert MLP's first half in a mixture-of-experts layer (SwiGLU: "silu"), both
    products in one grouped kernel on a Hopper GPU, where `act(ragged_dot(lhs, w_gate, ...))
    * ragged_dot(lhs, w_up, ...)` writes and reads back two (m, n) products.

    Args:
      lhs: (m, k), rows sorted by group; float32, float16 or bfloat16.
      w_gate, w_up: (g, k, n), the gate's and the up projection's weights per group.
      group_sizes: (g,) integers, >= 0, summing to at most m (checked, or clipped under
        jit, as for `ragged_dot`); rows past the sum come out zero.
      activation: the gate's: a name in `jaxgemm.ACTIVATIONS` or its jax.nn function, or
        None (a bilinear unit).
      bias_gate, bias_up: optional (g, n) biases.
      precision, preferred_element_type, out_sharding: as for `ragged_dot`.

    Returns:
      (m, n). Differentiable in lhs, both weights and both biases (any order), vmap-able,
      partitioned by sharded jit as `ragged_dot`.
    """
    out_sharding = canonical_out_sharding(out_sharding, "jaxgemm.ragged_glu")
    lhs, w_gate, w_up, group_sizes = (jnp.asarray(x) for x in (lhs, w_gate, w_up, group_sizes))
    bias_gate, bias_up = (None if b is None else jnp.asarray(b) for b in (bias_gate, bias_up))
    _check(lhs, w_gate, w_up, group_sizes, bias_gate, bias_up)
    activation = activations.canonical(activation)
    activations.activation_id(activation)
    dtype = jnp.promote_types(jnp.promote_types(lhs.dtype, w_gate.dtype), w_up.dtype)
    out_dtype = jnp.dtype(preferred_element_type) if preferred_element_type is not None else dtype
    extra = [b for b in (bias_gate, bias_up) if b is not None]
    group_sizes = group_sizes_for(group_sizes, lhs.shape[0], "jaxgemm.ragged_glu")
    (out,) = ragged_glu_op.bind(lhs.astype(dtype), w_gate.astype(dtype), w_up.astype(dtype), group_sizes, *extra,
                                out_dtype=out_dtype, precision=product_precision(dtype, precision),
                                activation=activation, want_aux=False, has_bias_gate=bias_gate is not None,
                                has_bias_up=bias_up is not None, out_sharding=out_sharding)  # fmt: skip
    return constrain_output(out, out_sharding)

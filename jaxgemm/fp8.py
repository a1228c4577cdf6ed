"""fp8 training's dense layer: every product of the forward and backward pass in float8
e4m3 on `scaled_matmul`, each operand scaled along its contraction in one of three ways:

- scaling="rowwise" (torchao's float8 rowwise recipe): one scale per row.
    y = act(x @ w + bias):  x (M, K) scaled per row, w^T (N, K) per output feature;
    dx = dz @ w^T:          dz (M, N) per row, w (K, N) per input feature;
    dw = x^T @ dz:          x^T (K, M) and dz^T (N, M) per feature, over the batch.
- scaling="blockwise" (DeepSeek-V3's recipe, TransformerEngine's Float8BlockScaling): x, dz
  and their transposes in 1 x 128 blocks along the contraction, w in 128 x 128 tiles (one
  quantized tile set serves w^T and w). On a Hopper GPU these run on the block-scaled
  kernel. A product whose contraction is not a multiple of 128 scales that product's
  operands rowwise instead.
- scaling="delayed" (TransformerEngine's DelayedScaling): one scale per tensor (x, w, dz),
  from the largest |value| the tensor had over its last H steps (an AmaxHistory the
  caller keeps: its gradient is the updated history). Each tensor is quantized into both
  orientations by a single pass that also records this step's amax (and dz's column
  sums); the products take the scale as per-row scales of one value. A tensor that
  outgrows its history saturates at +-448 x scale until the history catches up.
dbias = sum(dz), dz = dy * act'(z), all in float32 (z saved by the forward in the output's
dtype; y instead for relu, nothing without an activation). grad_format="e5m2" quantizes dz
to e5m2 instead (TransformerEngine's HYBRID recipe: 2^-16 x scale reaches 2^7 further
down than e4m3's 2^-9), in the same passes, and its two products multiply e5m2 by e4m3
on the same kernels.

Each operand is quantized from the high-precision tensor for the product it enters (the
two copies of x and of dz differ in orientation and scales). Rowwise, x, w and dz are
each quantized into both orientations by two passes over them (quantize.py: the amax,
then both e4m3 copies; dz's passes read dy and z and sum dbias, dz itself is never
written); the backward keeps x^T and w quantized from the forward. Blockwise, where M,
K and N are whole 128-blocks, each is quantized both ways in one pass (every block lies
in one 128 x 128 tile; w in tiles), the same kept for the backward. Either way the
forward product is one kernel with its scales, the bias, the activation and z in its
epilogue (scaled_dense.py). Every product writes its result's dtype. The gradient
is the straight-through one: quantization counts as the identity. On a Hopper GPU the products
run on jaxgemm's fp8 kernel; elsewhere `scaled_matmul` dequantizes (same values, float32
sums). Under sharded jit rowwise scales are the whole batch's (XLA all-reduces the amax
of rows a sharding splits); a blockwise block's amax stays on its device where each
shard holds whole blocks and tiles (batch and features per shard multiples of 128: then
the layer has jnp's collectives), while shards that cut w's tiles make XLA gather w to
quantize it; delayed scales are the history's, the same on every device, and the amax
recorded is the whole tensor's (one all-reduce of a scalar). Inside shard_map each
device's scales cover its own rows (delayed: the history's; the amax recorded is the
max over the devices). Not forward-mode differentiable (a custom VJP).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxgemm import activations
from jaxgemm._compat import explicit_sharding, match_varying, max_over_varying
from jaxgemm.primitive import canonical_out_sharding, constrain_output
from jaxgemm.scaled import BLOCK_SCALE_GRANULE, scaled_matmul_tiled
from jaxgemm.quantize import (  # noqa: F401 (E4M3, E4M3_MAX and E5M2: this module's API too)
    E4M3,
    E4M3_MAX,
    E5M2,
    quantize_blocks_both,
    quantize_both,
    quantize_tensor,
    scales_of,
    to_fp8,
)
from jaxgemm.scaled_dense import scaled_dense

BLOCK = BLOCK_SCALE_GRANULE  # blockwise scaling's block (128): the block-scaled kernel's k-tile
SCALINGS = ("rowwise", "blockwise", "delayed")
GRAD_FORMATS = {"e4m3": E4M3, "e5m2": E5M2}  # dz's format (e5m2: TransformerEngine's HYBRID)


def quantize_rows(x, dtype=E4M3):
    """x (..., R, K) as e4m3 values (or `dtype` float8_e5m2) and float32 scales (..., R, 1),
    one per row: each row divided by amax / 448 (e5m2: 57344), so its largest magnitude maps
    onto the format's largest value (an all-zero row gets scale 1).
    `scaled_matmul(q, ..., scales, ...)` multiplies them back."""
    x = jnp.asarray(x, jnp.float32)
    scales = scales_of(jnp.max(jnp.abs(x), axis=-1, keepdims=True), dtype)
    q = to_fp8(x, scales, dtype)
    return q, scales


def _check_blocks(name, x, block, rank=None):
    """A ValueError naming x's shape unless its last dim is whole blocks of `block` values."""
    if rank is not None and x.ndim != rank:
        raise ValueError(f"jaxgemm.fp8.{name}: needs a {rank}-D array, got shape {x.shape}")
    if x.ndim < 2 or not isinstance(block, int) or block < 1 or x.shape[-1] % block:
        raise ValueError(f"jaxgemm.fp8.{name}: needs x (..., R, K) with K a multiple of block={block!r}, "
                         f"got shape {x.shape}")  # fmt: skip


def quantize_blocks(x, block=BLOCK, dtype=E4M3):
    """x (..., R, K), K a multiple of `block`: e4m3 (or `dtype`) values and float32 scales
    (..., R, K // block), one per row and block of `block` values (1 x 128 blocks)."""
    x = jnp.asarray(x, jnp.float32)
    _check_blocks("quantize_blocks", x, block)
    blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // block, block))
    scales = scales_of(jnp.max(jnp.abs(blocks), axis=-1, keepdims=True), dtype)
    q = to_fp8(blocks, scales, dtype)
    return q.reshape(x.shape), scales[..., 0]


def quantize_tiles(w, block=BLOCK):
    """w (R, K), K a multiple of `block`: e4m3 values and one float32 scale per tile of
    block x block (the last row tile may be shorter), as `scaled_matmul` takes them:
    (R, K // block), each tile's scale repeated over its rows (`scales[::block]` is the
    tiled form, one row per tile, which `scaled_matmul` also takes for block = 128)."""
    w = jnp.asarray(w, jnp.float32)
    _check_blocks("quantize_tiles", w, block, rank=2)
    r, k = w.shape
    padded = jnp.pad(w, ((0, -r % block), (0, 0)))
    tiles = padded.reshape(padded.shape[0] // block, block, k // block, block)
    scales = scales_of(jnp.max(jnp.abs(tiles), axis=(1, 3), keepdims=True))
    q = to_fp8(tiles, scales).reshape(padded.shape)[:r]
    return q, jnp.repeat(scales[:, 0, :, 0], block, axis=0)[:r]


def _quantized(a, scaling, tiles=False, dtype=E4M3):
    """a (R, K) quantized (into dtype; weights' tiles e4m3) for a product contracting K."""
    if scaling == "rowwise":
        return quantize_rows(a, dtype)
    return quantize_tiles(a) if tiles else quantize_blocks(a, dtype=dtype)


def _typed_like(like, transposed=False):
    """The out_sharding that types a product like `like` (or like its transpose) in Explicit
    mode (a gradient like its primal, as JAX's transposes type it: a product that contracts
    the split batch needs it), with scaled_matmul's leading batch dim; None elsewhere."""
    sharding = None if like is None else explicit_sharding(jax.typeof(like))
    if sharding is None:
        return None
    spec = tuple(sharding.spec) + (None,) * (like.ndim - len(sharding.spec))
    return P(None, *(spec[::-1] if transposed else spec))


def _scaled(qa, qb, sa, sb, out_dtype, like=None, transposed=False, tiles=False):
    """qa (M, K) @ qb (N, K)^T with their scales, on scaled_matmul (`tiles`: qb's scales
    repeat over 128-row tiles, quantize_tiles's)."""
    return scaled_matmul_tiled(qa[None], qb[None], sa[None], sb[None], preferred_element_type=out_dtype,
                               out_sharding=_typed_like(like, transposed), rhs_tiles=tiles)[0]  # fmt: skip


def _product(a, b, out_dtype, scaling, like=None, b_is_weight=False, a_dtype=E4M3, b_dtype=E4M3):
    """a (M, K) @ b (N, K)^T on copies of both quantized into a_dtype and b_dtype, into
    out_dtype; the weights in tiles when blockwise."""
    if a.shape[-1] % BLOCK:
        scaling = "rowwise"  # (both operands: scaled_matmul's blocks must agree)
    tiles = b_is_weight and scaling == "blockwise"
    (qa, sa), (qb, sb) = _quantized(a, scaling, dtype=a_dtype), _quantized(b, scaling, tiles, b_dtype)
    return _scaled(qa, qb, sa, sb, out_dtype, like, tiles=tiles)


def _fused_forward(qx, qwt, sx, swt, bias, activation, out_dtype, tiles=False):
    """(y, at) of the scaled product (one scale per row, or blocks; `tiles`: w's in 128 x
    128 tiles) with the bias and the activation in its kernel's epilogue (scaled_dense.py);
    `at`: what act'(z) reads in the backward, in the output's dtype (as jaxgemm.dense keeps
    its aux): nothing without an activation, y for relu, else z rounded once."""
    want_z = activation is not None and not activations.derivative_from_output(activation)
    outs = scaled_dense(qx[None], qwt[None], sx[None], swt[None], None if bias is None else bias[None],
                        activation=activation, want_aux=want_z, out_dtype=out_dtype, rhs_tiles=tiles)  # fmt: skip
    y = outs[0][0]
    return y, outs[1][0] if want_z else (y if activation is not None else None)


def _whole_blocks(x, w) -> bool:
    """Whether every dim of the layer (M, K, N) is whole 128-blocks: then x, w and dz are
    each quantized both ways in one pass (quantize.quantize_blocks_both)."""
    return not (x.shape[0] % BLOCK or x.shape[1] % BLOCK or w.shape[1] % BLOCK)


def _blockwise_forward(x, w, bias, activation, out_dtype):
    if x.shape[-1] % BLOCK:  # a contraction of no whole blocks: rowwise
        (qx, sx), (qwt, swt) = quantize_rows(x), quantize_rows(w.T)
        return _fused_forward(qx, qwt, sx, swt, bias, activation, out_dtype)
    (qx, sx), (qwt, swt) = quantize_blocks(x), quantize_tiles(w.T)
    return _fused_forward(qx, qwt, sx, swt, bias, activation, out_dtype, tiles=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _dense(x, w, bias, activation, out_dtype, scaling, x_dtype, grad_format):
    return _dense_fwd(x, w, bias, activation, out_dtype, scaling, x_dtype, grad_format)[0]


def _dense_fwd(x, w, bias, activation, out_dtype, scaling, x_dtype, grad_format):
    if scaling == "rowwise":
        # x and w each quantized both ways in two passes (quantize.py): x and w^T for this
        # product, x^T and w kept for the backward's (x itself is not kept: dx is typed
        # like x^T transposed, and x_dtype is static).
        xq, xs, xqt, xst = quantize_both(x)
        wq, ws, wqt, wst = quantize_both(w)
        y, at = _fused_forward(xq, wqt, xs, wst, bias, activation, out_dtype)
        saved = (xqt, xst, wq, ws, w)
    elif _whole_blocks(x, w):
        # One pass each (quantize.py): x in 1 x 128 blocks both ways, w in 128 x 128 tiles.
        xq, xs, xqt, xst = quantize_blocks_both(x)
        wq, ws, wqt, wst = quantize_blocks_both(w, tiles=True)
        y, at = _fused_forward(xq, wqt, xs, wst, bias, activation, out_dtype, tiles=True)
        saved = (xqt, xst, wq, ws, w)
    else:
        y, at = _blockwise_forward(x, w, bias, activation, out_dtype)
        saved = (x, w)
    return y, (saved, bias, at)


def _dense_bwd(activation, out_dtype, scaling, x_dtype, grad_format, residuals, dy):
    saved, bias, at = residuals
    dz_dtype = GRAD_FORMATS[grad_format]
    if len(saved) == 5:  # rowwise, or blockwise in whole blocks: x^T and w quantized by the forward
        # dz = dy * act'(z) quantized both ways, and its column sums (dbias): two passes
        # rowwise, one blockwise.
        xqt, xst, wq, ws, w = saved
        quantize = quantize_both if scaling == "rowwise" else quantize_blocks_both
        dzq, dzs, dzqt, dzst, *dbias = quantize(dy, at, activation, want_sum=bias is not None, dtype=dz_dtype)
        dx = _scaled(dzq, wq, dzs, ws, x_dtype, like=xqt, transposed=True, tiles=scaling == "blockwise")
        dw = _scaled(xqt, dzqt, xst, dzst, w.dtype, like=w)
        return dx, dw, None if bias is None else dbias[0].astype(bias.dtype)
    x, w = saved
    dz = dy.astype(jnp.float32)
    if activation is not None:
        dz = dz * activations.derivative(activation, at)
    # (Each product written in its gradient's dtype by the kernel: no float32 copy between.)
    dx = _product(dz, w, x.dtype, scaling, like=x, b_is_weight=True, a_dtype=dz_dtype)
    dw = _product(x.T, dz.T, w.dtype, scaling, like=w, b_dtype=dz_dtype)
    dbias = None if bias is None else jnp.sum(dz, axis=0).astype(bias.dtype)
    return dx, dw, dbias


_dense.defvjp(_dense_fwd, _dense_bwd)


# ---------------------------------------------------------------------------------------
# Delayed scaling (TransformerEngine's DelayedScaling): one scale per tensor, from the
# largest |value| of the tensor's last H steps, so each quantization is a single pass
# (quantize.quantize_tensor) that also records this step's amax.


class AmaxHistory(NamedTuple):
    """A layer's amax histories for scaling="delayed": float32 (H,) each, newest first,
    for its input x, its weights w and its output gradient dz. Zeros: never seen (scale 1,
    as TransformerEngine starts). Under `grad` its cotangent is the updated history (this
    step's amax pushed in front): write it back instead of an optimizer update, as Flax's
    fp8 ops do with their _overwrite_with_gradient collection."""

    x: jax.Array
    w: jax.Array
    dz: jax.Array


def amax_history(length=16):
    """A new AmaxHistory of `length` steps (all zeros)."""
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"jaxgemm.fp8.amax_history: length must be a positive int, got {length!r}")
    return AmaxHistory(*(jnp.zeros((length,), jnp.float32) for _ in range(3)))


def _pushed(history, amax):
    """The history with this step's amax in front and its oldest entry dropped."""
    return jnp.concatenate([max_over_varying(amax).reshape(1), history[:-1]])


def _per_row(scale, rows):
    """One tensor's scale as scaled_matmul's per-row scales (rows, 1)."""
    return jnp.broadcast_to(scale, (rows, 1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _delayed_dense(x, w, bias, history, activation, out_dtype, x_dtype, grad_format):
    return _delayed_fwd(x, w, bias, history, activation, out_dtype, x_dtype, grad_format)[0]


def _delayed_fwd(x, w, bias, history, activation, out_dtype, x_dtype, grad_format):
    sx, sw = scales_of(jnp.max(history.x)), scales_of(jnp.max(history.w))
    xq, xqt, x_amax = quantize_tensor(x, sx)
    wq, wqt, w_amax = quantize_tensor(w, sw)
    y, at = _fused_forward(xq, wqt, _per_row(sx, x.shape[0]), _per_row(sw, w.shape[1]), bias, activation, out_dtype)
    return y, ((xqt, wq, w, sx, sw, x_amax, w_amax), bias, at, history)


def _delayed_bwd(activation, out_dtype, x_dtype, grad_format, residuals, dy):
    (xqt, wq, w, sx, sw, x_amax, w_amax), bias, at, history = residuals
    dz_dtype = GRAD_FORMATS[grad_format]
    sdz = scales_of(jnp.max(history.dz), dz_dtype)
    dzq, dzqt, dz_amax, *dbias = quantize_tensor(dy, sdz, at, activation, want_sum=bias is not None, dtype=dz_dtype)
    m, n = dy.shape
    k = w.shape[0]
    dx = _scaled(dzq, wq, _per_row(sdz, m), _per_row(sw, k), x_dtype, like=xqt, transposed=True)
    dw = _scaled(xqt, dzqt, _per_row(sx, k), _per_row(sdz, n), w.dtype, like=w)
    new = AmaxHistory(_pushed(history.x, x_amax), _pushed(history.w, w_amax), _pushed(history.dz, dz_amax))
    return dx, dw, None if bias is None else dbias[0].astype(bias.dtype), new


_delayed_dense.defvjp(_delayed_fwd, _delayed_bwd)


def _check_history(history):
    if not isinstance(history, AmaxHistory):
        raise TypeError("jaxgemm.fp8.dense: scaling='delayed' needs history=an AmaxHistory "
                        f"(jaxgemm.fp8.amax_history()), got {type(history).__name__}")  # fmt: skip
    shapes = [jnp.shape(h) for h in history]
    if any(len(s) != 1 or s != shapes[0] or s[0] < 1 for s in shapes) or any(
            jnp.result_type(h) != jnp.float32 for h in history):  # fmt: skip
        raise ValueError(f"jaxgemm.fp8.dense: history's x, w and dz must be float32 vectors of one length >= 1, got "
                         f"shapes {shapes} and dtypes {[str(jnp.result_type(h)) for h in history]}")  # fmt: skip


def dense(x, w, bias=None, activation=None, *, out_dtype=None, scaling="rowwise", grad_format="e4m3", history=None,
          out_sharding=None):  # fmt: skip
    """`activation(x @ w + bias)` with its forward and backward products in float8 e4m3
    (this module's docstring says how each operand is scaled).

    Args:
      x: (..., K) inputs, a 16- or 32-bit float; leading dims are batch dims.
      w: (K, N) weights, a 16- or 32-bit float (the high-precision master copy).
      bias: optional (N,) bias.
      activation: None, a name accepted by `jaxgemm.matmul`, or the jax.nn function of one.
      out_dtype: the result's dtype (default: x's).
      scaling: "rowwise" (one scale per row of each operand), "blockwise" (1 x 128
        blocks of x and dz, 128 x 128 tiles of w) or "delayed" (one scale per tensor,
        from the largest |value| of its last steps in `history`: each tensor quantized
        by a single pass, TransformerEngine's DelayedScaling).
      history: scaling="delayed"'s AmaxHistory (`amax_history()`), one per layer and
        call. Its gradient is the updated history: write it back after each step (the
        first step, from zeros, runs at scale 1). Not batched under vmap.
      grad_format: the backward's dz in "e4m3" (as the forward) or "e5m2" (TransformerEngine's
        HYBRID recipe: two more exponent bits, one fewer mantissa bit), on the same
        kernels (they multiply e5m2 by e4m3).
      out_sharding: the result's sharding, a NamedSharding or a PartitionSpec of the
        current mesh (as `jaxgemm.dense`'s): the result is resharded (Explicit axes) or
        constrained (Auto) to it.

    Returns:
      (..., N). Differentiable in reverse mode (`grad`, `vjp`): dx, dw and dbias in the
      dtypes of x, w and bias. On a Hopper GPU rowwise products need their contraction
      (K, N or the batch) to be a multiple of 16, blockwise ones of 128 (else, and
      elsewhere, `scaled_matmul` dequantizes and multiplies in float32)."""
    x, w = jnp.asarray(x), jnp.asarray(w)
    bias = None if bias is None else jnp.asarray(bias)
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"jaxgemm.fp8.dense: needs x (..., K) and w (K, N), got x{x.shape} and w{w.shape}")
    if bias is not None and bias.shape != (w.shape[1],):
        raise ValueError(f"jaxgemm.fp8.dense: bias must have shape ({w.shape[1]},), got {bias.shape}")
    for name, value in (("x", x), ("w", w), ("bias", bias)):
        if value is not None and (not jnp.issubdtype(value.dtype, jnp.floating) or jnp.dtype(value.dtype).itemsize < 2):
            raise TypeError(f"jaxgemm.fp8.dense: {name} must be a 16- or 32-bit float (the high-precision copy), "
                            f"got {jnp.dtype(value.dtype)}")  # fmt: skip
    if scaling not in SCALINGS:
        raise ValueError(f"jaxgemm.fp8.dense: scaling must be one of {SCALINGS}, got {scaling!r}")
    if grad_format not in GRAD_FORMATS:
        raise ValueError(f"jaxgemm.fp8.dense: grad_format must be one of {tuple(GRAD_FORMATS)}, got {grad_format!r}")
    activation = activations.canonical(activation)
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    # Inside shard_map, the weights vary over the batch's axes too, so that their cotangents
    # (per-shard sums) are psummed by the cast's transpose, as for JAX's own dots.
    rows, w, *bias = match_varying((x.reshape(-1, x.shape[-1]), w) + (() if bias is None else (bias,)))
    out_sharding = canonical_out_sharding(out_sharding, "jaxgemm.fp8.dense")
    bias = bias[0] if bias else None
    if scaling == "delayed":
        _check_history(history)
        y = _delayed_dense(rows, w, bias, AmaxHistory(*(jnp.asarray(h) for h in history)), activation, out_dtype,
                           jnp.dtype(rows.dtype), grad_format)  # fmt: skip
    elif history is not None:
        raise ValueError(f"jaxgemm.fp8.dense: history is scaling='delayed''s; scaling={scaling!r} takes none")
    else:
        y = _dense(rows, w, bias, activation, out_dtype, scaling, jnp.dtype(rows.dtype), grad_format)
    return constrain_output(y.reshape(x.shape[:-1] + (w.shape[1],)), out_sharding)

"""Tensor-parallel GEMMs whose collective hides behind the products (inside `shard_map`).

Megatron-style sequence parallelism puts an all-gather of the activations before a
column-parallel layer and a reduce-scatter after a row-parallel one. Written as
`all_gather` + `matmul` (or `matmul` + `psum_scatter`) the GPU waits for the whole
collective. Here each is a ring of n steps over the mesh axis (n devices):

    all_gather_matmul      step i multiplies the row block that arrived at step i - 1
                           while passing it on to the next device (`ppermute`): the
                           transfers run beside the products, and only the first product
                           has nothing to wait for;
    matmul_reduce_scatter  step i multiplies the rows of the block whose partial sum
                           arrives from the previous device, adds it and passes the sum
                           on; at the last step each device holds its own block's sum,
                           and the epilogue (bias, activation, residual) is fused into
                           that product, so it acts once on the full sum.

The products are `jaxgemm.matmul` calls traced under `gemm.sms_left_free`: with
JAXGEMM_RING_SM_MARGIN set their persistent grids leave that many multiprocessors to
NCCL's transfer kernels (default 0: on 2 H200s a margin cost the products more than the
overlap won; NOTES.md, "Open: the sequence-parallel rings lose to XLA's collectives").
Autodiff goes through the rings: the gradient of a ring is the reverse ring (`ppermute`'s
transpose), so the backward pass overlaps its collectives the same way.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxgemm.gemm import ring_sm_margin, sms_left_free
from jaxgemm.matmul import matmul


def all_gather_matmul(x, w, axis_name, *, axis=0, bias=None, activation=None, precision=None, out_dtype=None):
    """`matmul(lax.all_gather(x, axis_name, axis=axis, tiled=True), w, bias=bias,
    activation=activation)` inside `shard_map`, with the gather hidden behind the products.

    Args:
      x: (..., K) this device's block of rows along `axis` (not the last axis).
      w: (K, N) this device's weights (a column-parallel layer's shard).
      axis_name: the mesh axis (or tuple of axes) to gather over; bound by `shard_map`.
      axis: the axis of x that is gathered (the sequence or batch axis).
      bias, activation, precision, out_dtype: as for `jaxgemm.matmul`, fused into every
        block's product.

    Returns:
      x's shape with `axis` n times longer and the last axis N.
    """
    x, w, axis = _checked(x, w, axis, "all_gather_matmul")
    n, me = lax.axis_size(axis_name), lax.axis_index(axis_name)
    if n == 1:
        return matmul(x, w, bias=bias, activation=activation, precision=precision, out_dtype=out_dtype)
    rows = x.shape[axis]
    out = None
    with sms_left_free(ring_sm_margin()):
        for step in range(n):
            # Sent before the product, so that the transfer can run beside it.
            ahead = _to_next(x, axis_name, n) if step + 1 < n else None
            y = matmul(x, w, bias=bias, activation=activation, precision=precision, out_dtype=out_dtype)
            if out is None:
                out = jnp.zeros(y.shape[:axis] + (n * rows,) + y.shape[axis + 1 :], y.dtype)
            source = (me - step) % n  # the device whose block x is now
            out = lax.dynamic_update_slice_in_dim(out, y, source * rows, axis)
            x = ahead
    return out


def matmul_reduce_scatter(
    x, w, axis_name, *, axis=0, bias=None, activation=None, residual=None, precision=None, out_dtype=None
):
    """`lax.psum_scatter(x @ w, axis_name, scatter_dimension=axis, tiled=True)`, then
    `activation(. + bias) + residual` on this device's block, inside `shard_map`, with the
    reduction hidden behind the products.

    Args:
      x: (..., K) every row, with this device's share of K (a row-parallel layer's input).
      w: (K, N) this device's rows of the weights.
      axis_name: the mesh axis (or tuple of axes) to reduce and scatter over.
      axis: the axis of the output that is scattered (not the last); x.shape[axis] must
        be divisible by the axis size.
      bias, activation, residual: the epilogue, applied once to the summed block
        (`residual` has the block's shape).
      precision, out_dtype: as for `jaxgemm.matmul`. The partial sums travel and add in
        `out_dtype` (as `psum_scatter` sums in its operand's dtype).

    Returns:
      x's shape with `axis` n times shorter and the last axis N.
    """
    x, w, axis = _checked(x, w, axis, "matmul_reduce_scatter")
    n, me = lax.axis_size(axis_name), lax.axis_index(axis_name)
    if x.shape[axis] % n:
        raise ValueError(f"jaxgemm.matmul_reduce_scatter: x{x.shape} axis {axis} ({x.shape[axis]} rows) is not "
                         f"divisible by the {n} devices of {axis_name!r}")  # fmt: skip
    final = dict(bias=bias, activation=activation, residual=residual, precision=precision, out_dtype=out_dtype)
    if n == 1:
        return matmul(x, w, **final)
    rows = x.shape[axis] // n
    total = None
    with sms_left_free(ring_sm_margin()):
        for step in range(n):
            block = (me - step - 1) % n  # the block whose partial sum arrives now; own at the end
            x_block = lax.dynamic_slice_in_dim(x, block * rows, rows, axis)
            if step + 1 < n:
                # The product does not wait for the arriving sum: the add after it does.
                y = matmul(x_block, w, precision=precision, out_dtype=out_dtype)
                total = _to_next(y if total is None else total + y, axis_name, n)
            else:
                total = matmul(x_block, w, c=total, beta=1.0, **final)
    return total


def _to_next(v, axis_name, n):
    """v sent one device along the ring (device j's to device j + 1)."""
    return lax.ppermute(v, axis_name, [(j, (j + 1) % n) for j in range(n)])


def _checked(x, w, axis, name):
    """x and w as arrays and `axis` as a non-negative index, or a ValueError naming them."""
    x, w = jnp.asarray(x), jnp.asarray(w)
    if x.ndim < 2 or w.ndim != 2:
        raise ValueError(f"jaxgemm.{name}: needs x of rank >= 2 and w of rank 2, got x{x.shape} and w{w.shape}")
    if not -x.ndim <= axis < x.ndim or axis % x.ndim == x.ndim - 1:
        raise ValueError(f"jaxgemm.{name}: axis={axis} must name one of x{x.shape}'s axes but the last")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"jaxgemm.{name}: x{x.shape}'s last axis and w{w.shape}'s first differ")
    return x, w, axis % x.ndim

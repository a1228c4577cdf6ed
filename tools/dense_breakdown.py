"""Where a dense layer's forward + backward spends its time, ours vs XLA, kernel by kernel.

For x (M, K) @ w (K, N) + bias, activation (bf16 by default): each piece of jaxgemm.dense's
forward and backward timed alone (CUPTI), next to XLA's version of the same piece.
    python3 -P tools/dense_breakdown.py [--size 4096] [--activation gelu] [--dtype bfloat16] [--kernels]
--kernels: also each kernel of the whole forward + backward, ours and XLA's, in launch order."""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic.gpu import profiler

import jaxgemm
from jaxgemm import activations
from jaxgemm.bench import time_ms
from jaxgemm.epilogue import bias_act_grad

parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, default=4096)
parser.add_argument("--activation", default="gelu")
parser.add_argument("--dtype", default="bfloat16")
parser.add_argument("--kernels", action="store_true")
args = parser.parse_args()
s, act, dtype = args.size, args.activation, jnp.dtype(args.dtype)
keys = jax.random.split(jax.random.key(0), 5)
x = jax.random.normal(keys[0], (s, s), dtype)
w = jax.random.normal(keys[1], (s, s), dtype) / float(np.sqrt(s))
b = jax.random.normal(keys[2], (s,), dtype)
dy = jax.random.normal(keys[3], (s, s), dtype)
z = jax.random.normal(keys[4], (s, s), dtype)
f = lambda v: activations.apply(act, v)


def vjp_all(layer):
    return jax.jit(lambda x, w, b, dy: jax.vjp(layer, x, w, b)[1](dy))


pieces = {
    # name: (ours, xla, args)
    "forward (bias+act; ours keeps z)": (
        jax.jit(lambda x, w, b: jaxgemm.matmul(x, w, bias=b, activation=act, return_pre_activation=True)),
        jax.jit(lambda x, w, b: f(x @ w + b)),
        (x, w, b),
    ),
    "plain GEMM NN": (jax.jit(jaxgemm.matmul), jax.jit(jnp.matmul), (x, w)),
    "dz, dbias": (
        jax.jit(lambda dy, z: bias_act_grad(dy, z, None, act)),
        jax.jit(lambda dy, z: (lambda d: (d, d.astype(jnp.float32).sum(0)))(dy * jax.grad(lambda v: f(v).sum())(z))),
        (dy, z),
    ),
    "dx = dz @ w^T (NT)": (
        jax.jit(lambda d, w: jaxgemm.matmul(d, w, transpose_b=True)),
        jax.jit(lambda d, w: d @ w.T),
        (dy, w),
    ),
    "dw = x^T @ dz (TN)": (
        jax.jit(lambda x, d: jaxgemm.matmul(x, d, transpose_a=True)),
        jax.jit(lambda x, d: x.T @ d),
        (x, dy),
    ),
    "backward alone": (
        vjp_all(lambda x, w, b: jaxgemm.dense(x, w, b, act)),
        vjp_all(lambda x, w, b: f(x @ w + b)),
        (x, w, b, dy),
    ),
    "forward + backward": (
        jax.jit(lambda x, w, b, dy: (lambda y, vjp: (y, vjp(dy)))(*jax.vjp(lambda *a: jaxgemm.dense(*a, act), x, w, b))),
        jax.jit(lambda x, w, b, dy: (lambda y, vjp: (y, vjp(dy)))(*jax.vjp(lambda x, w, b: f(x @ w + b), x, w, b))),
        (x, w, b, dy),
    ),
}
print(f"dense {dtype} {s}^3 {act}: ms per call (CUPTI kernel time, median of 50)")
print(f"{'piece':<34} {'ours':>8} {'XLA':>8} {'XLA/ours':>9}")
for name, (ours, xla, a) in pieces.items():
    o, _ = time_ms(ours, a, 50)
    r, _ = time_ms(xla, a, 50)
    print(f"{name:<34} {o:>8.4f} {r:>8.4f} {r / o:>9.3f}")

if args.kernels:
    for side, fn in zip(("ours", "XLA"), pieces["forward + backward"][:2]):
        _, per_iter = profiler.measure(fn, aggregate=False, iterations=20)(x, w, b, dy)
        names = [name for name, _ in per_iter[0]]
        print(f"{side} forward + backward, kernels (median us):")
        for i, name in enumerate(names):
            print(f"  {np.median([it[i][1] for it in per_iter]) * 1e3:9.1f}  {name[:110]}")

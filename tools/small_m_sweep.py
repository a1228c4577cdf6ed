"""Times GEMMs on every sm90 tile and split-K against XLA, to see which configuration
the heuristic should pick: bf16 with few rows (up to 256; N = K = 8192, or 4096, whose B
stays in L2; N = 14336), tf32 (float32, precision "tensorfloat32") at 4096^3 and 8192^3,
and tf32 with few rows. CUPTI kernel time (all kernels of the call: the split-K
reduction, tf32's operand transposes). Usage:
python tools/small_m_sweep.py [bf16|tf32|tf32-rows ...]"""

import sys

import dataclasses

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_ms
from jaxgemm.gemm import GemmConfig, gemm_product


def sweep(name, a, b, xla, base: GemmConfig, configs):
    xla_ms = time_ms(jax.jit(xla), (a, b), 50)[0]
    print(f"{name}: XLA {xla_ms * 1e3:.1f} us")
    for label, config in [("heuristic", base)] + configs:
        fn = jax.jit(lambda a, b, config=config: gemm_product(a, b, config))
        ms = time_ms(fn, (a, b), 50)[0]
        print(f"  {label:<26} {ms * 1e3:8.1f} us  XLA/ours {xla_ms / ms:.3f}")


def tf32():
    for s in (4096, 8192):
        for tb in (False, True):
            ka, kb = jax.random.split(jax.random.key(s))
            a = jax.random.normal(ka, (s, s), jnp.float32)
            b = jax.random.normal(kb, (s, s), jnp.float32)
            base = GemmConfig(transpose_b=tb, tf32=True)
            configs = [(f"sm90 {t}", dataclasses.replace(base, kernel="sm90", tile=t))
                       for t in ((128, 64), (128, 128), (128, 256), (256, 256))]
            xla = (lambda a, b: a @ b.T) if tb else (lambda a, b: a @ b)
            sweep(f"tf32 {s}^3 {'NT' if tb else 'NN'}", a, b, xla, base, configs)


def tf32_rows():
    """tf32 with few rows (the zoo's 128 x 4096 x 4096 runs at 0.48x XLA): every tile and
    split; B (K, N) float32 is 64 MiB at 4096^2, beyond the 50 MiB L2, 256 MiB at 8192^2."""
    for m, n, k in ((128, 4096, 4096), (256, 4096, 4096), (128, 8192, 8192)):
        ka, kb = jax.random.split(jax.random.key(m + n))
        a = jax.random.normal(ka, (m, k), jnp.float32)
        b = jax.random.normal(kb, (k, n), jnp.float32)
        base = GemmConfig(tf32=True)
        configs = [(f"sm90 {t} split {s}", dataclasses.replace(base, kernel="sm90", tile=t, split_k=s))
                   for t in ((64, 128), (128, 64), (128, 128), (128, 256)) for s in (1, 2, 4, 8)]
        sweep(f"tf32 M={m} N={n} K={k}", a, b, lambda a, b: a @ b, base, configs)


def bf16():
    # (M, N, K): from DRAM (N = K = 8192), from L2 (N = K = 4096), a wide N, and rows past
    # one m64 block, where the wave model picks between 64 x 128 and 128-row tiles.
    shapes = ((16, 8192, 8192), (128, 8192, 8192), (16, 4096, 4096), (64, 4096, 4096), (16, 14336, 4096),
              (96, 8192, 8192), (128, 4096, 4096), (256, 8192, 8192))
    tiles = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256))
    for m, n, k in shapes:
        ka, kb = jax.random.split(jax.random.key(m))
        a = jax.random.normal(ka, (m, k), jnp.bfloat16)
        b = jax.random.normal(kb, (k, n), jnp.bfloat16)
        base = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16))
        configs = [(f"sm90 {t} split {s}", dataclasses.replace(base, kernel="sm90", tile=t, split_k=s))
                   for t in tiles for s in (1, 2, 4)]
        sweep(f"bf16 M={m} N={n} K={k}", a, b, jnp.matmul, base, configs)


if __name__ == "__main__":
    for part in sys.argv[1:] or ["bf16", "tf32"]:
        {"bf16": bf16, "tf32": tf32, "tf32-rows": tf32_rows}[part]()

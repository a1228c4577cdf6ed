"""Separates the sm90 kernel's fixed cost from its mainloop rate: time = fixed + K * slope.

M x N is chosen so the grid is one wave (one 128 x 128 tile per SM, or 2048^2 in 128 x 256
tiles), then K grows.
The slope gives the steady-state mainloop rate (TFLOP/s per k), the intercept the per-tile
overhead (launch, prologue, pipeline fill, epilogue). XLA runs the same shapes.
    python3 -P tools/sm90_k_scan.py   (on the GPU machine, jaxgemm installed)"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm.bench import time_ms
from jaxgemm.gemm import GemmConfig, gemm_product

KS = (512, 1024, 2048, 4096, 8192)
# 12 x 11 128 x 128 tiles; 2048^2: 128 tiles of 128 x 256 (the bench's 2048^3 is one wave).
GRIDS = {"1 tile/SM": (1536, 1408), "2048^2": (2048, 2048)}
# GemmConfig overrides (a forced schedule runs unsplit); None: XLA.
KERNELS = {"heuristic": {}, "pingpong 128x128": {"kernel": "sm90", "tile": (128, 128), "split_k": 1},
           "coop 128x256": {"kernel": "sm90", "tile": (128, 256), "split_k": 1},
           "cluster 2x128x256": {"kernel": "sm90", "tile": (256, 256), "split_k": 1}, "XLA": None}


def fit(ks, ms):
    slope, intercept = np.polyfit(np.asarray(ks, float), np.asarray(ms, float), 1)
    return slope, intercept


for grid, (m, n) in GRIDS.items():
    print(f"== {grid}: M={m} N={n}")
    print(f"{'kernel':>18} " + " ".join(f"{'K=' + str(k):>9}" for k in KS) + "   fixed us  loop TF/s")
    for name, kernel in KERNELS.items():
        times = []
        for k in KS:
            ka, kb = jax.random.split(jax.random.key(k))
            a, b = jax.random.normal(ka, (m, k), jnp.bfloat16), jax.random.normal(kb, (k, n), jnp.bfloat16)
            if kernel is None:
                fn = jax.jit(jnp.matmul)
            else:
                config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16), **kernel)
                fn = jax.jit(lambda a, b, config=config: gemm_product(a, b, config))
            ms, _ = time_ms(fn, (a, b), 30)
            times.append(ms)
        slope, intercept = fit(KS, times)
        loop_tflops = 2.0 * m * n / (slope * 1e-3) / 1e12
        print(f"{name:>18} " + " ".join(f"{t * 1e3:8.1f}u" for t in times) + f"   {intercept * 1e3:8.1f}  {loop_tflops:8.1f}")
